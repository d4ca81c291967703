"""What Spark and Delta cost on this machine before any rule of ours runs: the floors `make bench` prints
next to the targets of issue 25. Each is one process, timed by the benchmark like a job.

  python -m tests.bench.floor copy LANDING WAREHOUSE
      the landing's Parquet copied into plain Delta tables (no check, no hash, no dedup), then one row per
      transaction from its half and real events (first and last time, count) written to a Delta table:
      less than any ingest and full reconcile that write Delta, in one process where we run two.
  python -m tests.bench.floor append WAREHOUSE TRANSACTIONS QUEUES
      on a reconciled warehouse, the least an incremental reconcile writes: the tables' snapshots loaded,
      then as plain appends (cheaper than any merge) TRANSACTIONS lifecycle rows, every commit of QUEUES
      queues, 25 findings and one run row. No rule runs, no row is matched.

Each prints one line per step and a last line "floor done (S s; not counted U s)": the seconds counted
after the session started, and those it spent reading what it writes, which the benchmark takes off the
process's wall time too.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from jobs.config import load_config
from jobs.session import build_session
from schemas.bronze import BRONZE
from schemas.reconciled import ANOMALIES, OFFSET_COMMITS, RECONCILE_RUNS, TXN_LIFECYCLE
from transforms.anomalies import OFFSET_KEY
from transforms.lifecycle import ID

STREAMS = ("half", "op", "real", "offset")


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
    spark, clock = build_session(load_config(overrides={"warehouse": warehouse})), Clock()
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
    spark, clock = build_session(config), Clock()
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


if __name__ == "__main__":
    if sys.argv[1] == "copy":
        copy(Path(sys.argv[2]), sys.argv[3])
    else:
        append(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
