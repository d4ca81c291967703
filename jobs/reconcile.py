"""`txn-recon reconcile [--as-of EPOCH_MS] [--full]`: bronze into txn_lifecycle and offset_commits (silver)
and the anomalies (gold), as of one data time (DESIGN §2).

`as_of` is the argument, else the largest store/commit timestamp in bronze: wall-clock time never
enters a result, so a rerun on the same tables gives the same output.

A run is incremental when it can be: it reads bronze's Change Data Feed since the versions the last
run read, recomputes only the transactions and queues `transforms.scope` names, and merges them in,
leaving the tables exactly as a full recompute would. It is full when asked (`--full`), on the first
run, when as_of goes back, when the rules changed, when bronze saw anything but appends, or when the
output tables changed after the last run recorded them (a run that died half-way, or a hand edit; not
a compaction, which changes no row).
A run that finds every bronze table at the version the last run read, as of the same data time under the
same rules, computes nothing: the last run's result stands (mode `unchanged`).
Every run appends a row to `reconcile_runs`; anomalies are always merged by anomaly_id, so a finding
that no longer holds leaves the current view (Delta history keeps it) and an unchanged one stays.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.catalog import (
    add_new_fields,
    appended,
    create_table,
    ensure_view,
    history,
    latest_row,
    may_have_rows,
    stored_bytes,
    table_exists,
    table_schema,
    table_version,
    tables_in,
)
from jobs.config import Config
from jobs.errors import TxnReconError, first_line
from jobs.ingest import new_run_id
from jobs.lock import warehouse_lock
from jobs.session import OPTIMIZING_JIT, QUICK_JIT, build_session, with_jit
from schemas.bronze import BRONZE, EVENT_TIME, INGEST_FILES
from schemas.model import Schema
from schemas.reconciled import (
    ANOMALIES,
    BROKER_WINDOWS,
    BROKER_WRITES,
    DELIVERIES,
    DELIVERY_COUNTS,
    LIFECYCLE_STATS_COLUMNS,
    OFFSET_COMMITS,
    RECONCILE_RUNS,
    TRACE_COVERAGE,
    TXN_LIFECYCLE,
)
from schemas.spark import to_struct
from transforms.anomalies import OFFSET_KEY, offset_commits, offset_regressions, transaction_anomalies
from transforms.consumers import GROUP_TYPES, Refusals, group_anomalies, refusals
from transforms.deliveries import change_sign, changing, counted, deliveries, wanted
from transforms.frames import (
    cached_frames,
    change_counts,
    differing,
    folds_empty,
    kept,
    kept_with_ranges,
    row_count,
    union_all,
    within,
)
from transforms.lifecycle import (
    DISCARD_TOPIC,
    ID,
    Rules,
    facts,
    lifecycle,
    listed_copies,
    resolutions,
    resolved_offsets,
    up_to,
)
from transforms.scope import facts_of, touched_queues, touched_transactions, traced_transactions
from transforms.topology import (
    COLUMNS,
    TOPOLOGY_TYPES,
    anomaly_rows,
    changes,
    idle_brokers,
    passes,
    stored_writes,
    topic_gaps,
    window_totals,
)
from transforms.trace import CONSUMPTION_TYPES, attempts, consumption_findings

log = logging.getLogger(__name__)
_clock = {"started": time.perf_counter()}


def _progress(message: str, *args: object) -> None:
    """A progress line with the seconds since the run began."""
    log.info("  " + message + " (%.1f s)", *args, time.perf_counter() - _clock["started"])


# The streams reconcile follows version by version; consumer and topology snapshots are small and always read
# whole.
TIME = {s: EVENT_TIME[s] for s in ("half", "op", "real", "offset", "trace")}
SNAPSHOT_TIME = EVENT_TIME["consumer"]
# Anomaly types every run recomputes whole, whatever changed.
WHOLE_TYPES = ("OFFSET_REGRESSION", *GROUP_TYPES, *TOPOLOGY_TYPES)
OUTPUTS = (TXN_LIFECYCLE, OFFSET_COMMITS, ANOMALIES, DELIVERIES, DELIVERY_COUNTS, BROKER_WINDOWS)
# An offset commit as landed: its queue's previous commit, the rest of its row, follows from the others.
COMMIT_KEY = list(OFFSET_COMMITS.names[:8])
# Bronze history entries that only add rows (or move them without changing data).
APPEND_ONLY = {"WRITE": "Append", "OPTIMIZE": None, "CREATE TABLE": None, "SET TBLPROPERTIES": None}
# Output history entries that leave every row as it was: a compaction lays the same rows out in fewer files, and
# an operator's change of a table property (a retention, say) changes no row at all.
REARRANGING = {"OPTIMIZE", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES"}
# Recomputing a part costs about as much as the whole once it is a quarter of a large table; the
# part's keys are also broadcast to every task, which a million of them still fits.
FULL_ABOVE_SHARE, FULL_ABOVE_KEYS = 0.25, 1_000_000


@dataclass(frozen=True)
class Bronze:
    """Bronze as one run reads it: every table at the Delta version current when the run began."""

    tables: dict[str, str]  # stream -> catalog name
    versions: dict[str, int]
    frames: dict[str, DataFrame]

    def same_as(self, last: Row) -> bool:
        """Whether every table is at the version `last` read (a row that predates a version's column: no)."""
        return all(last[f"{s}_version"] == v for s, v in self.versions.items())


@dataclass(frozen=True)
class Written:
    mode: str
    reason: str | None
    transactions: int
    queues: int
    wants: str  # wants_json: what the deliveries written were computed for


@dataclass(frozen=True)
class Queues:
    """The consumer queues' part of an incremental run (`incremental.queue_side`)."""

    queues: int  # touched: with new commits
    commits_then: DataFrame  # offset_commits as the last run left it
    snapshots: DataFrame  # the consumer snapshots up to as_of
    commits: DataFrame  # the touched queues' commits, recomputed
    every_commit: DataFrame  # the others' as they were, and these
    refused: Refusals
    whole: DataFrame  # the findings recomputed whole (WHOLE_TYPES)
    wants: str  # wants_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--as-of", type=int, metavar="EPOCH_MS", help="data time (default: the latest event)")
    parser.add_argument("--full", action="store_true", help="recompute everything instead of what changed")


def run(args: argparse.Namespace, config: Config) -> int:
    with warehouse_lock(config, "reconcile"):
        # A full run loops over every row, an incremental one runs many small queries (jobs.session).
        spark = build_session(with_jit(config, QUICK_JIT if not args.full and has_run(config) else OPTIMIZING_JIT))
        reconcile(spark, config, args.as_of, full=args.full)
        counts = anomaly_counts(spark, config)
    print(summary(counts))
    return 0


def has_run(config: Config) -> bool:
    """Whether a local warehouse holds an earlier run, by its folder (no Spark yet): the next run is incremental
    unless something forces a full one."""
    runs = Path(config.warehouse) / f"{config.database}.db" / RECONCILE_RUNS.name / "_delta_log"
    return config.is_local_warehouse and runs.is_dir()


def rules_from(config: Config) -> Rules:
    fields = {f.name for f in dataclasses.fields(Rules)}
    settings = dataclasses.asdict(config.broker) | dataclasses.asdict(config.thresholds)
    return Rules(**{k: v for k, v in settings.items() if k in fields})


def reconcile(
    spark: SparkSession, config: Config, as_of: int | None = None, full: bool = False, latest: int | None = None
) -> int:
    """Compute and write silver and gold as of `as_of` (by default the latest event in bronze, `latest` when the
    caller knows it); return it."""
    started_at = dt.datetime.now(dt.UTC)
    _clock["started"] = started = time.perf_counter()
    bronze = read_bronze(spark, config)
    if as_of is None:
        latest = latest if latest is not None else latest_event(spark, config, bronze.frames)
        if latest is None:
            raise TxnReconError("bronze holds no events yet; nothing to reconcile")
        as_of = latest
    rules = rules_from(config)
    rebuilt = ensure_outputs(spark, config)
    last = last_run(spark, config)
    reason = "--full" if full else rebuilt or why_full(spark, config, bronze, last, as_of, rules)
    _progress("bronze versions %s read", bronze.versions)
    written = None
    if reason is None and last is not None and as_of == last["as_of"] and bronze.same_as(last):
        # The same inputs, rules and data time, and the outputs as the last run left them: its result stands.
        log.info("reconcile as of %d: unchanged since run %s", as_of, last["run_id"])
        written = Written("unchanged", None, 0, 0, last["wants"])
    elif reason is None and last is not None:
        log.info("reconcile as of %d: incremental since run %s", as_of, last["run_id"])
        try:
            with sources_as_they_are(spark):
                written = incremental(spark, config, bronze, last, as_of, rules)
            reason = "the changes touch most transactions" if written is None else None
        except (PySparkException, Py4JJavaError) as e:  # e.g. change data removed by VACUUM; full is always safe
            reason = f"the incremental run failed ({first_line(e)})"
            log.warning("  %s", reason)
    if written is None:
        log.info("reconcile as of %d: full (%s)", as_of, reason)
        written = recompute(spark, config, bronze, as_of, rules, reason or "")
    record_run(spark, config, bronze, as_of, latest, rules, written, started_at)
    log.info("reconcile done: %s, %d transactions, %d queues (%.1f s)", written.mode, written.transactions,
             written.queues, time.perf_counter() - started)  # fmt: skip
    return as_of


def anomaly_counts(spark: SparkSession, config: Config) -> dict[str, int]:
    """The anomaly count per type in the current view: what a run prints. Apart from `reconcile`, which serve
    and the tests call without it: serve takes the same counts from the dashboard's read of the table."""
    found = spark.table(config.table(ANOMALIES.name)).groupBy("anomaly_type").count().collect()
    return {r["anomaly_type"]: r["count"] for r in found}


def read_bronze(spark: SparkSession, config: Config) -> Bronze:
    tables = {s: config.table(b.name) for s, b in BRONZE.items()}
    missing = [t for t in tables.values() if not table_exists(spark, t)]
    if missing:
        raise TxnReconError(f"no bronze tables yet ({', '.join(missing)}); run `txn-recon ingest` first")
    versions = {s: table_version(spark, t) for s, t in tables.items()}
    frames = {s: _pinned(spark, t, versions[s]) for s, t in tables.items()}
    # The consumer snapshots are few, and every group rule groups or orders them by group, queue or snapshot: in
    # one partition, as Spark reads files of up to maxPartitionBytes, none of that shuffles (each shuffle ran
    # a Spark job). Past that size they are read as any table is; an empty table is left as the empty relation
    # Spark folds away.
    size = stored_bytes(spark, tables["consumer"], versions["consumer"])
    if size and size <= _partition_bytes(spark):
        frames["consumer"] = frames["consumer"].coalesce(1)
    return Bronze(tables, versions, frames)


def _partition_bytes(spark: SparkSession) -> int:
    """spark.sql.files.maxPartitionBytes, in bytes as Spark reads it (it takes units: "128m")."""
    return int(spark._jsparkSession.sessionState().conf().filesMaxPartitionBytes())


def _pinned(spark: SparkSession, table: str, version: int) -> DataFrame:
    """The table at `version`. One without rows (a warehouse that collects no consumer groups, copies, topology
    or trace has such) is an empty relation, which Spark folds away while planning: the parts of a query on it
    run no job."""
    df = spark.sql(f"SELECT * FROM {table} VERSION AS OF {version}")
    return df if may_have_rows(spark, table, version) else df.limit(0)


def latest_event(spark: SparkSession, config: Config, bronze: dict[str, DataFrame]) -> int | None:
    """The default as_of: the latest event in bronze (EVENT_TIME), as ingest recorded it per file
    (`ingest_files.events_until`): one small aggregate. Bronze's own statistics answer it too, but at some
    four Spark jobs per table; they do so only where a file lacks the figure (ingested by an older version,
    until ingest migrates it) or none was recorded. Ingest and reconcile hold the warehouse in turn, so every
    file recorded is in the bronze versions read."""
    table = config.table(INGEST_FILES.name)
    if table_exists(spark, table) and "events_until" in (files := spark.table(table)).columns:
        files = files.where(F.col("status") == "ingested")
        [(latest, lacking)] = files.agg(F.max("events_until"), F.count_if(F.col("events_until").isNull())).collect()
        if lacking == 0 and latest is not None:
            return int(latest)
    found = [v for s, c in EVENT_TIME.items() if (v := bronze[s].agg(F.max(c)).collect()[0][0]) is not None]
    return int(max(found)) if found else None


def ensure_outputs(spark: SparkSession, config: Config) -> str | None:
    """Create the output tables that are missing, found in one catalog listing. One whose columns differ from
    its schema (written by an older version) is derived data: it is dropped and rebuilt, and the reason is
    returned."""
    existing = tables_in(spark, config.database)
    reason = None
    for schema in OUTPUTS:
        table = config.table(schema.name)
        if schema.name in existing:
            if _same_columns(table_schema(spark, table), schema):
                continue
            log.warning("  %s has other columns than this version writes; rebuilding it", table)
            spark.sql(f"DROP TABLE {table}")
            reason = f"{schema.name} was rebuilt with new columns"
        # The change feed lets the quality suites validate what a merge changed. No deletion vectors: a merge
        # rewrites the files it touches (conf/base.yaml says why), and a scan of a table that may hold them
        # costs a job of its own to look for them.
        properties = {"delta.enableChangeDataFeed": "true"}
        stats = LIFECYCLE_STATS_COLUMNS if schema is TXN_LIFECYCLE else ()
        create_table(spark, config, schema, properties=properties, stats_columns=stats)
    if RECONCILE_RUNS.name in existing:
        add_new_fields(spark, config.table(RECONCILE_RUNS.name), RECONCILE_RUNS)
    else:
        create_table(spark, config, RECONCILE_RUNS)
    ensure_view(spark, config.table(BROKER_WRITES.name), broker_writes_view(config))
    ensure_view(spark, config.table(TRACE_COVERAGE.name), trace_coverage_view(config))
    return reason


def broker_writes_view(config: Config) -> str:
    """The query of the `broker_writes` view (schemas.reconciled.BROKER_WRITES) over the half and real events."""
    half, real = config.table(BRONZE["half"].name), config.table(BRONZE["real"].name)
    return f"""SELECT broker_name, topic, minute_ts, CAST(sum(message) AS BIGINT) AS messages,
               CAST(sum(1 - message) AS BIGINT) AS halves
        FROM (SELECT broker_name, real_topic AS topic, store_timestamp DIV 60000 * 60000 AS minute_ts, 0 AS message
              FROM {half} WHERE check_times IS NULL
              UNION ALL
              SELECT broker_name, topic, store_timestamp DIV 60000 * 60000, 1 FROM {real}
              WHERE topic <> '{DISCARD_TOPIC}')
        GROUP BY broker_name, topic, minute_ts"""


def trace_coverage_view(config: Config) -> str:
    """The query of the `trace_coverage` view (schemas.reconciled.TRACE_COVERAGE) over trace_events."""
    return f"""SELECT group_name, IF(trace_type IN ('Pub', 'EndTransaction'), 'producer', 'consumer') AS role,
               store_timestamp DIV 60000 * 60000 AS minute_ts, count(*) AS contexts,
               count(DISTINCT born_host) AS instances, count_if(from_check) AS answers,
               count_if(trace_type = 'SubAfter' AND NOT success) AS failed
        FROM {config.table(BRONZE["trace"].name)} WHERE group_name IS NOT NULL
        GROUP BY 1, 2, 3"""


def _same_columns(actual: T.StructType, schema: Schema) -> bool:
    return [(f.name, f.dataType) for f in actual.fields] == [(f.name, f.dataType) for f in to_struct(schema).fields]


def last_run(spark: SparkSession, config: Config) -> Row | None:
    return latest_row(spark, config.table(RECONCILE_RUNS.name), "finished_at")


def latest_as_of(spark: SparkSession, config: Config) -> int | None:
    """The data time of the last reconcile run, if any."""
    if not table_exists(spark, config.table(RECONCILE_RUNS.name)):
        return None
    last = last_run(spark, config)
    return None if last is None else int(last["as_of"])


# Raised when a rule's output changes shape (2: discards gained their traced answers), so that the first run after
# an upgrade is full and no finding keeps the older shape.
RULES_REVISION = 2


def rules_json(rules: Rules) -> str:
    return json.dumps(dataclasses.asdict(rules) | {"revision": RULES_REVISION}, sort_keys=True)


def why_full(
    spark: SparkSession, config: Config, bronze: Bronze, last: Row | None, as_of: int, rules: Rules
) -> str | None:
    """Why this run cannot build on the last one, or None when it can."""
    if last is None:
        return "no earlier run"
    if as_of < last["as_of"]:
        return f"as_of {as_of} is before the last run's {last['as_of']}"
    if last["rules"] != rules_json(rules):
        return "the rules changed since the last run"
    for schema in OUTPUTS:
        table = config.table(schema.name)
        version, recorded = table_version(spark, table), last[f"{schema.name}_version"]
        # Compacted since (OPTIMIZE, e.g. by an operator's weekly job) or given a property is as the last run left it.
        compacted = version > recorded and all(h["operation"] in REARRANGING for h in history(spark, table, recorded))
        if version != recorded and not compacted:
            return f"{schema.name} is at version {version}, the last run left it at {recorded}"
    for stream in TIME:
        table, since, now = bronze.tables[stream], last[f"{stream}_version"], bronze.versions[stream]
        if since is None:
            return f"the last run read no {table}"
        if now < since:
            return f"{table} is at version {now}, older than the {since} the last run read"
        for h in history(spark, table, since) if now > since else []:
            mode = APPEND_ONLY.get(h["operation"], "?")
            if mode is not None and (h["operationParameters"] or {}).get("mode") != mode:
                return f"{table} had a {h['operation']} at version {h['version']}, not only appends"
    return None


def full_view(frames: dict[str, DataFrame], as_of: int, rules: Rules) -> dict[str, DataFrame]:
    """Every output table computed from bronze alone: what a full run writes, by table name."""
    life, commits_df = silver_view(frames, as_of, rules)
    found, delivered = gold_view(frames, life, commits_df, snapshots_up_to(frames, as_of), as_of, rules)
    return {
        TXN_LIFECYCLE.name: life,
        OFFSET_COMMITS.name: commits_df,
        ANOMALIES.name: found,
        DELIVERIES.name: delivered,
        BROKER_WINDOWS.name: windows_of(frames, as_of, rules),
    }


def silver_view(frames: dict[str, DataFrame], as_of: int, rules: Rules) -> tuple[DataFrame, DataFrame]:
    """The transactions' lifecycle and the offset commits, from bronze alone."""
    half, op, real, offset = (frames[s].transform(up_to(as_of, TIME[s])) for s in ("half", "op", "real", "offset"))
    life = facts(half, resolutions(half, resolved_offsets(op)), real).transform(lifecycle(as_of, rules))
    return life, offset_commits(offset)


def gold_view(frames: dict[str, DataFrame], life: DataFrame, commits_df: DataFrame, snapshots: DataFrame, as_of: int,
              rules: Rules, windows: DataFrame | None = None) -> tuple[DataFrame, DataFrame]:  # fmt: skip
    """The anomalies and the deliveries, from silver, the consumer snapshots up to `as_of` and bronze (and
    broker_windows' rows, `windows`, when written: `cluster_anomalies`)."""
    real, trace = (frames[s].transform(up_to(as_of, TIME[s])) for s in ("real", "trace"))
    # Findings and refusals are few, and both the anomalies and the deliveries read them: computed once, kept.
    snapshotted = not snapshots.isEmpty()
    refused = refused_by_filters(snapshots, commits_df, real, snapshotted)
    groups = group_anomalies(snapshots, commits_df, real, frames["copy"], refused, as_of, rules.stranded_after_ms,
                             snapshotted)  # fmt: skip
    whole = commits_df.transform(offset_regressions(real, as_of)).unionByName(groups).localCheckpoint()
    # Checkpointed: the consumption trace's findings join it twice, and planning over its whole plan took seconds.
    delivered = deliveries(real, snapshots, commits_df, frames["copy"], whole, refused, as_of).localCheckpoint()
    found = [transaction_anomalies(life, as_of, rules, trace), whole, cluster_anomalies(frames, as_of, rules, windows),
             consumption(trace, real, delivered, whole, as_of)]  # fmt: skip
    return union_all(found), delivered


def consumption(trace: DataFrame, real: DataFrame, delivered: DataFrame, found: DataFrame, as_of: int) -> DataFrame:
    """The findings of the consumption trace (CONSUMPTION_TYPES), against the deliveries and the hand-offs and
    regressions among `found` that explain a duplicate."""
    explaining = found.where(F.col("anomaly_type").isin("OFFSET_REGRESSION", "REDELIVERY_AT_HANDOFF"))
    return consumption_findings(attempts(trace), real, delivered, explaining, as_of)


def cluster_anomalies(frames: dict[str, DataFrame], as_of: int, rules: Rules,
                      windows: DataFrame | None = None) -> DataFrame:  # fmt: skip
    """TOPIC_NOT_ON_BROKER and BROKER_WITHOUT_WRITES (`transforms.topology`), recomputed whole every run: the
    topology's changes and each broker's writes per window (`windows`, broker_windows' rows; from bronze when
    not given) are collected, and the rules run in the driver."""
    topology = frames["topology"]
    rows = changes(topology.where(F.col("snapshot_ts") <= as_of)).select(*COLUMNS).collect()
    history, found = passes(r.asDict() for r in rows), []
    if history:
        size = rules.idle_window_ms
        stored = window_totals(windows if windows is not None else windows_of(frames, as_of, rules))
        done = stored.where(F.col("window_ts") < as_of // size * size).collect()  # the windows ended by as_of
        writes = {(r["broker_name"], r["window_ts"] // size): r["messages"] for r in done}
        found = anomaly_rows(topic_gaps(history, as_of, rules), idle_brokers(history, writes, as_of, rules), as_of,
                             size)  # fmt: skip
    return topology.sparkSession.createDataFrame(found, to_struct(ANOMALIES))


def windows_of(frames: dict[str, DataFrame], as_of: int, rules: Rules) -> DataFrame:
    """broker_windows' rows from bronze: every write up to `as_of`."""
    half, real = (frames[s].transform(up_to(as_of, TIME[s])) for s in ("half", "real"))
    return stored_writes(half, real, rules.idle_window_ms)


def refused_by_filters(snapshots: DataFrame, commits: DataFrame, real: DataFrame, seen: bool | None = None) -> Refusals:
    """The tag filters' refusals, kept. Every window a filter could refuse in is bounded by a consumer snapshot:
    with none (a warehouse that collects no consumer groups) there is none, and computing them still ran Spark
    jobs. `seen`: whether there is a snapshot, when the caller knows."""
    seen = not snapshots.isEmpty() if seen is None else seen
    if not seen:
        return refusals(snapshots, commits, real).none()
    return refusals(snapshots, commits, real, lambda df: df.localCheckpoint())


def snapshots_up_to(frames: dict[str, DataFrame], as_of: int) -> DataFrame:
    """The consumer snapshots up to `as_of`, checkpointed: they are small, and the group rules read them
    in a dozen places (from the Delta table, that took twice as long). Without any (a warehouse that collects
    no consumer groups) they stay the empty relation Spark folds away: checkpointed, every plan reading them
    broadcast them, a Spark job each."""
    snapshots = frames["consumer"].transform(up_to(as_of, SNAPSHOT_TIME))
    return snapshots if folds_empty(snapshots) else snapshots.localCheckpoint()


def recompute(spark: SparkSession, config: Config, bronze: Bronze, as_of: int, rules: Rules, reason: str) -> Written:
    """Everything from bronze: silver replaced, anomalies merged whole."""
    # Cached once: the anomalies and both writes read them (Spark swaps the cache into every plan using them).
    life, commits_df = (df.persist() for df in silver_view(bronze.frames, as_of, rules))
    snapshots = snapshots_up_to(bronze.frames, as_of)

    def silver() -> Written:
        _replace(config, OFFSET_COMMITS, commits_df)
        _progress("offset_commits written")
        # Files by birth time (sorted, so each file holds a stretch of it): new events touch recent transactions,
        # so a later merge skips the older files and rewrites a few recent ones.
        _replace(config, TXN_LIFECYCLE, life.orderBy("born_ts"))
        _progress("txn_lifecycle written")
        transactions, queues = life.count(), commits_df.select(*OFFSET_KEY).distinct().count()
        return Written("full", reason, transactions, queues, wants_json(wanted(snapshots, commits_df)))

    try:
        # Silver is written in a thread of its own while the driver plans the anomalies and the deliveries, and
        # beside their jobs: the cores are shared, and neither waits for the other's planning.
        with ThreadPoolExecutor(1, "reconcile") as pool:
            written = pool.submit(silver)
            # Written first: the cluster rules then read its totals, not every half and message again.
            windows = config.table(BROKER_WINDOWS.name)
            _replace(config, BROKER_WINDOWS, windows_of(bronze.frames, as_of, rules))
            found, delivered = gold_view(bronze.frames, life, commits_df, snapshots, as_of, rules, spark.table(windows))
            merge_anomalies(spark, config, found)
            _progress("anomalies merged")
            _replace_deliveries(config, delivered)
            _progress("deliveries written")
            return written.result()
    finally:
        life.unpersist()
        commits_df.unpersist()


def incremental(
    spark: SparkSession, config: Config, bronze: Bronze, last: Row, as_of: int, rules: Rules
) -> Written | None:
    """Only what changed since `last`; None when that is most of the data (a full run is then cheaper)."""
    half, op, real, offset, trace = (bronze.frames[s].transform(up_to(as_of, TIME[s])) for s in TIME)
    new = {s: new_rows(spark, bronze, s, last, as_of) for s in TIME}
    copies = bronze.frames["copy"]

    def queue_side() -> Queues:
        """The consumer queues' part, which needs nothing of the transactions' part: their commits, then the
        group findings and offset regressions, recomputed whole (WHOLE_TYPES). It writes nothing: a run that
        turns out full drops it."""
        queues, queued = kept(touched_queues(new["offset"]), row_count())
        _progress("%d queues to recompute", queued["rows"])
        # Kept: every group rule and the deliveries read the commits, and planning a query that scans a table with
        # deletion vectors runs a Spark job per scan to look for them (while it finds none, again at each re-plan).
        commits_then = _as_left(spark, config, OFFSET_COMMITS, last).localCheckpoint()
        snapshots = snapshots_up_to(bronze.frames, as_of)
        # The touched queues joined by a sort: a broadcast is a Spark job of its own, and the commits are few (one
        # per group and queue every few seconds) and sorted by queue anyway, to chain them.
        commits_q = offset_commits(offset.join(queues, on=OFFSET_KEY, how="left_semi")).localCheckpoint()
        # Kept: the group rules, the refusals, the wants and the deliveries read every commit, and each read would
        # join the touched queues again to leave them out. (The union itself, checkpointed, fails in Spark's
        # optimizer: "key not found" as the Union rewrites its children's constraints.)
        untouched = commits_then.join(queues, on=OFFSET_KEY, how="left_anti").localCheckpoint()
        every_commit = union_all([untouched.select(*OFFSET_COMMITS.names), commits_q.select(*OFFSET_COMMITS.names)])
        snapshotted = not snapshots.isEmpty()
        refused = refused_by_filters(snapshots, every_commit, real, snapshotted)
        whole = (
            every_commit.transform(offset_regressions(real, as_of))
            .unionByName(group_anomalies(snapshots, every_commit, real, copies, refused, as_of,
                                         rules.stranded_after_ms, snapshotted))
            .localCheckpoint()
        )  # fmt: skip
        wants = wants_json(wanted(snapshots, every_commit))
        return Queues(queued["rows"], commits_then, snapshots, commits_q, every_commit, refused, whole, wants)

    def merge_deliveries(q: Queues) -> None:
        if q.wants != last["wants"]:
            _replace_deliveries(config, deliveries(real, q.snapshots, q.every_commit, copies, q.whole, q.refused,
                                                   as_of))  # fmt: skip
            _progress("deliveries rewritten: the groups want other topics or tags than at the last run")
            return
        stored = _as_left(spark, config, DELIVERIES, last)
        found_then = _as_left(spark, config, ANOMALIES, last)
        messages = changing(real, new["real"], q.snapshots, q.commits_then, q.every_commit, stored, copies,
                            found_then, q.whole, q.refused, as_of).localCheckpoint()  # fmt: skip
        recomputed, bounds = kept_with_ranges(
            deliveries(messages, q.snapshots, q.every_commit, copies, q.whole, q.refused, as_of),
            [*DELIVERIES.key, "store_timestamp"],
        )
        # Compared with the stored rows within the recomputed keys' ranges and their messages' store times (a
        # message's goes with its key): Delta skips the other files, written in store time order.
        candidates = within(stored, bounds)
        changed, seen = kept(differing(recomputed.select(*DELIVERIES.names), candidates, DELIVERIES.key),
                             *change_counts("store_timestamp"))  # fmt: skip
        if (earliest := seen["earliest"]) is not None:
            upsert(spark, config, DELIVERIES, changed, list(DELIVERIES.key), seen, _since("store_timestamp"))
            _count_changes(spark, config, last["deliveries_version"], earliest)
        _progress("deliveries merged: %d rows changed, %d added", seen["updated"], seen["added"])

    # The two parts run side by side, the queues' in a thread of its own, so that the jobs of one share the cores
    # while the driver plans the other's (most of a small job is the driver's): the transactions' scope, lifecycle
    # and merge here; the queues' commits, group rules and then the deliveries there.
    # The frames cached for this run (`cached_frames`) are let go once both parts are done with them.
    with cached_frames() as cache, ThreadPoolExecutor(1, "reconcile") as pool:
        queue_part = pool.submit(queue_side)
        current = _as_left(spark, config, TXN_LIFECYCLE, last)
        # The copies the new ops list, kept, are looked up among the halves within their ranges: recent files
        # as a rule.
        listed, bounds = kept_with_ranges(listed_copies(new["op"]).distinct(), BRONZE["half"].key)
        # Checkpointed (kept by the executors, lineage cut): small, used in many places, and every later plan
        # stays short; a plan that repeats a cached part's whole lineage in each use can fill the heap.
        keys, touched = kept(union_all([
            touched_transactions(new["half"], listed, new["real"], within(half, bounds), current),
            traced_transactions(new["trace"], current),
        ]).distinct(), row_count())  # fmt: skip
        n_keys = touched["rows"]
        _progress("%d transactions to recompute", n_keys)
        if n_keys > FULL_ABOVE_KEYS and n_keys > FULL_ABOVE_SHARE * current.count():
            return None  # once the queues' part is done (leaving the pool waits for it): a full run follows
        delivered = pool.submit(lambda: merge_deliveries(queue_part.result()))
        # The plan reads the recomputed transactions' halves and messages several times: cached, each table is
        # scanned once for them, by the job that needs them first (checkpointed, each cost a Spark job of its own).
        half_k, real_k = (cache(df.join(F.broadcast(keys), on=ID, how="left_semi")) for df in (half, real))
        life, seen = kept(facts_of(half_k, op, real_k).transform(lifecycle(as_of, rules)),
                          F.min("born_ts").alias("born"))  # fmt: skip
        stored = current.alias("t").where(born_since(seen["born"]))
        changed, counts = kept(differing(life.select(*TXN_LIFECYCLE.names), stored, ID), *change_counts("born_ts"))
        upsert(spark, config, TXN_LIFECYCLE, changed, ID, counts, born_since)
        _progress("txn_lifecycle merged: %d rows changed, %d added", counts["updated"], counts["added"])
        # What the new events add to broker_windows: a row per broker and window they fall in.
        windows = config.table(BROKER_WINDOWS.name)
        added = stored_writes(new["half"], new["real"], rules.idle_window_ms)
        if not folds_empty(added):
            added.write.insertInto(windows)
        q = queue_part.result()
        found = [transaction_anomalies(life, as_of, rules, trace), q.whole,
                 cluster_anomalies(bronze.frames, as_of, rules, spark.table(windows))]  # fmt: skip
        # The consumption trace's findings are compared with the deliveries this run merges, so that with such a
        # trace the anomalies wait for the deliveries; one merge writes every finding, so that a reader sees the
        # anomalies as they were before a run or after it, never in between.
        # Asked of Spark only when there is a trace: a query on the empty relation of none still runs a job.
        consumed = trace.where(F.col("trace_type").isin("SubBefore", "SubAfter"))
        if not folds_empty(consumed) and consumed.limit(1).count() > 0:
            delivered.result()
            found.append(consumption(trace, real, spark.table(config.table(DELIVERIES.name)), q.whole, as_of))
        merge_anomalies(spark, config, union_all(found), scope=keys)
        _progress("anomalies merged")
        commits, counts = kept(differing(q.commits.select(*OFFSET_COMMITS.names),
                                         q.commits_then.select(*OFFSET_COMMITS.names), COMMIT_KEY),
                               *change_counts("commit_timestamp"))  # fmt: skip
        upsert(spark, config, OFFSET_COMMITS, commits, COMMIT_KEY, counts, _since("commit_timestamp"))
        _progress("offset_commits merged: %d rows changed, %d added", counts["updated"], counts["added"])
        delivered.result()
    return Written("incremental", None, n_keys, q.queues, q.wants)


def _replace_deliveries(config: Config, df: DataFrame) -> None:
    """Deliveries written whole, in files by store time (sorted): the rows a later run changes are recent as a
    rule, so its merge (bounded by store time) skips the rest and rewrites the few files holding them. Their
    counts are then counted whole too."""
    _replace(config, DELIVERIES, df.orderBy("store_timestamp"))
    _replace(config, DELIVERY_COUNTS, counted(df.sparkSession.table(config.table(DELIVERIES.name))))


def _count_changes(spark: SparkSession, config: Config, since: int, earliest: int) -> None:
    """Add to `delivery_counts` what the writes to `deliveries` after version `since` changed (its change feed:
    +1 for a row added, -1 for one taken away), and drop the counts that reach zero. Every changed row is
    stored at `earliest` or later, so the older counts are skipped."""
    table = config.table(DELIVERIES.name)
    changes = (
        spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", since + 1)
        .option("endingVersion", table_version(spark, table)).table(table)
    )  # fmt: skip
    sums = ("messages", "retries", "duplicates_expected")
    on = " AND ".join(
        [f"t.{c} = s.{c}" for c in DELIVERY_COUNTS.key] + [f"t.second_ts >= {earliest - earliest % 1000}"]
    )
    (
        DeltaTable.forName(spark, config.table(DELIVERY_COUNTS.name)).alias("t")
        .merge(counted(changes, change_sign()).alias("s"), on)
        .whenMatchedDelete(condition="t.messages + s.messages = 0")
        .whenMatchedUpdate(set={c: F.col(f"t.{c}") + F.col(f"s.{c}") for c in sums})
        .whenNotMatchedInsertAll()
        .execute()
    )  # fmt: skip


def wants_json(df: DataFrame) -> str:
    """What the groups want per topic (`transforms.deliveries.wanted`), as JSON a later run compares with."""
    return json.dumps(sorted([r[0], r[1], r[2]] for r in df.collect()))


def _as_left(spark: SparkSession, config: Config, schema: Schema, last: Row) -> DataFrame:
    """An output table as the last run left it: pinned, so a recomputation of a cached part can never
    see this run's own merges."""
    return spark.sql(f"SELECT * FROM {config.table(schema.name)} VERSION AS OF {last[f'{schema.name}_version']}")


def new_rows(spark: SparkSession, bronze: Bronze, stream: str, last: Row, as_of: int) -> DataFrame:
    """Rows the last run did not see, each once (broker_windows adds them up), up to this run's as_of: those
    after its as_of, and those appended since the version it read (Change Data Feed) at or before its as_of. A run
    as of the latest event it read (as a service's are) left none after its as_of in that version: every such row
    is appended since, and the scan of the rest, a Spark job to list the table's files, is skipped."""
    ts, frame = F.col(TIME[stream]), bronze.frames[stream]
    seen = saw_all(last)
    # A filter Spark folds to no rows, and so no scan.
    window = frame.where(F.lit(False) if seen else (ts > last["as_of"]) & (ts <= as_of))
    since, now = last[f"{stream}_version"], bronze.versions[stream]
    if since == now:
        return window
    added = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", since + 1)
        .option("endingVersion", now)
        .table(bronze.tables[stream])
        .where((F.col("_change_type") == "insert") & (ts <= (as_of if seen else last["as_of"])))
    )
    return window.unionByName(added.select(*frame.columns))


# Delta copies a merge's source before it merges unless it can tell the source is deterministic, which it cannot of
# a checkpointed one: a Spark job per merge. An incremental run's sources are checkpointed (kept) frames, or the
# change data of pinned versions, so it merges them as they are. A full run's stay Delta's: it merges frames that
# are cached while it runs, which Delta refuses to merge uncopied (DELTA_MERGE_SOURCE_CACHED_DURING_EXECUTION).
MATERIALIZE = "spark.databricks.delta.merge.materializeSource"


@contextmanager
def sources_as_they_are(spark: SparkSession) -> Iterator[None]:
    """While open, Delta merges each source as it is, uncopied, unless the session's configuration says otherwise."""
    if spark.conf.get(MATERIALIZE, None) is not None:
        yield
        return
    spark.conf.set(MATERIALIZE, "none")
    try:
        yield
    finally:
        spark.conf.unset(MATERIALIZE)


def saw_all(run: Row) -> bool:
    """Whether a reconcile run's as_of was the latest event in the bronze versions it read: they held nothing
    later. Not known of a run given its as_of, nor of one an older version made."""
    until = run.asDict().get("events_until")
    return until is not None and until <= run["as_of"]


def born_since(earliest: int | None) -> str:
    """A condition on the stored lifecycle that every recomputed transaction matches, given the least born_ts
    among them, for Delta to skip the files of older ones. A transaction's born_ts is the least of its
    halves', and a run only adds halves: its stored born_ts is null (no half yet) or at least its recomputed
    one."""
    return "t.born_ts IS NULL" + ("" if earliest is None else f" OR t.born_ts >= {earliest}")


def _replace(config: Config, schema: Schema, df: DataFrame) -> None:
    """Replace a table's rows (INSERT OVERWRITE keeps its definition; history keeps the past)."""
    df.select(*schema.names).write.insertInto(config.table(schema.name), overwrite=True)


def _changed(names: tuple[str, ...] | list[str]) -> str:
    return " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in names)


def upsert(
    spark: SparkSession, config: Config, schema: Schema, changes: DataFrame, key: list[str], seen: dict[str, Any],
    within: Callable[[Any], str],
) -> None:  # fmt: skip
    """Write the recomputed rows that differ from the stored ones (`differing`, counted by `change_counts` into
    `seen`); rows of a transaction or queue never disappear as as_of grows. A row with a stored key updates
    that row where it lies, by a merge that reaches only the stored rows `within(seen["earliest_updated"])`
    names; the new rows are appended, in files of their own. Two commits, not one: a merge that
    also inserts shuffles the rows of every file it rewrites together with the new ones, so each file it
    writes spans all their range and holds recent rows, and every later merge rewrote them all again, a
    cycle's new rows more each time."""
    table = config.table(schema.name)
    if seen["updated"]:
        on = " AND ".join([f"t.{c} <=> s.{c}" for c in key] + [f"({within(seen['earliest_updated'])})"])
        updated = changes.where(~F.col("_new")).select(*schema.names).alias("s")
        DeltaTable.forName(spark, table).alias("t").merge(updated, on).whenMatchedUpdateAll().execute()
    if seen["added"]:
        changes.where(F.col("_new")).select(*schema.names).write.insertInto(table)


def _since(column: str) -> Callable[[Any], str]:
    """`upsert`'s `within` for a key holding `column`: stored rows from the least recomputed value on."""
    return lambda least: f"t.{column} >= {least}"


def merge_anomalies(spark: SparkSession, config: Config, found: DataFrame, scope: DataFrame | None = None) -> None:
    """Upsert by anomaly_id; delete what no longer holds. A row found again as it was is left untouched, its
    as_of that of the run that found it so: a cycle writes the findings that changed, not every finding.
    With `scope` (the recomputed transactions; WHOLE_TYPES and the consumption findings are always
    recomputed), only rows in scope can go."""
    table = config.table(ANOMALIES.name)
    if scope is None and not may_have_rows(spark, table):
        # A first run: nothing to update or delete, and the merge's join of source and target cost seconds.
        found.select(*ANOMALIES.names).write.insertInto(table)
        return
    columns: dict[str, str | Column] = {c: f"s.{c}" for c in ANOMALIES.names}
    # A run as of an earlier time (a full one) rewrites a row from later: no row is newer than the last run.
    changed = f"{_changed([c for c in ANOMALIES.names[1:] if c != 'as_of'])} OR t.as_of > s.as_of"
    target = DeltaTable.forName(spark, table).alias("t")
    if scope is None:
        (
            target.merge(found.alias("s"), "t.anomaly_id = s.anomaly_id")
            .whenMatchedUpdate(condition=changed, set=columns)
            .whenNotMatchedInsert(values=columns)
            .whenNotMatchedBySourceDelete()
            .execute()
        )  # fmt: skip
        return
    found = found.persist()  # read twice: the rows to merge, and those to take away
    try:
        existing = spark.table(table)
        recomputed_whole = F.col("anomaly_type").isin(*WHOLE_TYPES) | _consumption()
        # The findings read once (each scan of the table costs Delta a file listing, a Spark job): those of the
        # recomputed transactions are marked by their keys, which are distinct.
        marked = existing.join(F.broadcast(scope.select(*ID, F.lit(True).alias("_scoped"))), on=ID, how="left")
        in_scope = marked.where(recomputed_whole | F.col("_scoped").isNotNull()).drop("_scoped")
        gone = in_scope.join(found.select("anomaly_id"), on="anomaly_id", how="left_anti")
        # Kept, the merge reads it twice without listing the table or broadcasting the scope again, and Delta merges
        # it as it is (`sources_as_they_are`), where it would refuse a cached frame uncopied.
        source = kept(found.withColumn("_gone", F.lit(False)).unionByName(gone.withColumn("_gone", F.lit(True))))[0]
    finally:
        found.unpersist()
    (
        target.merge(source.alias("s"), "t.anomaly_id = s.anomaly_id")
        .whenMatchedDelete(condition="s._gone")
        .whenMatchedUpdate(condition=changed, set=columns)
        .whenNotMatchedInsert(condition="NOT s._gone", values=columns)
        .execute()
    )  # fmt: skip


def _consumption() -> Column:
    """The consumption trace's findings (`transforms.trace.consumption_findings`, keyed by group): like
    WHOLE_TYPES, recomputed whole every run."""
    return F.col("anomaly_type").isin(*CONSUMPTION_TYPES) & F.col("consumer_group").isNotNull()


def record_run(
    spark: SparkSession, config: Config, bronze: Bronze, as_of: int, latest: int | None, rules: Rules,
    written: Written, started_at: dt.datetime,
) -> None:  # fmt: skip
    row = {
        "run_id": new_run_id(started_at, "reconcile"), "mode": written.mode, "reason": written.reason,
        "as_of": as_of, "rules": rules_json(rules), "transactions": written.transactions, "queues": written.queues,
        "wants": written.wants, "events_until": latest,
        **{f"{s}_version": v for s, v in bronze.versions.items()},
        **{f"{s.name}_version": table_version(spark, config.table(s.name)) for s in OUTPUTS},
        "started_at": started_at.replace(tzinfo=None), "finished_at": dt.datetime.now(dt.UTC).replace(tzinfo=None),
    }  # fmt: skip
    table = config.table(RECONCILE_RUNS.name)
    spark.createDataFrame([row], to_struct(RECONCILE_RUNS)).write.format("delta").mode("append").saveAsTable(table)
    appended(spark, table, [Row(**{c: row.get(c) for c in RECONCILE_RUNS.names})], "finished_at")


def summary(counts: dict[str, int]) -> str:
    if not counts:
        return "reconcile: no anomalies"
    width = max(len(k) for k in counts)
    return "\n".join(["reconcile: anomalies by type", *(f"  {k:<{width}}  {v:>8}" for k, v in sorted(counts.items()))])


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["reconcile", *sys.argv[1:]]))
