"""`txn-recon run --landing DIR` (ingest, reconcile, quality, report) and `txn-recon demo` (simulate,
run, score): the main job. It ends by printing where the dashboard and the Data Docs are."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import shutil
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs import ingest, quality, reconcile, report, score, simulate
from jobs.catalog import tables_in
from jobs.config import Config
from jobs.errors import TxnReconError
from jobs.lock import warehouse_lock
from jobs.session import OPTIMIZING_JIT, build_session, with_jit

log = logging.getLogger(__name__)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--landing", type=Path, required=True, help="landing root with half/ op/ real/ offset/")
    parser.add_argument("--as-of", type=int, metavar="EPOCH_MS", help="data time (default: the latest event)")


def run_pipeline(args: argparse.Namespace, config: Config) -> int:
    code, where = pipeline(config, args.landing, args.as_of)
    print(where)
    return code


def pipeline(config: Config, landing: Path, as_of: int | None, fresh: bool = False) -> tuple[int, str]:
    """Ingest, reconcile, quality, report; return the exit code and where the dashboard and Data Docs are.
    `fresh`: first empty the database of what earlier runs of this landing folder left (`reset_for`)."""
    ingest.validate_landing(landing)
    now = dt.datetime.now(dt.UTC)
    run_id = ingest.new_run_id(now)
    with warehouse_lock(config, "run"):
        spark = build_session(with_jit(config, OPTIMIZING_JIT))
        if fresh:
            reset_for(spark, config, landing)
        log.info("[1/4] ingest")
        tallies = ingest.ingest_landing(spark, config, landing, run_id, now.replace(tzinfo=None))
        print(ingest.summary(run_id, tallies))
        log.info("[2/4] reconcile")
        reconcile.reconcile(spark, config, as_of)
        print(reconcile.summary(reconcile.anomaly_counts(spark, config)))
        log.info("[3/4] quality")
        checked = quality.check_quality(spark, config, ingest.new_run_id(now, "quality"), now.replace(tzinfo=None))
        print(quality.summary(checked))
        log.info("[4/4] report")
        dashboard = report.write_report(spark, config)
    code = quality.EXIT_BLOCKING if checked.blocking_failures else 0
    return code, f"dashboard: {dashboard}\nData Docs: {checked.docs}"


def reset_for(spark: SparkSession, config: Config, landing: Path) -> None:
    """Drop the database's tables and views when everything in them came from `landing` (a previous demo's
    simulation, which demo has just replaced: its records may differ, and demo scores what it simulated). A
    database that ingested anything else is left alone, and demo stops with one line."""
    database = config.database
    if not spark.catalog.databaseExists(database):
        return
    # Listed by name (SHOW TABLES, SHOW VIEWS): Catalog.listTables loads every Delta table it lists, 15 s for
    # the 21 of a demo's warehouse against 1 s.
    names = tables_in(spark, database)
    if not names:
        return
    inside = str(landing.resolve()) + os.sep
    if (
        "ingest_files" not in names
        or spark.table(config.table("ingest_files")).where(~F.col("path").startswith(inside)).limit(1).count()
    ):
        raise TxnReconError(f"database {database} in {config.warehouse} holds more than demo's simulations in "
                            f"{landing}; run demo with a warehouse of its own (--warehouse DIR)")  # fmt: skip
    views = {r["viewName"] for r in spark.sql(f"SHOW VIEWS IN {database}").collect() if not r["isTemporary"]}
    log.info("demo: the database holds an earlier simulation of %s; its %d tables are dropped", landing, len(names))
    for name in sorted(names):
        spark.sql(f"DROP {'VIEW' if name in views else 'TABLE'} {config.table(name)}")


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("landing/demo"), help="landing folder (recreated)")
    parser.add_argument("--transactions", type=int, default=100_000, help="transactions to simulate")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--profile", default="default", help="fault profile")


def demo(args: argparse.Namespace, config: Config) -> int:
    """Simulate, run the pipeline on the result, and score it against the model's truth."""
    out: Path = args.out
    if out.exists():  # replace only what a previous simulation wrote, never an arbitrary folder
        if not (out / "_truth" / "meta.json").is_file() and any(out.iterdir()):
            raise TxnReconError(f"--out {out} exists and is not a previous simulation; choose another folder")
        shutil.rmtree(out)
    log.info("demo: simulate")
    sim = argparse.Namespace(out=args.out, transactions=args.transactions, seed=args.seed, profile=args.profile,
                             format="jsonl", rate=None, records_per_file=250_000, benchmark=False)  # fmt: skip
    simulate.run(sim, config)
    ran, where = pipeline(config, args.out, None, fresh=True)
    log.info("demo: score against %s", args.out / "_truth")
    scored = score.run(argparse.Namespace(truth=args.out), config)
    print(where)
    return ran or scored


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["run", *sys.argv[1:]]))
