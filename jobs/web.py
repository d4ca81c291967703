"""What `txn-recon serve` shows over HTTP: /metrics in Prometheus' text format, /healthz, the latest
dashboard at /, and the manual at /docs/. The figures come from each cycle's own reads of the tables (most
from the dashboard's gathering), so a scrape costs no Spark work."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.catalog import table_exists
from jobs.config import CONF_DIR, Config, host_port
from jobs.errors import TxnReconError
from jobs.story import page
from schemas.quality import DELIVERY_STATUSES

if TYPE_CHECKING:
    from jobs.serve import Cycle

log = logging.getLogger(__name__)


class Metrics:
    """The gauges an operator alerts on, refreshed from the tables after each cycle."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.findings = Gauge("txn_recon_findings", "Findings in the anomalies table, by type and consumer group "
                              "(group empty: a transaction's)", ["type", "group"], registry=r)  # fmt: skip
        self.undelivered = Gauge("txn_recon_undelivered_messages", "Messages a group wanted that its committed "
                                 "offset passed while a tag filter refused them (UNDELIVERED)", ["group"],
                                 registry=r)  # fmt: skip
        self.undelivered_at_most = Gauge("txn_recon_undelivered_messages_at_most", "Messages a group wanted that "
                                         "its committed offset passed while a tag filter that may have applied "
                                         "refused them (UNDELIVERED at_most)", ["group"], registry=r)  # fmt: skip
        self.deliveries = Gauge("txn_recon_deliveries", "Messages each group wants, by what became of them "
                                "(the deliveries table)", ["group", "status"], registry=r)  # fmt: skip
        self.oldest_pending = Gauge("txn_recon_oldest_pending_delivery_seconds", "Age at the data time of the "
                                    "oldest message a group wants and has not consumed", ["group"],
                                    registry=r)  # fmt: skip
        self.stuck = Gauge("txn_recon_pending_transactions", "Transactions still pending at the data time, at least "
                           "this old", ["older_than"], registry=r)  # fmt: skip
        self.check_backlog = Gauge("txn_recon_check_backlog", "Half messages the broker's check service has not "
                                   "passed, at the last collect", ["broker"], registry=r)  # fmt: skip
        self.op_backlog = Gauge("txn_recon_op_backlog", "Op messages the broker's check service has not read, at "
                                "the last collect", ["broker"], registry=r)  # fmt: skip
        self.op_lag = Gauge("txn_recon_op_lag_seconds", "From a transaction's first commit to the op that "
                            "resolved it, over the committed and resolved ones", ["quantile"], registry=r)  # fmt: skip
        self.topic_missing = Gauge("txn_recon_topic_missing_brokers", "Live masters that lack a topic the rest of "
                                   "their cluster serves, or cannot take its writes (TOPIC_NOT_ON_BROKER going on)",
                                   ["cluster", "topic"], registry=r)  # fmt: skip
        self.idle = Gauge("txn_recon_broker_without_writes", "1 while a live master stores nothing the rest of "
                          "its cluster would (BROKER_WITHOUT_WRITES going on)", ["cluster", "broker"],
                          registry=r)  # fmt: skip
        self.broker_writes = Gauge("txn_recon_broker_writes", "Messages producers stored on each broker (original "
                                   "halves and business messages) in the last window of thresholds.idle_window_ms "
                                   "that ended by the data time", ["broker"], registry=r)  # fmt: skip
        self.discards = Gauge("txn_recon_discards", "Transactions discarded after the maximum checks, by the cause "
                              "their producer group's message trace gives (untraced: none)", ["cause"],
                              registry=r)  # fmt: skip
        self.consume_latency = Gauge("txn_recon_consume_latency_seconds", "From a message's store time to its "
                                     "group's first traced consumption attempt, over the last hour of trace",
                                     ["group", "quantile"], registry=r)  # fmt: skip
        self.duplicates_missed = Gauge("txn_recon_traced_duplicates_unpredicted", "Messages a group consumed twice "
                                       "(traced) that the offset-based estimates did not predict", ["group"],
                                       registry=r)  # fmt: skip
        self.as_of = Gauge("txn_recon_data_time_seconds", "The data time of the last reconcile", registry=r)
        self.step_seconds = Gauge("txn_recon_last_cycle_step_seconds", "Seconds each step of the last cycle took",
                                  ["step"], registry=r)  # fmt: skip
        self.step_jobs = Gauge("txn_recon_last_cycle_step_spark_jobs", "Spark jobs each step of the last cycle ran",
                               ["step"], registry=r)  # fmt: skip
        self.last_ok = Gauge("txn_recon_last_cycle_ok", "1 if the last cycle did not fail", registry=r)
        self.last_end = Gauge("txn_recon_last_cycle_timestamp_seconds", "When the last cycle ended", registry=r)
        self.good_end = Gauge("txn_recon_last_good_cycle_timestamp_seconds", "When the last cycle that did not "
                              "fail ended", registry=r)  # fmt: skip
        self.cycles = Counter("txn_recon_cycles", "Cycles run since the start, by status", ["status"], registry=r)

    def update(self, spark: SparkSession, config: Config, cycle: Cycle, figures: dict[str, Any] | None) -> None:
        """The cycle's own figures, and those the dashboard's gathering read from the tables (`figures`, from
        `jobs.report.gather_reconciled`); a cycle that drew no dashboard leaves the table figures as they were."""
        now = time.time()
        self.cycles.labels(cycle.status).inc()
        self.last_end.set(now)
        self.last_ok.set(0 if cycle.status == "failed" else 1)
        if cycle.status != "failed":
            self.good_end.set(now)
        self.step_seconds.clear()
        for step, seconds in cycle.seconds.items():
            self.step_seconds.labels(step).set(seconds)
        self.step_jobs.clear()
        for step, jobs in cycle.jobs.items():
            self.step_jobs.labels(step).set(jobs)
        if figures is not None:
            try:
                self._show(figures)
                self._read_tables(spark, config)
            except Exception as e:  # a scrape shows the last figures; the next cycle reads them again
                log.warning("metrics: could not read the tables (%s)", e)

    def _show(self, figures: dict[str, Any]) -> None:
        self.findings.clear()
        self.undelivered.clear()
        self.undelivered_at_most.clear()
        for r in figures["findings"]:
            self.findings.labels(r["anomaly_type"], r["consumer_group"] or "").set(r["count"])
            if r["messages"] is not None:
                self.undelivered.labels(r["consumer_group"]).set(r["messages"])
                self.undelivered_at_most.labels(r["consumer_group"]).set(r["at_most"])
        self.as_of.set(figures["as_of"] / 1000)
        trace = figures["trace"]
        self.discards.clear()
        for r in trace["discard_causes"]:
            self.discards.labels(r["cause"]).set(r["discards"])
        self.consume_latency.clear()
        self.duplicates_missed.clear()
        for r in trace["groups"]:
            self.duplicates_missed.labels(r["consumer_group"]).set(r["missed"])
            for quantile in ("p50", "p99"):
                if r[f"latency_{quantile}_s"] is not None:
                    self.consume_latency.labels(r["consumer_group"], quantile).set(r[f"latency_{quantile}_s"])
        self.op_lag.clear()
        for quantile, seconds in figures["op_lag_seconds"].items():
            self.op_lag.labels(quantile).set(seconds)
        for label, n in figures["pending"].items():
            self.stuck.labels(label).set(n)
        self.deliveries.clear()
        self.oldest_pending.clear()
        for r in figures["deliveries"]:
            for status in DELIVERY_STATUSES:
                if r[status.lower()]:
                    self.deliveries.labels(r["consumer_group"], status).set(r[status.lower()])
            if r["oldest_pending_ms"] is not None:
                self.oldest_pending.labels(r["consumer_group"]).set(r["oldest_pending_ms"] / 1000)
        self.topic_missing.clear()
        self.idle.clear()
        self.broker_writes.clear()
        missing: dict[tuple[str, str], int] = {}
        for r in figures["ongoing"]:
            if r["anomaly_type"] == "TOPIC_NOT_ON_BROKER":
                missing[(r["cluster"], r["topic"])] = missing.get((r["cluster"], r["topic"]), 0) + 1
            else:
                self.idle.labels(r["cluster"], r["broker_name"]).set(1)
                self.broker_writes.labels(r["broker_name"]).set(0)  # it stored nothing: a series at zero, not none
        for (cluster, topic), n in missing.items():
            self.topic_missing.labels(cluster, topic).set(n)
        for r in figures["last_window"]:
            self.broker_writes.labels(r["broker_name"]).set(r["messages"])

    def _read_tables(self, spark: SparkSession, config: Config) -> None:
        """What the dashboard does not gather: the check service's backlogs at the last collect."""
        if table_exists(spark, config.table("collect_runs")):
            latest = (spark.table(config.table("collect_runs")).where("broker_name IS NOT NULL")
                      .groupBy("broker_name").agg(F.max_by(F.struct("check_backlog", "op_backlog"), "started_at")
                                                  .alias("b")).collect())  # fmt: skip
            self.check_backlog.clear()
            self.op_backlog.clear()
            for r in latest:
                if r["b"]["check_backlog"] is not None:
                    self.check_backlog.labels(r["broker_name"]).set(r["b"]["check_backlog"])
                if r["b"]["op_backlog"] is not None:
                    self.op_backlog.labels(r["broker_name"]).set(r["b"]["op_backlog"])


@dataclass
class Health:
    """Healthy while the last good cycle ended less than `stale_after_cycles` intervals ago."""

    every_s: int
    stale_after_cycles: int
    dashboard: Path
    started: float = 0.0
    last_good: float | None = None

    def __post_init__(self) -> None:
        self.started = time.time()

    def cycle_done(self, ok: bool) -> None:
        if ok:
            self.last_good = time.time()

    def check(self) -> tuple[bool, str]:
        limit = self.every_s * self.stale_after_cycles
        if self.last_good is None:
            waited = time.time() - self.started
            return waited <= limit, f"no good cycle yet ({waited:.0f} s since the start)"
        age = time.time() - self.last_good
        return age <= limit, f"last good cycle {age:.0f} s ago (limit {limit} s)"


# The manual, as `make docs` builds it beside conf/: alert runbooks and the dashboard link to its pages.
SITE = CONF_DIR.parent / "site"
SITE_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css", ".js": "text/javascript",
              ".svg": "image/svg+xml", ".png": "image/png", ".json": "application/json", ".xml": "application/xml",
              ".woff2": "font/woff2"}  # fmt: skip


def site_file(site: Path, path: str) -> Path | None:
    """The file of the built site a /docs/ path names (a folder: its index.html), never one outside it."""
    target = (site / unquote(path).lstrip("/")).resolve()
    if target.is_dir():
        target = target / "index.html"
    inside = target.is_relative_to(site.resolve())
    return target if inside and target.is_file() else None


def start_http(address: str, metrics: Metrics, health: Health, site: Path = SITE,
               trace: Callable[[str], list[dict[str, Any]]] | None = None) -> ThreadingHTTPServer:  # fmt: skip
    """Serve /metrics, /healthz, / (the dashboard), /docs/ (the manual) and, given `trace` (`jobs.story`),
    /trace/<key> (a page; with ?format=json, JSON) from a thread of this process; `shutdown()` ends it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path.startswith("/trace/") and trace is not None:
                self._trace(unquote(path.removeprefix("/trace/")), "format=json" in query.split("&"))
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(metrics.registry))
            elif path == "/healthz":
                ok, why = health.check()
                self._send(200 if ok else 503, "text/plain; charset=utf-8", f"{'ok' if ok else 'stale'}: {why}\n")
            elif path in ("/", "/dashboard.html"):
                try:
                    self._send(200, "text/html; charset=utf-8", health.dashboard.read_bytes())
                except FileNotFoundError:
                    self._send(503, "text/plain; charset=utf-8", "no dashboard yet: the first cycle draws it\n")
            elif path == "/docs" or path.startswith("/docs/"):
                found = site_file(site, path.removeprefix("/docs"))
                if found is None:
                    hint = "" if site.is_dir() else f" (the manual is not built: run `make docs` to write {site})"
                    self._send(404, "text/plain; charset=utf-8", f"not found in the manual{hint}\n")
                else:
                    self._send(200, SITE_TYPES.get(found.suffix, "application/octet-stream"), found.read_bytes())
            else:
                self._send(404, "text/plain; charset=utf-8", "not found: try /, /docs/, /metrics or /healthz\n")

        def _trace(self, key: str, as_json: bool) -> None:
            assert trace is not None
            try:
                events = trace(key)
            except TxnReconError as e:
                self._send(404, "text/plain; charset=utf-8", f"{e}\n")
                return
            if as_json:
                self._send(200, "application/json", json.dumps(events))
            else:
                self._send(200, "text/html; charset=utf-8", page(key, events))

        def _send(self, code: int, kind: str, body: bytes | str) -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    host, port = host_port(address)
    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as e:
        raise TxnReconError(f"serve.http {address}: cannot listen ({e.strerror})") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="txn-recon-http", daemon=True).start()
    return server
