"""`txn-recon serve`: one process and one Spark session for as long as it runs.

Every `serve.every_s` seconds a cycle collects (given name servers), ingests what is new, reconciles
incrementally, checks quality on what changed and redraws the dashboard, then appends one row to
`serve_cycles`; every `serve.compact_every_cycles` cycles it also joins the tables' small files. A cycle that
ingests nothing skips the rest but a compaction: nothing it would compute has changed. A step
that fails is one log line and a failed cycle; the next cycle tries again. Every step commits whole (a
landing file renamed into place, a Delta commit or two per table), so SIGTERM and SIGINT, taken between steps,
leave nothing half-written, and a restart after kill -9 goes on from what was committed. When the engine
itself fails (the JVM gone), the process ends with exit code 1 for its service manager to restart it.

While it runs it serves SQL (Spark's Thrift server, HiveServer2's protocol, on this session and catalog)
and HTTP (/metrics for Prometheus, /healthz, and the dashboard at /).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.utils import AnalysisException

from jobs import ingest, quality, reconcile, report
from jobs.catalog import add_new_fields, compact, create_table, tables_in
from jobs.collect import credentials
from jobs.config import Config, host_port
from jobs.errors import EngineError, TxnReconError, first_line
from jobs.jars import local_jars
from jobs.lock import folder_lock, warehouse_lock
from jobs.running import address_file
from jobs.runs import new_run_id
from jobs.session import OPTIMIZING_JIT, build_session, jobs_started, release_java_objects, with_jit
from jobs.signals import Stop, stop_on_signals
from jobs.story import story
from jobs.web import Health, Metrics, start_http
from schemas.reconciled import VIEWS
from schemas.service import SERVE_CYCLES, STEPS
from schemas.spark import to_struct
from sources.collector import Collector, write_runs
from sources.landing_files import LandingError, make_landing

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--landing", type=Path, help="the landing folder to watch (default: serve.landing)")
    parser.add_argument("--namesrv", metavar="HOST:PORT[;HOST:PORT]", help="collect this cluster each cycle")
    parser.add_argument("--every", type=int, metavar="SECONDS", help="from one cycle's start to the next one's")


@dataclass
class Cycle:
    """One cycle's accounting: seconds per step run, counts, and the first failure."""

    cycle_id: str
    started_at: dt.datetime
    seconds: dict[str, float] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)  # Spark jobs per step run
    inserted: int = 0
    quarantined: int = 0
    anomalies: dict[str, int] | None = None  # per type, as the report step read them
    quality_failed: int | None = None
    error: str | None = None
    figures: dict[str, Any] | None = None  # what the metrics show of the tables, read by the report step
    idle: bool = False
    stopped: bool = False
    finished_at: dt.datetime | None = None

    @property
    def status(self) -> str:
        return "failed" if self.error else "stopped" if self.stopped else "idle" if self.idle else "ok"

    def row(self) -> dict[str, Any]:
        return {
            "cycle_id": self.cycle_id, "started_at": self.started_at, "finished_at": self.finished_at,
            "status": self.status, **{f"{s}_s": self.seconds.get(s) for s in STEPS}, "inserted": self.inserted,
            "quarantined": self.quarantined,
            "anomalies": None if self.anomalies is None else sum(self.anomalies.values()),
            "quality_failed": self.quality_failed, "spark_jobs": sum(self.jobs.values()), "error": self.error,
        }  # fmt: skip


@dataclass
class Engine:
    """What every cycle works with: the session, the settings, the collector if any."""

    spark: SparkSession
    config: Config
    landing: Path
    collector: Collector | None
    stop: Stop
    cycles: int = 0
    caught_up: bool = False  # the last cycle ran every step: with nothing new, the next one may rest
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "report"))
    gathering: Future[tuple[dict[str, Any], float]] | None = None  # the dashboard's reconciled part, its seconds
    # The latest event time in bronze, reconcile's data time: found by the first reconcile, then raised by what
    # each ingest read (the figure ingest records per file, which reconcile would read back). Forgotten when a
    # cycle fails or stops, since ingest may have recorded files that the step did not return.
    latest_event: int | None = None

    def cycle(self) -> Cycle:
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        c = Cycle(new_run_id(now, "serve"), now)
        steps: list[tuple[str, Callable[[Cycle], None]]] = [
            ("collect", self.collect), ("ingest", self.ingest), ("reconcile", self.reconcile),
            ("quality", self.quality), ("report", self.report), ("compact", self.compact),
        ]  # fmt: skip
        for name, step in steps:
            if self.stop.is_set():
                c.stopped = True
                break
            if c.idle and name != "compact":  # a cycle with nothing new rests, or only compacts
                continue
            if (name == "collect" and self.collector is None) or (name == "compact" and not self.compaction_due()):
                continue
            log.info("cycle %d: %s", self.cycles + 1, name)
            started, jobs = time.perf_counter(), jobs_started(self.spark)
            try:
                step(c)
            except EngineError:
                raise
            except Exception as e:
                if not _engine_alive(self.spark):
                    raise EngineError(f"Spark failed in the {name} step ({first_line(e)})") from e
                c.error = f"{name}: {e if isinstance(e, (TxnReconError, LandingError)) else first_line(e)}"
                log.error("cycle %d: %s; the next cycle tries again", self.cycles + 1, c.error)
                break
            finally:
                c.seconds[name] = round(time.perf_counter() - started, 3)
                with contextlib.suppress(Exception):  # the JVM may be gone: the error says so
                    c.jobs[name] = jobs_started(self.spark) - jobs
        self.settle()
        if c.status in ("failed", "stopped"):
            self.latest_event = None
        if not c.idle:
            freeing = time.perf_counter()
            release_java_objects()
            c.seconds["gc"] = round(time.perf_counter() - freeing, 3)
        c.finished_at = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        self.cycles += 1
        self.caught_up = c.status in ("ok", "idle")
        return c

    def collect(self, c: Cycle) -> None:
        assert self.collector is not None
        run_id = new_run_id(dt.datetime.now(dt.UTC), "collect")
        with folder_lock(self.landing / "_collect", f"the collect state in {self.landing}", "serve",
                         name=".collect.lock"):  # fmt: skip
            runs = self.collector.run_pass(run_id)
            write_runs(self.collector.folder, run_id, runs)
        if runs and all(r.status == "failed" for r in runs):
            raise TxnReconError(f"collect read nothing: {runs[0].errors[0] if runs[0].errors else 'no broker'}")

    def ingest(self, c: Cycle) -> None:
        tallies = ingest.ingest_landing(self.spark, self.config, self.landing, c.cycle_id, c.started_at)
        c.inserted = sum(t.inserted for t in tallies.values())
        c.quarantined = sum(t.quarantined for t in tallies.values())
        # Nothing new after a whole cycle, nothing to redo: reconcile's default as_of is the latest event, so
        # its result stands. After a failure, a stop or a restart (kill -9 may have come after ingest) the
        # rest runs all the same.
        c.idle = self.caught_up and c.inserted == 0
        read = [t.events_until for t in tallies.values() if t.events_until is not None]
        if self.latest_event is not None:
            self.latest_event = max([self.latest_event, *read])

    def reconcile(self, c: Cycle) -> None:
        self.latest_event = reconcile.reconcile(self.spark, self.config, latest=self.latest_event)

    def quality(self, c: Cycle) -> None:
        # The dashboard's reconciled part does not read what quality writes: it is gathered meanwhile, in a
        # thread of its own, so the Spark jobs of both share the cores (most of a job is the driver's).
        self.gathering = self.pool.submit(_timed, report.gather_reconciled, self.spark, self.config)
        outcome = quality.check_quality(self.spark, self.config, c.cycle_id, c.started_at)
        c.quality_failed = len(outcome.failures)

    def report(self, c: Cycle) -> None:
        """The part of the dashboard quality left to do: waiting for the gathering, the quality results, the
        page. Its seconds are what the report added to the cycle beyond quality."""
        gathering, self.gathering = self.gathering, None
        assert gathering is not None
        reconciled, took = gathering.result()
        # Said apart: when the gathering outlasts quality, it is what the cycle waits for, not the page.
        log.info("  the dashboard's tables read in %.1f s, beside quality", took)
        c.figures, c.anomalies = reconciled["figures"], reconciled["anomaly_counts"]
        report.write_report(self.spark, self.config, reconciled=reconciled)

    def compaction_due(self) -> bool:
        every = self.config.serve.compact_every_cycles
        return every is not None and (self.cycles + 1) % every == 0

    def compact(self, c: Cycle) -> None:
        """Join the small files every table gathered over the last cycles (ingest's appends, reconcile's merges,
        a row per cycle in the run tables): a scan pays for each file, and a service adds some every cycle."""
        # Not reconcile's views: an OPTIMIZE of one fails, and Spark logs that failure with its stack trace.
        for name in sorted(tables_in(self.spark, self.config.database) - {v.name for v in VIEWS}):
            if self.stop.is_set():  # a stop waits for one table's compaction at most
                break
            try:
                removed, added = compact(self.spark, self.config.table(name))
            except AnalysisException as e:  # a table someone made beside ours, not a Delta one
                log.info("  %s: not compacted (%s)", name, first_line(e))
                continue
            if removed:
                log.info("  %s: %d small files joined into %d", name, removed, added)

    def settle(self) -> None:
        """Wait for a gathering the cycle left behind (quality failed or a stop came), so no cycle's Spark
        jobs overlap the next one's; what it gathered is dropped."""
        gathering, self.gathering = self.gathering, None
        if gathering is not None:
            with contextlib.suppress(Exception):
                gathering.result()


def _timed(work: Callable[..., dict[str, Any]], *args: Any) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    return work(*args), time.perf_counter() - started


def _engine_alive(spark: SparkSession) -> bool:
    try:
        return not spark.sparkContext._jsc.sc().isStopped()
    except Exception:  # the gateway or the JVM behind it is gone
        return False


def record(spark: SparkSession, config: Config, c: Cycle) -> None:
    """Append the cycle's row; a failure to is one line (the cycle's work is committed all the same)."""
    try:
        table = create_table(spark, config, SERVE_CYCLES)
        add_new_fields(spark, table, SERVE_CYCLES)  # a table an older version made lacks the newer steps' columns
        spark.createDataFrame([c.row()], to_struct(SERVE_CYCLES)).writeTo(table).append()
    except Exception as e:
        if not _engine_alive(spark):
            raise EngineError(f"Spark failed while recording a cycle ({first_line(e)})") from e
        log.error("cycle %s: could not record it in %s (%s)", c.cycle_id, SERVE_CYCLES.name, first_line(e))


# A cycle runs a few hundred queries, and Spark's status store keeps every one's plan and metrics (UI or
# not): the suite's own session ran out of heap with the default thousand. The latest few are enough.
STATUS_STORE = {
    "spark.sql.ui.retainedExecutions": "50",
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
}


# Spark keeps the classes it generates for its last 100 pieces of generated code, and a cycle generates well over
# a thousand, most as the last cycle did: with room for them, a cycle compiles only what differs (a literal, a
# new plan). A 1M cycle bringing 1,669 records compiled 429 classes instead of 1,573, in 86-89 s against 92-97 s.
CODEGEN = {"spark.sql.codegen.cache.maxEntries": "10000"}


# A cycle's data is what is new: a join Spark would broadcast by the size it estimates sorts both (small) sides
# in the job that needs them, where a broadcast is a Spark job of its own. The code still broadcasts where one
# side is a whole table. With the day's two other cuts (ingest's records, the touched queues), serve's cycle bringing
# the bench's tail to the warehouse of 1M (5 December 2026, a slow hour, in turn twice): 146 jobs in 116.5 and
# 129.1 s, against 161 in 129.2 and 132.5 s.
JOINS = {"spark.sql.autoBroadcastJoinThreshold": "-1"}


def long_running(config: Config) -> Config:
    """The session settings of a process that runs for months; the config's own values win, and the JVM's flags
    of the site's spark-defaults.conf (`with_jit`)."""
    return with_jit(config.with_spark_conf({**STATUS_STORE, **CODEGEN, **JOINS, **config.spark.conf}), OPTIMIZING_JIT)


def with_sql_server(config: Config, address: str) -> Config:
    """The settings the SQL server needs from the start: its address, which it reads from the session's
    Hadoop configuration (set once the session runs, it is not seen), and the Delta jars on the driver's
    class path, since its client sessions load the catalog class where `spark.jars` do not reach."""
    host, port = host_port(address)
    extra = {"spark.hadoop.hive.server2.thrift.bind.host": host, "spark.hadoop.hive.server2.thrift.port": str(port)}
    if config.spark.delta_jars == "local":
        extra["spark.driver.extraClassPath"] = os.pathsep.join(str(p) for p in local_jars(config.spark))
    return config.with_spark_conf({**config.spark.conf, **extra})


def start_sql_server(spark: SparkSession, address: str) -> Any:
    """Spark's Thrift server (HiveServer2's protocol) on this session: JDBC and ODBC clients see the tables
    as the cycles commit them. It asks for no password (hence loopback unless the config says otherwise)."""
    server_class = spark._jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2  # type: ignore[union-attr]
    try:
        return server_class.startWithContext(spark._jsparkSession.sqlContext())
    except Exception as e:  # the port taken, most often
        raise TxnReconError(f"serve.sql {address}: the SQL server cannot start ({first_line(e)})") from None


def run(args: argparse.Namespace, config: Config) -> int:
    settings = config.serve
    landing = args.landing or (Path(settings.landing) if settings.landing else None)
    if landing is None:
        raise TxnReconError("serve needs a landing folder: --landing DIR, or serve.landing in the config")
    namesrv = args.namesrv or settings.namesrv
    every = args.every if args.every is not None else settings.every_s
    if every <= 0:
        raise TxnReconError(f"--every {every}: expected a positive number of seconds")
    if namesrv and not all(a.strip().rpartition(":")[2].isdigit() for a in namesrv.split(";") if a.strip()):
        raise TxnReconError(f"--namesrv {namesrv!r}: expected HOST:PORT, several separated by ';'")
    if namesrv:
        make_landing(landing)
    elif not landing.is_dir():
        raise TxnReconError(f"--landing {landing} is not a folder (give --namesrv to collect into a new one)")
    with warehouse_lock(config, "serve"), stop_on_signals() as stop:
        session_config = long_running(config)
        spark = build_session(with_sql_server(session_config, settings.sql) if settings.sql else session_config)
        sql = start_sql_server(spark, settings.sql) if settings.sql else None
        health = Health(every, settings.stale_after_cycles, report.default_path(config))
        metrics = Metrics()
        http = start_http(settings.http, metrics, health, trace=lambda key: story(spark, session_config, key))
        if sql is not None:
            host, port = host_port(settings.sql or "")
            jdbc = f"jdbc:hive2://{host}:{port}/{config.database}"
            address_file(config).parent.mkdir(parents=True, exist_ok=True)
            address_file(config).write_text(json.dumps({"pid": os.getpid(), "sql": settings.sql, "jdbc": jdbc}))
            print(f"txn-recon serve: SQL on {jdbc}", flush=True)
        print(f"txn-recon serve: HTTP on http://{host_port(settings.http)[0]}:{http.server_address[1]}/ "
              "(/metrics, /healthz, /trace/<key>)", flush=True)  # fmt: skip
        collector = None
        if namesrv:
            collector = Collector(
                [a.strip() for a in namesrv.split(";") if a.strip()],
                landing,
                config.collect,
                credentials(config.collect),
                stop,
            )
        engine = Engine(spark, config, landing, collector, stop)
        try:
            while not stop.is_set():
                started = time.monotonic()
                c = engine.cycle()
                # Reading the tables for the metrics is part of what a cycle costs: timed and counted with it.
                jobs, read = jobs_started(spark), time.perf_counter()
                metrics.update(spark, config, c, c.figures)
                c.seconds["metrics"] = round(time.perf_counter() - read, 3)
                c.jobs["metrics"] = jobs_started(spark) - jobs
                record(spark, config, c)
                health.cycle_done(c.status != "failed")
                print(f"txn-recon serve: cycle {engine.cycles} {c.status}: inserted {c.inserted}"
                      + ("" if c.anomalies is None else f", {sum(c.anomalies.values())} findings")
                      + "".join(f", {k} {v:.1f} s" for k, v in c.seconds.items())
                      + (f", Spark jobs {sum(c.jobs.values())} ({', '.join(f'{k} {v}' for k, v in c.jobs.items())})"
                         if c.jobs else "")
                      + (f"; {c.error}" if c.error else ""), flush=True)  # fmt: skip
                stop.wait(max(every - (time.monotonic() - started), 0))
        finally:
            engine.pool.shutdown()
            http.shutdown()
            if sql is not None:
                address_file(config).unlink(missing_ok=True)
                with contextlib.suppress(Exception):  # the JVM may be gone: the error that ends the run says so
                    sql.stop()
    print(f"txn-recon serve: stopped by {stop.name} after {engine.cycles} cycle(s); every cycle is recorded",
          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
