"""`txn-recon quality [--full]`: run the expectation suites of `schemas.quality` with Great Expectations,
append one `dq_results` row per expectation result and one `quality_runs` row per run that validated
something, and build the Data Docs site under the warehouse.

Only what changed is validated: a table whose Delta version was validated before is skipped; the others
validate the rows their Change Data Feed added or rewrote since then (plus the rows sharing a key with them).
The cross-table views run when any table changed, the reference views on the ops and commits that arrived.
`--full` validates everything.

Exit code 3 when an expectation of a suite listed in `quality.blocking` fails; other failures are
reported only.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import functools
import itertools
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.utils import AnalysisException

from jobs.catalog import (
    add_new_fields,
    appended,
    change_ranges,
    create_table,
    latest_row,
    stored_bytes,
    table_commit,
    table_exists,
    table_identity,
    table_version,
)
from jobs.config import Config
from jobs.errors import TxnReconError, first_line
from jobs.ingest import new_run_id
from jobs.lock import warehouse_lock
from jobs.reconcile import last_run, saw_all
from jobs.session import build_session
from schemas.bronze import BRONZE
from schemas.quality import DQ_RESULTS, QUALITY_RUNS, Expectation, Suite, suites
from schemas.reconciled import ANOMALIES, OFFSET_COMMITS, RECONCILE_RUNS, TXN_LIFECYCLE
from schemas.spark import to_struct
from transforms.frames import cached_frames, kept_with_size, ranges, to_pandas_together, within
from transforms.lifecycle import listed_copies
from transforms.quality import (
    changed_rows,
    commit_references,
    gained,
    group_findings,
    lifecycle_gains,
    lifecycle_totals,
    op_references,
    prepared_halves,
)

# GE sends usage statistics unless told not to; this machine's network is closed to them.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import great_expectations as gx
from great_expectations.core.run_identifier import RunIdentifier
from great_expectations.data_context import FileDataContext
from great_expectations.data_context.types.base import ProgressBarsConfig
from great_expectations.data_context.types.resource_identifiers import (
    ExpectationSuiteIdentifier,
    ValidationResultIdentifier,
)
from great_expectations.exceptions.resource_freshness import ResourceFreshnessAggregateError
from great_expectations.expectations.expectation import (
    ColumnMapExpectation,
    ColumnPairMapExpectation,
    MulticolumnMapExpectation,
)
from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

log = logging.getLogger(__name__)

EXIT_BLOCKING = 3
SAMPLE = 20  # unexpected values kept per result
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
ROW_EXPECTATIONS = (ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)
COPY_KEY = BRONZE["half"].key  # (broker_name, topic, queue_id, queue_offset)
# The reference views: the bronze stream whose rows they check against the halves, and the ranges of
# half_events' columns that those rows can name.
REFERENCES = {
    "op_references": ("op", op_references, lambda df: ranges(listed_copies(df), COPY_KEY)),
    "commit_references": ("real", commit_references,
                          lambda df: ranges(prepared_halves(df), ["broker_name", "commit_log_offset"])),
}  # fmt: skip
# The tables whose batches a cross view reads again: those of the reference views' streams, and anomalies.
REREAD = {BRONZE[stream].name for stream, _, _ in REFERENCES.values()} | {ANOMALIES.name}
# A batch up to this many rows is validated in the driver by GE's pandas engine: the same expectations,
# without the Spark jobs GE runs per metric, which cost a second or more per suite on a batch of any size
# (a serve cycle's batches are a few thousand rows). A larger one stays in Spark.
DRIVER_ROWS = 200_000
# A table up to this size (by its checksum) is sorted whole against its changed keys rather than sent them: as much
# txn_lifecycle holds some 350,000 transactions (460 KB for 10,000 in the bench's warehouse).
SORTED_BYTES = 16 * 1024 * 1024
AHEAD = 3  # batches fetched alone ahead of the one validated: five times DRIVER_ROWS rows held at most
KEPT_RESULTS = 30  # GE validation results kept per suite for Data Docs
ENGINES = {"spark": "txn_recon", "pandas": "txn_recon_driver"}  # GE data source per engine
# lifecycle_totals reads these tables (by their names in `_cross_batches`); the bronze ones by these times.
TOTALS_TIMES = {"half": "store_timestamp", "real": "store_timestamp", "offset": "commit_timestamp"}
TOTALS_TABLES = (*TOTALS_TIMES, "lifecycle", "offset_commits")
# What lifecycle_totals held up to: {"as_of": ..., "tables": {name: [Delta table id, version]}, "saw_all": whether
# those bronze versions held no event after as_of (`jobs.reconcile.saw_all`)}.
Totals = dict[str, Any]


@dataclass(frozen=True)
class Batch:
    suite: Suite
    df: DataFrame
    version: int | None  # the Delta version validated; None for a cross view
    scope: str  # full or incremental
    holds: Totals | None = None  # lifecycle_totals: what it holds up to if it passes


@dataclass
class Outcome:
    run_id: str
    docs: Path  # the Data Docs index page
    results: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.results if not r["success"]]

    @property
    def blocking_failures(self) -> list[dict[str, Any]]:
        return [r for r in self.failures if r["blocking"]]


@dataclass(frozen=True)
class Shown:
    """What the dashboard shows of quality: the latest result of every expectation, failures first, then by
    suite and expectation; and the latest runs, newest first."""

    latest: list[dict[str, Any]]
    runs: list[dict[str, Any]]


SHOWN_RESULTS = ("suite", "expectation", "success", "blocking", "unexpected_count", "element_count",
                 "observed_value", "unexpected_sample", "scope", "table_version", "run_id")  # fmt: skip
SHOWN_RUNS = ("run_id", "validated_at", "expectations", "failed", "blocking_failed", "suites")
LATEST_RUNS = 50
# (dq_results, quality_runs) -> their commits (`table_commit`) when this process last read or wrote them, and
# what the dashboard shows of them then.
_SHOWN: dict[tuple[str, str], tuple[tuple[Any, ...], Shown]] = {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--full", action="store_true", help="validate every table whole, not only what changed")


def run(args: argparse.Namespace, config: Config) -> int:
    now = dt.datetime.now(dt.UTC)
    with warehouse_lock(config, "quality"):
        spark = build_session(config)
        outcome = check_quality(spark, config, new_run_id(now, "quality"), now.replace(tzinfo=None), args.full)
    print(summary(outcome))
    print(f"Data Docs: {outcome.docs}")
    return EXIT_BLOCKING if outcome.blocking_failures else 0


def quality_dir(config: Config) -> Path:
    """The Great Expectations project (suites, results, Data Docs) beside the tables it validates."""
    return Path(config.warehouse) / "_quality"


def docs_index(config: Config) -> Path:
    return quality_dir(config) / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"


def check_quality(
    spark: SparkSession, config: Config, run_id: str, validated_at: dt.datetime, full: bool = False
) -> Outcome:
    """Validate what changed since the last run (everything when `full`), record and return the results."""
    started = time.perf_counter()
    if not config.is_local_warehouse:
        raise TxnReconError("quality needs a local warehouse folder for its Great Expectations project")
    results_table, runs_table = create_table(spark, config, DQ_RESULTS), create_table(spark, config, QUALITY_RUNS)
    add_new_fields(spark, runs_table, QUALITY_RUNS)
    dq_tables = (results_table, runs_table)
    shown = _SHOWN.get(dq_tables)
    if shown is not None and shown[0] != _commits(spark, dq_tables):
        shown = None  # the tables changed since (a compaction, another process): read again when shown
    outcome = Outcome(run_id, docs_index(config))
    recorded, totals = recorded_validations(spark, runs_table) or (None, None)
    latest = validations_in(spark, results_table) if recorded is None else recorded
    validated = {} if full else {suite: v for suite, (_, v) in latest.items() if v is not None}
    all_suites = suites(config.broker.check_max)

    def table_batch(suite: Suite) -> Batch | str:
        name = config.table(suite.name)
        if not table_exists(spark, name):
            return "no table yet"
        version = table_version(spark, name)
        previous = validated.get(suite.name)
        if previous == version:
            return f"unchanged since version {version}"
        return _table_batch(spark, name, suite, previous, version, cache)

    # Two threads throughout, so that the Spark jobs of one batch (most of a small job is the driver's) run
    # while the other thread's wait or GE validates in the driver. The table batches are made first, then the
    # cross views; every batch but a table's whole snapshot is fetched in one job (`_together`), and the rest
    # in a stream, at most AHEAD at a time, each validated in its turn as it arrives.
    # The batches `_table_batch` caches are let go once validated.
    with cached_frames() as cache, ThreadPoolExecutor(2, "quality") as pool:
        tables = [s for s in all_suites if s.layer != "cross"]
        changed = []
        for suite, made in zip(tables, pool.map(table_batch, tables), strict=True):
            if isinstance(made, str):
                outcome.skipped.append((suite.name, made))
            else:
                changed.append(made)
        cross = [s for s in all_suites if s.layer == "cross"]
        batches = [*changed]
        if changed:
            batches += pool.map(lambda made: made(), _cross_batches(spark, config, cross, outcome,
                                                                    {b.suite.name: b for b in changed},
                                                                    None if full else totals))  # fmt: skip
        else:
            outcome.skipped += [(s.name, "no table changed") for s in cross]
        project = quality_dir(config)
        fetched = _together(batches)
        waiting = iter([b for b in batches if b.suite.name not in fetched])
        ahead = collections.deque(pool.submit(_fetched, b) for b in itertools.islice(waiting, AHEAD))
        for batch in batches:
            local = fetched.pop(batch.suite.name, _ALONE)
            if local is _ALONE:
                _, local = ahead.popleft().result()
                ahead.extend(pool.submit(_fetched, b) for b in itertools.islice(waiting, 1))
            outcome.results += _validate(project, batch, local, run_id, validated_at, config.quality.blocking)
    if outcome.results:
        _append(spark, results_table, outcome.results)
    for batch in batches:  # the totals checked: what they held up to, if they did, is where the next run starts
        if batch.holds is not None:
            held = all(r["success"] for r in outcome.results if r["suite"] == batch.suite.name)
            totals = batch.holds if held else None
    if outcome.results or (recorded is None and latest):  # the first run after an upgrade records what it found
        now = {b.suite.name: (run_id, b.version) for b in batches}
        run = _record_run(spark, runs_table, outcome, validated_at, {**latest, **now}, totals)
        _SHOWN.pop(dq_tables, None)
        if shown is not None:  # what the dashboard shows, known before this run: this run's results and row added
            _SHOWN[dq_tables] = (_commits(spark, dq_tables), _shown_after(shown[1], outcome.results, run))
    _build_docs(project, run_id)
    outcome.seconds = time.perf_counter() - started
    return outcome


Validations = dict[str, tuple[str, int | None]]  # suite -> (the run that validated it last, the version or None)


def recorded_validations(spark: SparkSession, runs_table: str) -> tuple[Validations, Totals | None] | None:
    """Per suite ever validated: the run that validated it last, and the Delta version it validated (None
    for a cross view). The latest run's, not the largest version: a table rebuilt by reconcile starts again
    from version 0. With it, what lifecycle_totals held up to (None when it did not hold). From the last row
    of `quality_runs` (one per run); None when it has none yet."""
    row = latest_row(spark, runs_table, "finished_at")
    if row is None:
        return None
    latest = {suite: (run, v) for suite, (run, v) in json.loads(row["latest"]).items()}
    return latest, json.loads(row["totals"]) if row["totals"] else None


def validations_in(spark: SparkSession, results_table: str) -> Validations:
    """The same from `dq_results`, which every run adds some hundred rows to: read only in a warehouse an
    older version wrote, whose first run then records it in `quality_runs`."""
    last = F.max(F.struct("validated_at", "table_version", "run_id"))
    found = spark.table(results_table).groupBy("suite").agg(last.alias("v")).collect()
    return {r["suite"]: (r["v"]["run_id"], r["v"]["table_version"]) for r in found}


def _table_batch(
    spark: SparkSession, table: str, suite: Suite, previous: int | None, version: int,
    cache: Callable[[DataFrame], DataFrame],
) -> Batch:  # fmt: skip
    snapshot = spark.sql(f"SELECT * FROM {table} VERSION AS OF {version}")
    if not suite.incremental or previous is None or previous > version:
        return Batch(suite, snapshot, version, "full")
    try:
        changes = _change_feed(spark, table, previous, version)
        changed = changes.where(F.col("_change_type").isin("insert", "update_postimage")).drop(*CDF_COLUMNS)
        # Only the rows that can share a key with a changed one are looked at: the table's recent files as a rule.
        # Their ranges come from the statistics of the files the changes added, in the log; read from the change
        # data only where those lack them, in a pass that keeps it.
        bounded_by = [*suite.key, *suite.bounded_by]
        known = change_ranges(spark, table, previous, version, bounded_by) if bounded_by else None
        if known is None:
            changed, bounds, n = kept_with_size(changed, bounded_by)
        else:
            bounds, n = known
        candidates = within(snapshot, bounds) if bounded_by else snapshot
        # A change set small enough for the driver has keys small enough to send to every task, where the candidates
        # are most of a large table (the key's ranges span most files). Bounded by time, they are the files of the
        # changes' time as a rule, few rows; and a small table (SORTED_BYTES by its checksum) is few rows all of
        # it: those are joined as Spark picks (serve sorts both sides in the job that reads them, where a broadcast
        # is a Spark job of its own).
        size = stored_bytes(spark, table, version)
        large = size is None or size > SORTED_BYTES
        rows = changed_rows(candidates, changed, suite.key, few=n <= DRIVER_ROWS and not suite.bounded_by and large)
        # A batch a cross view checks is read again (a reference view reads it twice more: its lookup ranges and
        # its join): cached, the candidates are looked among once (all of a table whose keys the ranges do not
        # narrow), by the first job that reads it (checkpointed, each cost a Spark job of its own).
        return Batch(suite, cache(rows) if suite.name in REREAD else rows, version, "incremental")
    except AnalysisException as e:  # change data no longer kept (VACUUM) or never recorded
        log.info("  %s: no change data since version %d (%s); validating it whole", table, previous, first_line(e))
        return Batch(suite, snapshot, version, "full")


def _change_feed(spark: SparkSession, table: str, since: int, version: int) -> DataFrame:
    """The table's Change Data Feed after version `since`, up to `version`."""
    return (
        spark.read.option("readChangeFeed", "true")
        .option("startingVersion", since + 1)
        .option("endingVersion", version)
        .table(table)
    )


def _cross_batches(
    spark: SparkSession, config: Config, cross: list[Suite], outcome: Outcome, validated: dict[str, Batch],
    totals: Totals | None,
) -> list[Callable[[], Batch]]:  # fmt: skip
    """The cross views over this run's tables, each as the work that makes its batch. A reference breaks only
    when an op or a commit arrives (a half arriving later can only mend one), so the reference views check
    the ops and commits this run validates (all of them on a first run) against every half, and are skipped
    when none arrived. A group finding is checked by itself alone: those this run validates in anomalies, none
    when it validates none. The totals are checked from where they last held (`totals`), whole when they did
    not."""
    names = {s: config.table(BRONZE[s].name) for s in BRONZE} | {
        "lifecycle": config.table(TXN_LIFECYCLE.name),
        "offset_commits": config.table(OFFSET_COMMITS.name),
        "anomalies": config.table(ANOMALIES.name),
    }
    if not all(table_exists(spark, t) for t in names.values()):
        outcome.skipped += [(s.name, "needs bronze, txn_lifecycle, offset_commits and anomalies") for s in cross]
        return []
    t = {k: spark.table(v) for k, v in names.items()}
    last = last_run(spark, config) if table_exists(spark, config.table(RECONCILE_RUNS.name)) else None
    shown = []
    for name, (stream, _, _) in REFERENCES.items():
        if BRONZE[stream].name in validated:
            shown.append(name)
        else:
            outcome.skipped.append((name, f"no new rows in {BRONZE[stream].name}"))
    if ANOMALIES.name in validated:
        shown.append("group_findings")
    else:
        outcome.skipped.append(("group_findings", f"no new rows in {ANOMALIES.name}"))
    holds = None
    if last is not None:
        tables = {k: table_identity(spark, names[k]) for k in TOTALS_TABLES}
        # Whether the bronze versions held are those the last reconcile read, and it read every event of them.
        read_all = saw_all(last) and all(tables[k][1] == last[f"{k}_version"] for k in TOTALS_TIMES)
        holds = {"as_of": int(last["as_of"]), "tables": tables, "saw_all": read_all}
        shown.append("lifecycle_totals")
    else:
        outcome.skipped.append(("lifecycle_totals", "no reconcile run yet"))

    def made(suite: Suite) -> Batch:
        if suite.name == "lifecycle_totals":
            assert holds is not None
            df, scope = _totals(spark, names, t, totals, holds)
            return Batch(suite, df, None, scope, holds)
        if suite.name == "group_findings":
            found = validated[ANOMALIES.name]
            return Batch(suite, group_findings(found.df), None, found.scope)
        stream, view, looked_up = REFERENCES[suite.name]
        arrived = validated[BRONZE[stream].name]
        # The halves the arrived rows can name: in the recent files of half_events as a rule.
        half = t["half"] if arrived.scope == "full" else within(t["half"], looked_up(arrived.df))
        return Batch(suite, view(arrived.df, half), None, arrived.scope)

    return [functools.partial(made, s) for s in cross if s.name in shown]


def _totals(
    spark: SparkSession, names: dict[str, str], t: dict[str, DataFrame], held: Totals | None, now: Totals
) -> tuple[DataFrame, str]:
    """The lifecycle_totals view: what both layers gained since the totals last held (`held`), when they did
    and every table is the one they held for, at its version then or a later one, and as_of has not gone
    back; else every table read whole."""
    as_of = now["as_of"]
    whole = lifecycle_totals(t["lifecycle"], t["offset_commits"], t["half"], t["real"], t["offset"], as_of), "full"
    if held is None or held["as_of"] > as_of:
        return whole
    then = {k: tuple(v) for k, v in held["tables"].items()}
    if any(k not in then or then[k][0] != table_id or then[k][1] > version
           for k, (table_id, version) in now["tables"].items()):  # fmt: skip
        return whole

    def changes(k: str) -> DataFrame:
        since, version = then[k][1], now["tables"][k][1]
        if since == version:  # nothing changed: no rows, the change feed's columns
            return t[k].where(F.lit(False)).select("*", F.lit("insert").alias("_change_type"),
                                                   F.lit(0).cast("long").alias("_commit_version"))  # fmt: skip
        return _change_feed(spark, names[k], since, version)

    since = held["as_of"]
    try:
        saw_all = held.get("saw_all", False)
        half, real, offsets = (
            gained(t[k], changes(k), time, since, as_of, saw_all) for k, time in TOTALS_TIMES.items()
        )
        view = lifecycle_gains(t["lifecycle"], changes("lifecycle"), changes("offset_commits"), half, real, offsets,
                               since, as_of)  # fmt: skip
    except AnalysisException as e:  # change data never recorded
        log.info("  lifecycle_totals: no change data since the totals held (%s); reading the tables whole",
                 first_line(e))  # fmt: skip
        return whole
    return view, "incremental"


@functools.cache
def _context(project: Path) -> FileDataContext:
    """The GE project, opened once per process (a service validates every cycle)."""
    context = gx.get_context(mode="file", project_root_dir=str(project))
    context.variables.progress_bars = ProgressBarsConfig(globally=False)  # our log says what runs
    context.variables.save()
    return context


def _definition(project: Path, suite: Suite, engine: str, again: bool = False) -> gx.ValidationDefinition:
    """The suite and its validation definition on `engine`'s data source, written into the GE project from
    our code once per process (per suite as the config makes it), or `again`: the definition of the same
    suite for the other engine, or for another config, saves the suite anew, which GE then tells apart."""
    key = (project, engine, repr(suite))
    if again or key not in _DEFINITIONS:
        _DEFINITIONS[key] = _define(_context(project), suite, engine)
    return _DEFINITIONS[key]


_DEFINITIONS: dict[tuple[Path, str, str], gx.ValidationDefinition] = {}


def _define(context: FileDataContext, suite: Suite, engine: str) -> gx.ValidationDefinition:
    expectations = [
        ExpectationConfiguration(type=e.type, kwargs=dict(e.kwargs), description=e.description or None)
        for e in suite.expectations
    ]
    gx_suite = context.suites.add_or_update(
        gx.ExpectationSuite(name=suite.name, expectations=[e.to_domain_obj() for e in expectations])
    )
    name = ENGINES[engine]
    source = context.data_sources.all().get(name)
    if source is None and engine == "spark":
        # persist=False: GE would otherwise cache every batch. No spark_config: GE would rebuild our session.
        source = context.data_sources.add_spark(name, persist=False)
    elif source is None:
        source = context.data_sources.add_pandas(name)
    if suite.name in source.get_asset_names():
        asset = source.get_asset(suite.name)
    else:
        asset = source.add_dataframe_asset(suite.name)
    if "whole" in [b.name for b in asset.batch_definitions]:
        batch_def = asset.get_batch_definition("whole")
    else:
        batch_def = asset.add_batch_definition_whole_dataframe("whole")
    return context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=f"{suite.name} on {engine}", data=batch_def, suite=gx_suite)
    )


def _fetched(batch: Batch) -> tuple[Batch, Any]:
    return batch, _local(batch)


_ALONE = object()  # a batch `_together` leaves to `_local`


def _together(batches: list[Batch]) -> dict[str, Any]:
    """Per suite, `_local` of each batch but a table's whole snapshot (counted, and fetched alone), fetched in one
    Spark job instead of one each: DRIVER_ROWS rows at most in all, shared among them. One that fills its share
    is left out, to be fetched alone."""
    asked = [b for b in batches if not (b.scope == "full" and b.version is not None)]
    if not asked:
        return {}
    share = DRIVER_ROWS // len(asked)
    frames = to_pandas_together([b.df for b in asked], share + 1)
    return {b.suite.name: frame for b, frame in zip(asked, frames, strict=True) if len(frame) <= share}


def _local(batch: Batch) -> Any:
    """The batch as a pandas frame when it has at most DRIVER_ROWS rows, else None. A table's snapshot is
    counted first (Delta answers from its statistics); a change set or a view is small as a rule and is
    fetched at once, one row over the limit telling that it is not."""
    if batch.scope == "full" and batch.version is not None and batch.df.count() > DRIVER_ROWS:
        return None
    local = batch.df.limit(DRIVER_ROWS + 1).toPandas()
    return local if len(local) <= DRIVER_ROWS else None


def _validate(
    project: Path, batch: Batch, local: Any, run_id: str, validated_at: dt.datetime, blocking: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Run one suite on one batch through its persisted validation definition (so Data Docs show it), in
    the driver on `local` (`_local` of the batch) when the batch is small (DRIVER_ROWS), else in Spark.

    The suite runs with BOOLEAN_ONLY results: GE then skips collecting a sample of unexpected values for
    every expectation, which is most of its time on Spark. Only a failed expectation runs again, alone,
    for its unexpected count and sample."""
    started = time.perf_counter()
    df = batch.df.cache() if local is None else None  # GE computes its metrics in several passes
    try:
        rows = len(local) if local is not None else df.count()  # type: ignore[union-attr]
        engine = "spark" if local is None else "pandas"
        definition = _definition(project, batch.suite, engine)
        params = {"dataframe": df if local is None else local}
        gx_run = RunIdentifier(run_name=run_id, run_time=validated_at.replace(tzinfo=dt.UTC))
        boolean_only = {"result_format": "BOOLEAN_ONLY"}
        try:
            results = definition.run(batch_parameters=params, result_format=boolean_only, run_id=gx_run).results
        except ResourceFreshnessAggregateError:  # its suite saved since by another definition of it: write again
            definition = _definition(project, batch.suite, engine, again=True)
            results = definition.run(batch_parameters=params, result_format=boolean_only, run_id=gx_run).results
        if any(not r.success for r in results):
            gx_batch = definition.batch_definition.get_batch(batch_parameters=params)
            detail = {"result_format": "BASIC", "partial_unexpected_count": SAMPLE}
            results = [r if r.success else gx_batch.validate(_expectation(r), result_format=detail) for r in results]
    finally:
        if df is not None:
            df.unpersist()
    out = [_row(r, batch, rows, run_id, validated_at, batch.suite.name in blocking) for r in results]
    failed = sum(not r["success"] for r in out)
    verdict = "all passed" if not failed else f"{failed} FAILED"
    where = "in the driver" if engine == "pandas" else "in Spark"
    log.info("  %-18s %s, %d rows %s: %d expectations, %s (%.1f s)", batch.suite.name, batch.scope, rows, where,
             len(out), verdict, time.perf_counter() - started)  # fmt: skip
    return out


def _build_docs(project: Path, run_id: str) -> None:
    """Data Docs for this run's results, and the index, over the latest KEPT_RESULTS results per suite: GE
    renders every stored result in each build, which in a service would grow without end (`dq_results`
    keeps every result)."""
    context = _context(project)
    store = context.validation_results_store
    stored = [k for k in store.list_keys() if isinstance(k, ValidationResultIdentifier)]
    keys = sorted(stored, key=lambda k: k.run_id.run_time, reverse=True)
    seen: dict[str, int] = {}
    docs = project / "gx" / "uncommitted" / "data_docs" / "local_site" / "validations"
    for key in keys:
        suite = key.expectation_suite_identifier.name
        seen[suite] = seen.get(suite, 0) + 1
        if seen[suite] > KEPT_RESULTS:
            store.remove_key(key)
            docs.joinpath(*key.to_tuple()).with_suffix(".html").unlink(missing_ok=True)
    fresh = [k for k in keys if k.run_id.run_name == run_id]
    suites_shown = {ExpectationSuiteIdentifier(name=k.expectation_suite_identifier.name) for k in fresh}
    shown: list[Any] = [*fresh, *suites_shown]  # GE's annotation wants one kind; it builds both
    context.build_data_docs(resource_identifiers=shown or None)


def _expectation(result: Any) -> Any:
    """The GE expectation a result came from."""
    return result.expectation_config.to_domain_obj()


def _row(r: Any, batch: Batch, rows: int, run_id: str, validated_at: dt.datetime, blocking: bool) -> dict[str, Any]:
    config = r.expectation_config
    kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
    result = r.result or {}
    error = (r.exception_info or {}).get("exception_message") if not r.success else None
    observed = result.get("observed_value")
    if observed is None and error:
        observed = f"error: {error}"
    sample = result.get("partial_unexpected_list")
    per_row = isinstance(_expectation(r), ROW_EXPECTATIONS)
    # A passing per-row expectation had no unexpected row; its BOOLEAN_ONLY result does not repeat that.
    unexpected = result.get("unexpected_count", 0 if per_row and r.success else None)
    return {
        "run_id": run_id,
        "validated_at": validated_at,
        "suite": batch.suite.name,
        "layer": batch.suite.layer,
        "table_version": batch.version,
        "scope": batch.scope,
        "expectation": Expectation(config.type, kwargs).label,
        "kwargs": json.dumps(kwargs, sort_keys=True, default=str),
        "blocking": blocking,
        "success": bool(r.success),
        "observed_value": None if observed is None else _json(observed),
        "element_count": int(result.get("element_count", rows)),
        "unexpected_count": None if unexpected is None else int(unexpected),
        "unexpected_sample": _json(sample[:SAMPLE]) if sample else None,
    }


def _json(value: Any) -> str:
    """A result value as JSON, the same from either engine: pandas hands numpy scalars and arrays, NaN for
    a null, and a float for a whole number in a column that also holds nulls (no table here has a
    fractional column)."""

    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if hasattr(v, "tolist"):  # a numpy array or scalar
            v = v.tolist()
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, float) and (math.isnan(v) or v.is_integer()):
            return None if math.isnan(v) else int(v)
        return v

    return json.dumps(plain(value), default=str)


def _append(spark: SparkSession, table: str, rows: list[dict[str, Any]]) -> None:
    df = spark.createDataFrame([tuple(r[n] for n in DQ_RESULTS.names) for r in rows], to_struct(DQ_RESULTS))
    df.write.insertInto(table)


def _record_run(
    spark: SparkSession, table: str, outcome: Outcome, validated_at: dt.datetime,
    latest: Validations, totals: Totals | None,
) -> dict[str, Any]:  # fmt: skip
    failed = outcome.failures
    row = (outcome.run_id, validated_at, dt.datetime.now(dt.UTC).replace(tzinfo=None), len(outcome.results),
           len(failed), len(outcome.blocking_failures), ", ".join(sorted({r["suite"] for r in outcome.results})),
           json.dumps(latest, sort_keys=True),
           None if totals is None else json.dumps(totals, sort_keys=True))  # fmt: skip
    spark.createDataFrame([row], to_struct(QUALITY_RUNS)).write.insertInto(table)
    recorded = dict(zip(QUALITY_RUNS.names, row, strict=True))
    appended(spark, table, [Row(**recorded)], "finished_at")
    return recorded


def latest_results(spark: SparkSession, config: Config) -> Shown:
    """What the dashboard shows of quality: read from `dq_results` and `quality_runs` unless they are as this
    process last read or wrote them (a service's quality run, then its dashboard, every cycle)."""
    tables = (config.table(DQ_RESULTS.name), config.table(QUALITY_RUNS.name))
    if not all(table_exists(spark, t) for t in tables):
        return Shown([], [])
    commits = _commits(spark, tables)
    known = _SHOWN.get(tables)
    if known is not None and known[0] == commits:
        return known[1]
    shown = read_latest_results(spark, *tables)
    _SHOWN[tables] = (commits, shown)
    return shown


def read_latest_results(spark: SparkSession, results_table: str, runs_table: str) -> Shown:
    """`latest_results` from the tables. The latest run of `runs_table` names the run that validated each suite
    last, and only those runs' rows of `results_table` are read."""
    runs = spark.table(runs_table).orderBy(F.desc("finished_at")).limit(LATEST_RUNS).select(*SHOWN_RUNS, "latest")
    listed = runs.collect()
    if not listed:
        return Shown([], [])
    validating = [(suite, run) for suite, (run, _) in json.loads(listed[0]["latest"]).items()]
    theirs = functools.reduce(
        lambda a, b: a | b, [(F.col("suite") == suite) & (F.col("run_id") == run) for suite, run in validating]
    )
    # The run ids as a list too: Delta skips the files of other runs by their run_id statistics.
    found = spark.table(results_table).where(F.col("run_id").isin(*sorted({run for _, run in validating})) & theirs)
    latest_first = Window.partitionBy("suite", "expectation").orderBy(F.desc("validated_at"), F.desc("run_id"))
    latest = found.withColumn("_rank", F.row_number().over(latest_first)).where("_rank = 1")
    rows = latest.orderBy("success", "suite", "expectation").select(*SHOWN_RESULTS).collect()
    return Shown([r.asDict() for r in rows], [{c: r[c] for c in SHOWN_RUNS} for r in listed])


def _shown_after(shown: Shown, results: list[dict[str, Any]], run: dict[str, Any]) -> Shown:
    """`shown` after a run that appended `results` and recorded `run`: the suites it validated show its results."""
    validated = {r["suite"] for r in results}
    new: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        new.setdefault((r["suite"], r["expectation"]), {c: r[c] for c in SHOWN_RESULTS})
    latest = [r for r in shown.latest if r["suite"] not in validated] + list(new.values())
    latest.sort(key=lambda r: (r["success"], r["suite"], r["expectation"]))
    return Shown(latest, [{c: run[c] for c in SHOWN_RUNS}, *shown.runs][:LATEST_RUNS])


def _commits(spark: SparkSession, tables: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(table_commit(spark, t) for t in tables)


def summary(outcome: Outcome) -> str:
    n, failed = len(outcome.results), outcome.failures
    lines = [
        f"quality {outcome.run_id}: {n} expectations, {n - len(failed)} passed, {len(failed)} failed "
        f"({len(outcome.blocking_failures)} blocking) in {outcome.seconds:.1f} s"
    ]
    for r in failed:
        level = "FAILED" if r["blocking"] else "warning"
        count = r["unexpected_count"]
        detail = f"{count} of {r['element_count']} rows unexpected" if count is not None else r["observed_value"]
        sample = f": {r['unexpected_sample']}" if r["unexpected_sample"] else ""
        lines.append(f"  {level:<7} {r['suite']}: {r['expectation']}: {detail}{sample}"[:400])
    lines += [f"  skipped {name}: {why}" for name, why in outcome.skipped]
    return "\n".join(lines)


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["quality", *sys.argv[1:]]))
