"""`txn-recon reconcile [--as-of EPOCH_MS]`: bronze into txn_lifecycle and offset_commits (silver) and
the anomalies (gold), as of one data time (DESIGN §2).

`as_of` is the argument, else the largest store/commit timestamp in bronze: wall-clock time never
enters a result, so a rerun on the same tables gives the same output. Silver tables are replaced;
anomalies are merged by anomaly_id, so a finding that no longer holds leaves the current view (Delta
history keeps it) and an unchanged one is not rewritten.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.catalog import create_table
from jobs.config import Config
from jobs.errors import TxnReconError
from jobs.lock import warehouse_lock
from jobs.session import build_session
from schemas.bronze import BRONZE
from schemas.reconciled import ANOMALIES, OFFSET_COMMITS, TXN_LIFECYCLE
from transforms.anomalies import all_anomalies, offset_commits
from transforms.frames import union_all
from transforms.lifecycle import (
    Rules,
    commits,
    discards,
    lifecycle,
    resolved_offsets,
    transactions,
    up_to,
    with_resolution,
)

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--as-of", type=int, metavar="EPOCH_MS", help="data time (default: the latest event)")


def run(args: argparse.Namespace, config: Config) -> int:
    with warehouse_lock(config, "reconcile"):
        spark = build_session(config)
        counts = reconcile(spark, config, args.as_of)
    print(summary(counts))
    return 0


def rules_from(config: Config) -> Rules:
    fields = {f.name for f in dataclasses.fields(Rules)}
    settings = dataclasses.asdict(config.broker) | dataclasses.asdict(config.thresholds)
    return Rules(**{k: v for k, v in settings.items() if k in fields})


def reconcile(spark: SparkSession, config: Config, as_of: int | None = None) -> dict[str, int]:
    """Compute and write silver and gold; return the anomaly count per type in the current view."""
    tables = {s: config.table(b.name) for s, b in BRONZE.items()}
    missing = [t for t in tables.values() if not spark.catalog.tableExists(t)]
    if missing:
        raise TxnReconError(f"no bronze tables yet ({', '.join(missing)}); run `txn-recon ingest` first")
    bronze = {s: spark.table(t) for s, t in tables.items()}
    if as_of is None:
        as_of = latest_event(bronze)
        if as_of is None:
            raise TxnReconError("bronze holds no events yet; nothing to reconcile")
    rules = rules_from(config)
    started = time.perf_counter()
    log.info("reconcile as of %d", as_of)
    half, op, real, offset = (
        bronze["half"].transform(up_to(as_of, "store_timestamp")),
        bronze["op"].transform(up_to(as_of, "store_timestamp")),
        bronze["real"].transform(up_to(as_of, "store_timestamp")),
        bronze["offset"].transform(up_to(as_of, "commit_timestamp")),
    )
    copies = half.transform(with_resolution(resolved_offsets(op)))
    life = transactions(copies).transform(lifecycle(commits(real), discards(real), as_of, rules)).persist()
    commits_df = offset.transform(offset_commits(as_of)).persist()
    try:
        _replace(spark, config, TXN_LIFECYCLE.name, life)
        log.info("  txn_lifecycle written (%.1f s)", time.perf_counter() - started)
        _replace(spark, config, OFFSET_COMMITS.name, commits_df)
        log.info("  offset_commits written (%.1f s)", time.perf_counter() - started)
        merge_anomalies(spark, config, all_anomalies(life, commits_df, real, as_of, rules))
        log.info("  anomalies merged (%.1f s)", time.perf_counter() - started)
    finally:
        life.unpersist()
        commits_df.unpersist()
    found = spark.table(config.table(ANOMALIES.name)).groupBy("anomaly_type").count().collect()
    return {r["anomaly_type"]: r["count"] for r in found}


def latest_event(bronze: dict[str, DataFrame]) -> int | None:
    """The default as_of: the largest store_timestamp / commit_timestamp in bronze."""
    parts = [bronze[s].agg(F.max("store_timestamp").alias("t")) for s in ("half", "op", "real")]
    parts.append(bronze["offset"].agg(F.max("commit_timestamp").alias("t")))
    value = union_all(parts).agg(F.max("t")).collect()[0][0]
    return int(value) if value is not None else None


def _replace(spark: SparkSession, config: Config, name: str, df: DataFrame) -> None:
    """Replace a silver table's rows (INSERT OVERWRITE keeps its definition; history keeps the past)."""
    schema = {"txn_lifecycle": TXN_LIFECYCLE, "offset_commits": OFFSET_COMMITS}[name]
    create_table(spark, config, schema)
    df.select(*schema.names).write.insertInto(config.table(name), overwrite=True)


def merge_anomalies(spark: SparkSession, config: Config, found: DataFrame) -> None:
    """Upsert by anomaly_id; delete what no longer holds; leave unchanged rows untouched."""
    create_table(spark, config, ANOMALIES)
    changed = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in ANOMALIES.names[1:])
    (
        DeltaTable.forName(spark, config.table(ANOMALIES.name)).alias("t")
        .merge(found.alias("s"), "t.anomaly_id = s.anomaly_id")
        .whenMatchedUpdateAll(condition=changed)
        .whenNotMatchedInsertAll()
        .whenNotMatchedBySourceDelete()
        .execute()
    )  # fmt: skip


def summary(counts: dict[str, int]) -> str:
    if not counts:
        return "reconcile: no anomalies"
    width = max(len(k) for k in counts)
    return "\n".join(["reconcile: anomalies by type", *(f"  {k:<{width}}  {v:>8}" for k, v in sorted(counts.items()))])


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["reconcile", *sys.argv[1:]]))
