"""Incremental reconcile equals a full recompute: a chaos landing delivered in parts, some late."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.catalog import create_table
from jobs.config import Config
from jobs.reconcile import (
    COMMIT_KEY,
    MATERIALIZE,
    TIME,
    born_since,
    full_view,
    read_bronze,
    reconcile,
    rules_from,
    upsert,
)
from jobs.session import jobs_started
from schemas.reconciled import ANOMALIES, BROKER_WINDOWS, DELIVERIES, DELIVERY_COUNTS, OFFSET_COMMITS, TXN_LIFECYCLE
from schemas.spark import to_struct
from tests.test_ingest import files_of, fresh_db, ingest, make_landing, version
from transforms.frames import change_counts, differing, kept
from transforms.topology import window_totals

pytestmark = pytest.mark.spark
STREAMS = ("half", "op", "real", "offset")


def _deliveries(source: Path, cuts: list[float], late_share: float, seed: int) -> list[dict[str, list[str]]]:
    """The landing's lines per stream, split by event time at the `cuts` (fractions of the time span);
    a `late_share` of each part after the first arrives one part late, as a slow exporter delivers it."""
    rng = random.Random(seed)
    records = {
        s: [json.loads(line) for f in sorted((source / s).glob("*.jsonl")) for line in f.open()] for s in STREAMS
    }
    times = [r[TIME[s]] for s in STREAMS for r in records[s]]
    low, high = min(times), max(times)
    bounds = [low + (high - low) * c for c in cuts]
    parts: list[dict[str, list[str]]] = [{s: [] for s in STREAMS} for _ in cuts]
    for s in STREAMS:
        for r in records[s]:
            k = next(i for i, b in enumerate(bounds) if r[TIME[s]] <= b)
            if 0 < k < len(cuts) - 1 and rng.random() < late_share:
                k += 1
            parts[k][s].append(json.dumps(r))
    return parts


def _counts(deliveries: list[Any]) -> list[tuple[Any, ...]]:
    """delivery_counts' rows from deliveries rows, in plain Python: per group, status and second of store time,
    the rows and their retries and duplicates expected."""
    sums: dict[tuple[Any, ...], list[int]] = {}
    for r in deliveries:
        n = sums.setdefault((r["consumer_group"], r["status"], r["store_timestamp"] // 1000 * 1000), [0, 0, 0])
        n[0], n[1], n[2] = n[0] + 1, n[1] + r["retries"], n[2] + r["duplicates_expected"]
    return [(*key, *n) for key, n in sums.items()]


def _described(spark: SparkSession, first: int) -> list[str]:
    """What the Spark jobs from job id `first` on were doing, as the status store keeps it (the latest 1,000 jobs)."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    found = (jobs.apply(i) for i in range(jobs.size()))
    return [j.description().get() for j in found if j.jobId() >= first and j.description().isDefined()]


def _rows(spark: SparkSession, df: Any, names: tuple[str, ...]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.select(*names).collect()), key=repr)


def _as_found(rows: list[Any], before: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    """A full recompute's findings with the as_of the merge leaves them: a finding found again as it was
    (`before`, by anomaly_id) keeps the as_of of the run that found it so, unless that run was later."""
    at = ANOMALIES.names.index("as_of")
    found = {}
    for r in rows:
        row, prior = tuple(r[c] for c in ANOMALIES.names), before.get(r["anomaly_id"])
        if prior is not None and prior[:at] + prior[at + 1 :] == row[:at] + row[at + 1 :] and prior[at] <= row[at]:
            row = prior
        found[r["anomaly_id"]] = row
    return found


@pytest.fixture
def small_files(spark: SparkSession) -> Iterator[None]:
    """Files of a few rows each, so that every output has several: for the full run's layout to show, and for an
    OPTIMIZE to compact (a merge rewrites the files it touches, which in a table this small can leave one)."""
    key = "spark.sql.files.maxRecordsPerFile"
    before = spark.conf.get(key) or "0"  # 0: no limit, Spark's own default
    spark.conf.set(key, "25")
    yield
    spark.conf.set(key, before)


@pytest.mark.usefixtures("small_files")
def test_incremental_runs_equal_a_full_recompute_on_chaos(spark: SparkSession, config: Config, tmp_path: Path) -> None:
    source, landing = tmp_path / "source", tmp_path / "landing"
    make_landing(source, n=120, seed=7)
    # The messages are sent in the first seconds and the checks and the drain take minutes after: step 1 brings
    # some two thirds of them, step 2 the rest and checks, step 3 later checks and what arrived late.
    parts = _deliveries(source, cuts=[0.01, 0.7, 1.0], late_share=0.05, seed=7)
    cfg = fresh_db(spark, config, "t_incremental")
    rules = rules_from(cfg)
    outputs = (TXN_LIFECYCLE, OFFSET_COMMITS, ANOMALIES, DELIVERIES, DELIVERY_COUNTS, BROKER_WINDOWS)
    found: dict[str, tuple[Any, ...]] = {}
    for step, part in enumerate(parts, 1):
        for s, lines in part.items():
            (landing / s).mkdir(parents=True, exist_ok=True)
            (landing / s / f"part-{step}.jsonl").write_text("".join(line + "\n" for line in lines))
        ingest(spark, cfg, landing, f"step-{step}")
        # Step 2 reconciles as of a time before its latest event; step 3 must then pick the rest up. Steps 1 and 3
        # reconcile as of the latest event, as a service does: the run after step 1 reads only what bronze gained.
        bronze = read_bronze(spark, cfg)
        latest = max(r[0] for s in STREAMS for r in bronze.frames[s].agg({TIME[s]: "max"}).collect())
        first_job = jobs_started(spark)
        as_of = reconcile(spark, cfg, as_of=latest - 30_000 if step == 2 else None)
        assert as_of == (latest - 30_000 if step == 2 else latest)
        if step > 1:  # an incremental run merges its kept sources as they are, without Delta copying them first
            merges = [d for d in _described(spark, first_job) if "MERGE operation" in d]
            assert merges and not [d for d in merges if "materialize source" in d], merges
            assert spark.conf.get(MATERIALIZE, None) is None  # the session's setting is Delta's again
        expected = full_view(bronze.frames, as_of, rules)
        # The counts an incremental run adds up from the deliveries' changes equal those counted here, whole.
        expected[DELIVERY_COUNTS.name] = spark.createDataFrame(
            _counts(expected[DELIVERIES.name].collect()), to_struct(DELIVERY_COUNTS)
        )
        found = _as_found(expected[ANOMALIES.name].collect(), found)
        expected[ANOMALIES.name] = spark.createDataFrame(list(found.values()), to_struct(ANOMALIES))
        for schema in outputs:
            table = spark.table(cfg.table(schema.name))
            # An incremental run adds a row per broker and window its new events fall in: the totals are equal.
            got = _rows(spark, window_totals(table) if schema is BROKER_WINDOWS else table, schema.names)
            want = _rows(spark, expected[schema.name], schema.names)
            assert got == want, (step, schema.name, sorted(set(got) ^ set(want), key=repr)[:5])
        if step == 1:  # written whole in files of at most 25 rows (small_files), each a stretch of the order
            for schema, column in ((TXN_LIFECYCLE, "born_ts"), (DELIVERIES, "store_timestamp")):
                files = files_of(spark, cfg.table(schema.name), column)
                assert len(files) > 2 and all(f["n"] <= 25 for f in files), (schema.name, files)
                ordered = [f for f in files if f["first"] is not None]  # a lifecycle without halves: no born_ts
                assert all(a["last"] <= b["first"] for a, b in itertools.pairwise(ordered)), (schema.name, files)
        if step == 2:  # an operator compacts the outputs and sets a retention: step 3 builds on them all the same
            before = {s.name: version(spark, cfg, s.name) for s in outputs}
            for schema in outputs:
                spark.sql(f"OPTIMIZE {cfg.table(schema.name)}")
            compacted = [s.name for s in outputs if version(spark, cfg, s.name) > before[s.name]]
            assert "txn_lifecycle" in compacted, compacted  # in files of at most 25 rows (small_files)
            spark.sql(f"ALTER TABLE {cfg.table('anomalies')} SET TBLPROPERTIES ('delta.logRetentionDuration' = "
                      "'interval 60 days')")  # fmt: skip

    runs = spark.table(cfg.table("reconcile_runs")).orderBy("finished_at").collect()
    assert [r["mode"] for r in runs] == ["full", "incremental", "incremental"], [r["reason"] for r in runs]
    # What each run knew of bronze's latest event: nothing when its as_of was given.
    assert [r["events_until"] for r in runs] == [runs[0]["as_of"], None, runs[2]["as_of"]]
    # The last run left findings it found as they were untouched: their as_of is an earlier run's.
    assert {r["as_of"] for r in spark.table(cfg.table("anomalies")).collect()} > {runs[-1]["as_of"]}
    total = spark.table(cfg.table("txn_lifecycle")).count()
    assert all(0 < r["transactions"] < total for r in runs[1:])
    # While the groups wanted the same, deliveries were merged (their new rows appended), not rewritten: one
    # overwrite, the full run's. broker_windows too was written whole once, then added to.
    assert runs[1]["wants"] == runs[2]["wants"] == runs[0]["wants"] is not None
    for name in ("deliveries", "broker_windows"):
        history = sorted(spark.sql(f"DESCRIBE HISTORY {cfg.table(name)}").collect(), key=lambda h: h["version"])
        writes = [h["operationParameters"]["mode"] for h in history if h["operation"] == "WRITE"]
        assert writes[0] == "Overwrite" and writes.count("Overwrite") == 1 and "Append" in writes, (name, writes)
    stuck = spark.table(cfg.table("anomalies")).where("anomaly_type = 'STUCK_HALF'").count()
    assert stuck > 0 and len({r["anomaly_type"] for r in spark.table(cfg.table("anomalies")).collect()}) >= 4

    # A hand edit of an output table, then a change of rules: each forces a full run, which repairs the edit.
    spark.sql(f"DELETE FROM {cfg.table('anomalies')} WHERE anomaly_type = 'STUCK_HALF'")
    edited = version(spark, cfg, "anomalies")
    reconcile(spark, cfg)
    assert spark.table(cfg.table("anomalies")).where("anomaly_type = 'STUCK_HALF'").count() == stuck
    stricter = dataclasses.replace(cfg, thresholds=dataclasses.replace(cfg.thresholds, stuck_after_ms=30_000))
    reconcile(spark, stricter)
    runs = spark.table(cfg.table("reconcile_runs")).orderBy("finished_at").collect()
    assert [(r["mode"], r["reason"]) for r in runs[-2:]] == [
        ("full", f"anomalies is at version {edited}, the last run left it at {runs[-3]['anomalies_version']}"),
        ("full", "the rules changed since the last run"),
    ]


def test_a_lifecycle_merge_only_reaches_transactions_born_since_the_earliest_recomputed(spark: SparkSession) -> None:
    life = spark.createDataFrame([("a", None), ("b", 7), ("c", 3)], "uniq_key string, born_ts long")
    earliest = kept(life, F.min("born_ts").alias("born"))[1]["born"]  # as reconcile observes it
    assert born_since(earliest) == "t.born_ts IS NULL OR t.born_ts >= 3"
    none = kept(life.where("born_ts IS NULL"), F.min("born_ts").alias("born"))[1]["born"]
    assert born_since(none) == "t.born_ts IS NULL"  # no half seen: only such rows


@pytest.mark.usefixtures("small_files")
def test_an_upsert_rewrites_only_the_files_holding_rows_it_changes(spark: SparkSession, config: Config) -> None:
    """Stored rows are updated where they lie and new ones go to files of their own, so that the next upsert,
    which changes some of those new rows, leaves every older file as it was (a merge that also inserts wrote the
    rows of the files it rewrote and the new ones mixed, and each later one rewrote them all again). Offset
    commits in order of time, keyed by an offset out of that order, as a merge's join would order them."""
    cfg = fresh_db(spark, config, "t_upsert")
    table = create_table(spark, cfg, OFFSET_COMMITS)

    def commits(times: range, prev: int | None = None) -> DataFrame:
        marks = [t - 1 if prev is None else prev for t in times]  # prev_offset: which upsert wrote the row
        rows = [("b", "g", "t", 0, t * 919 % 1000, t, "c", t, m, "c", False) for t, m in zip(times, marks, strict=True)]
        return spark.createDataFrame(rows, to_struct(OFFSET_COMMITS))

    def files_before(ts: int) -> set[str]:
        return {f[0] for f in files_of(spark, table, "commit_timestamp") if f["first"] < ts}

    def write(recomputed: DataFrame) -> dict[str, Any]:  # as reconcile writes offset_commits
        changes = differing(recomputed, spark.table(table), COMMIT_KEY)
        changed, counts = kept(changes, *change_counts("commit_timestamp"))
        upsert(spark, cfg, OFFSET_COMMITS, changed, COMMIT_KEY, counts, lambda least: f"t.commit_timestamp >= {least}")
        return counts

    commits(range(100)).orderBy("commit_timestamp").write.insertInto(table)  # 4 files of 25 (small_files)
    untouched = files_before(75)
    counts = write(commits(range(98, 99)).union(commits(range(99, 110), prev=-1)))  # 98 as it was, 99 changes
    assert (counts["updated"], counts["added"], counts["earliest_updated"]) == (1, 10, 99)
    assert files_before(75) == untouched and len(untouched) == 3
    old = files_before(100)
    write(commits(range(105, 106), prev=-2))  # one of the new rows changes
    assert files_before(100) == old
    got = {r["commit_timestamp"]: r["prev_offset"] for r in spark.table(table).collect()}
    assert got == {t: -2 if t == 105 else -1 if t >= 99 else t - 1 for t in range(110)}
