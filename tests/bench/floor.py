"""What Spark and Delta cost on this machine before any rule of ours runs: the floors `make bench` prints
next to the targets of issue 25, and `make bench-serve` next to issue 24's. Each is one process, timed by
the benchmark like a job.

  python -m tests.bench.floor copy LANDING WAREHOUSE
      the landing's Parquet copied into plain Delta tables (no check, no hash, no dedup), then one row per
      transaction from its half and real events (first and last time, count) written to a Delta table:
      less than any ingest and full reconcile that write Delta, in one process where we run two.
  python -m tests.bench.floor append WAREHOUSE TRANSACTIONS QUEUES
      on a reconciled warehouse, the least an incremental reconcile writes: the tables' snapshots loaded,
      then as plain appends (cheaper than any merge) TRANSACTIONS lifecycle rows, every commit of QUEUES
      queues, 25 findings and one run row. No rule runs, no row is matched.
  python -m tests.bench.floor cycle WAREHOUSE
      on a warehouse a serve cycle has just brought new events to, what such a cycle must still do by Delta
      alone, with the same rows: the bronze rows the last reconcile run took in looked up by key (within
      the keys' ranges) and appended, the recomputed transactions' half and real events looked up, the
      rows it wrote to the outputs merged into them by key (two at a time, the fastest way measured),
      one row appended to each run table, and every change set read into pandas as quality reads it. No
      rule, no expectation, no dashboard. Run twice in one session, counted the second time: serve's
      measured cycle is warm too. Then once more with the outputs' rows appended instead of merged, as a
      design of append-only outputs (read through views that pick each key's latest row) would write
      them, its seconds on a line of its own: "floor done, outputs appended (S s)".

Each prints one line per step and a last line "floor done (S s; not counted U s)": the seconds counted
after the session started, and those it spent reading what it writes, which the benchmark takes off the
process's wall time too. `cycle` also prints the Spark jobs of its counted pass, "floor Spark jobs J" (and
"floor Spark jobs, outputs appended J"): what the cycle's target in jobs compares with.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.catalog import table_version
from jobs.config import Config, load_config
from jobs.reconcile import OUTPUTS
from jobs.session import OPTIMIZING_JIT, QUICK_JIT, build_session, jobs_started, with_jit
from schemas.bronze import BRONZE, INGEST_FILES, INGEST_RUNS
from schemas.quality import DQ_RESULTS, QUALITY_RUNS
from schemas.reconciled import ANOMALIES, OFFSET_COMMITS, RECONCILE_RUNS, TXN_LIFECYCLE
from schemas.service import SERVE_CYCLES
from transforms.anomalies import OFFSET_KEY
from transforms.frames import ranges, within
from transforms.lifecycle import ID

STREAMS = ("half", "op", "real", "offset")
RUN_TABLES = (INGEST_FILES, INGEST_RUNS, RECONCILE_RUNS, DQ_RESULTS, QUALITY_RUNS, SERVE_CYCLES)


class Clock:
    def __init__(self) -> None:
        self.last, self.counted, self.skipped = time.perf_counter(), 0.0, 0.0

    def step(self, what: str, counted: bool = True) -> None:
        now = time.perf_counter()
        print(f"{what}: {now - self.last:.2f} s" + ("" if counted else " (not counted)"), file=sys.stderr, flush=True)
        if counted:
            self.counted += now - self.last
        else:
            self.skipped += now - self.last
        self.last = now

    def done(self) -> None:
        print(f"floor done ({self.counted:.1f} s; not counted {self.skipped:.1f} s)", file=sys.stderr, flush=True)


def copy(landing: Path, warehouse: str) -> None:
    # With the JVM settings of the jobs it is the floor of (jobs.session), as is `append`.
    spark, clock = build_session(with_jit(load_config(overrides={"warehouse": warehouse}), OPTIMIZING_JIT)), Clock()
    for stream in STREAMS:
        spark.read.parquet(str(landing / stream)).write.format("delta").saveAsTable(f"copy_{stream}")
        clock.step(f"{stream} copied")
    events = [spark.table(f"copy_{s}").select(*ID, "store_timestamp") for s in ("half", "real")]
    per_transaction = (
        events[0]
        .unionByName(events[1])
        .groupBy(*ID)
        .agg(
            F.min("store_timestamp").alias("first_ts"),
            F.max("store_timestamp").alias("last_ts"),
            F.count("*").alias("n"),
        )
    )
    per_transaction.write.format("delta").saveAsTable("copy_lifecycle")
    clock.step("one row per transaction written")
    clock.done()


def append(warehouse: str, transactions: int, queues: int) -> None:
    config = load_config(overrides={"warehouse": warehouse})
    spark, clock = build_session(with_jit(config, QUICK_JIT)), Clock()
    names = {s: config.table(s.name) for s in (TXN_LIFECYCLE, OFFSET_COMMITS, ANOMALIES, RECONCILE_RUNS)}
    for table in [*names.values(), *(config.table(b.name) for b in BRONZE.values())]:
        DeltaTable.forName(spark, table).toDF()  # the snapshot every run loads first
    clock.step("table snapshots loaded")
    commits = spark.table(names[OFFSET_COMMITS])
    rows = {
        TXN_LIFECYCLE: spark.table(names[TXN_LIFECYCLE]).orderBy(F.desc("born_ts")).limit(transactions),
        OFFSET_COMMITS: commits.join(commits.select(*OFFSET_KEY).distinct().limit(queues), OFFSET_KEY, "left_semi"),
        ANOMALIES: spark.table(names[ANOMALIES]).limit(25),
        RECONCILE_RUNS: spark.table(names[RECONCILE_RUNS]).limit(1),
    }
    rows = {schema: df.localCheckpoint() for schema, df in rows.items()}
    clock.step("rows to write read", counted=False)  # a run computes its rows; only writing them is counted
    for schema, df in rows.items():
        df.write.format("delta").mode("append").saveAsTable(names[schema])
        clock.step(f"{schema.name} appended")
    clock.done()


def cycle(warehouse: str) -> None:
    config = load_config(overrides={"warehouse": warehouse})
    spark, clock = build_session(config), Clock()
    runs = spark.table(config.table(RECONCILE_RUNS.name)).orderBy(F.desc("finished_at")).limit(2).collect()
    last, before = runs[0], runs[1]
    tables = [(BRONZE[s], f"{s}_version") for s in STREAMS] + [(o, f"{o.name}_version") for o in OUTPUTS]
    changed = {  # the tables the run changed: table -> (key, rows); offset_commits has no natural key, and
        # reconcile merges it on its first eight columns
        config.table(t.name): (list(t.key or t.names[:8]), _changed(spark, config.table(t.name), before[v], last[v]))
        for t, v in tables
        if last[v] > before[v]
    }
    bronze = {config.table(BRONZE[s].name) for s in STREAMS}
    new = {t: rows for t, rows in changed.items() if t in bronze}
    out = {t: rows for t, rows in changed.items() if t not in bronze}
    lifecycle = out.get(config.table(TXN_LIFECYCLE.name))
    recomputed = lifecycle[1].select(*ID).localCheckpoint() if lifecycle else None
    run_rows = {config.table(r.name): spark.table(config.table(r.name)).limit(1).localCheckpoint() for r in RUN_TABLES}
    # The new rows' key ranges come with reading them, as ingest observes them while it keeps the batch's keys.
    bounds = {table: ranges(rows, key) for table, (key, rows) in new.items()}
    clock.step("rows to write read", counted=False)
    _cycle(spark, config, new, bounds, out, recomputed, run_rows, lambda _: None)
    clock.step("warm-up pass", counted=False)
    jobs = jobs_started(spark)
    _cycle(spark, config, new, bounds, out, recomputed, run_rows, clock.step)
    jobs = jobs_started(spark) - jobs
    clock.done()
    print(f"floor Spark jobs {jobs}", file=sys.stderr, flush=True)
    appended, jobs = Clock(), jobs_started(spark)
    _cycle(spark, config, new, bounds, out, recomputed, run_rows, appended.step, merged=False)
    print(f"floor done, outputs appended ({appended.counted:.1f} s)", file=sys.stderr, flush=True)
    print(f"floor Spark jobs, outputs appended {jobs_started(spark) - jobs}", file=sys.stderr, flush=True)


Rows = dict[str, tuple[list[str], DataFrame]]  # table -> (its key, rows)


def _changed(spark: SparkSession, table: str, since: int, until: int) -> DataFrame:
    """The rows that versions since+1..until of `table` inserted or rewrote, kept by the executors."""
    rows = _read_changes(spark, table, since, until).where("_change_type IN ('insert', 'update_postimage')")
    return rows.drop("_change_type", "_commit_version", "_commit_timestamp").localCheckpoint()


def _cycle(
    spark: SparkSession, config: Config, new: Rows, bounds: dict[str, dict[str, tuple[Any, Any]]], out: Rows,
    recomputed: DataFrame | None, run_rows: dict[str, DataFrame], step: Callable[[str], None], merged: bool = True,
) -> None:  # fmt: skip
    written = {t: table_version(spark, t) for t in [*new, *out]}
    step("table versions read")
    for table, (key, rows) in new.items():  # looked up within the keys' ranges, as ingest does
        within(spark.table(table), bounds[table]).join(rows.select(*key), key, "left_semi").count()
        rows.write.insertInto(table)
    step("new bronze rows looked up by key and appended")
    for table in new:
        _read_changes(spark, table, written[table]).count()
    step("bronze change feeds read")
    for stream in ("half", "real"):
        if recomputed is not None:
            spark.table(config.table(BRONZE[stream].name)).join(recomputed, ID, "left_semi").count()
    step("recomputed transactions' half and real events looked up")

    def merge(table: str) -> None:
        key, rows = out[table]
        on = " AND ".join(f"t.{c} <=> s.{c}" for c in key)
        target = DeltaTable.forName(spark, table).alias("t")
        target.merge(rows.alias("s"), on).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()

    if merged:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(merge, out))
    else:
        for table, (_, rows) in out.items():
            rows.write.insertInto(table)
    step("outputs merged" if merged else "outputs appended")
    for table, df in run_rows.items():
        df.write.insertInto(table)
    step("run rows appended")
    for table in [*new, *out]:
        _read_changes(spark, table, written[table]).toPandas()
    step("change sets read into pandas")


def _read_changes(spark: SparkSession, table: str, since: int, until: int | None = None) -> DataFrame:
    """The change feed of `table` after version `since` (up to `until`, else to the latest)."""
    reader = spark.read.option("readChangeFeed", "true").option("startingVersion", since + 1)
    return (reader if until is None else reader.option("endingVersion", until)).table(table)


if __name__ == "__main__":
    if sys.argv[1] == "copy":
        copy(Path(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "cycle":
        cycle(sys.argv[2])
    else:
        append(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
