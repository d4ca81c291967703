"""`txn-recon serve` run the way a service manager runs it: one process, cycles over a landing folder that
grows (each file archived once ingested), SQL over JDBC (Hive's beeline, from the jars pyspark ships) while
a cycle writes, metrics and health over HTTP, compaction every second cycle, kill -9 in the middle of a
cycle and a restart, and a clean stop on SIGTERM. The tables it ends with are scored against the model's
truth, as one clean run's are."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.sql import SparkSession

from jobs.config import Config, load_config
from jobs.reconcile import latest_event, read_bronze
from jobs.score import read_truth, report, score
from jobs.serve import Cycle, Engine, long_running
from jobs.session import OPTIMIZING_JIT
from jobs.signals import Stop
from schemas import LANDING
from tests.conftest import SUITE_SPARK_ARGS
from tests.test_ingest import fresh_db, make_landing

BEELINE_CP = str(Path(pyspark.__file__).parent / "jars" / "*")
CYCLE_WAIT_S = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A `txn-recon serve` process, its output in a file, and its addresses."""

    def __init__(self, landing: Path, conf: Path, warehouse: Path, log: Path,
                 processes: list[subprocess.Popen[bytes]]) -> None:  # fmt: skip
        self.log = log
        cmd = [sys.executable, "-m", "jobs.serve", "--landing", str(landing), "--conf", str(conf),
               "--warehouse", str(warehouse)]  # fmt: skip
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        processes.append(self.proc)
        wait_for(lambda: "HTTP on" in self.text() or self.proc.poll() is not None, 120, "serve to listen")
        assert self.proc.poll() is None, self.text()[-3000:]
        self.jdbc = re.search(r"SQL on (jdbc:hive2://\S+)", self.text()).group(1)  # type: ignore[union-attr]
        self.http = re.search(r"HTTP on (http://\S+)/", self.text()).group(1)  # type: ignore[union-attr]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.http + path, timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def cycles(self) -> list[str]:
        return re.findall(r"txn-recon serve: cycle \d+ (\w+)", self.text())

    def beeline(self, *args: str) -> list[str]:
        # A beeline lives a few seconds: the quick JIT compiler and the serial collector are all it needs.
        return ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Ddisable.quoting.for.sv=false", "-cp",
                BEELINE_CP, "org.apache.hive.beeline.BeeLine", "-u", self.jdbc, "--outputformat=csv2",
                "--silent=true", "--showHeader=true", *args]  # fmt: skip

    def sql(self, *statements: str) -> list[list[dict[str, str]]]:
        """Each statement's rows over JDBC, as beeline prints them: CSV (values with commas quoted), NULL for
        null. One beeline asks them all, a row naming each answer before it: a JVM each took a minute of
        the test on a busy machine."""
        script = "".join(f"SELECT 'answer {i}' AS answer;\n{statement};\n" for i, statement in enumerate(statements))
        out = subprocess.run(self.beeline("-e", script), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        parts = re.split(r"^(?:\d+: jdbc:\S*> )?answer\nanswer \d+\n", out.stdout, flags=re.M)
        assert len(parts) == len(statements) + 1, out.stdout[-2000:]
        return [printed_rows(part) for part in parts[1:]]

    def ask_while(self, statement: str, answers: Path, busy: Callable[[], bool], every_s: float = 1.0) -> None:
        """Ask `statement` every `every_s` seconds while `busy()`, from one beeline, and leave the answers it
        printed in `answers`: a JVM started for every few questions took CPU from the cycle being watched."""
        script, errors = answers.with_suffix(".sql"), answers.with_suffix(".err")
        script.write_text(f"{statement};\n!sh sleep {every_s}\n" * int(CYCLE_WAIT_S / every_s))
        with answers.open("w") as out, errors.open("w") as err:
            asking = subprocess.Popen(self.beeline("-f", str(script)), stdout=out, stderr=err)
        try:
            while busy() and asking.poll() is None:
                time.sleep(0.5)
            assert asking.poll() is None, errors.read_text()[-2000:]  # it asked all along
        finally:
            asking.kill()
            asking.wait(30)


def printed_rows(text: str) -> list[dict[str, str]]:
    """The rows beeline printed in CSV with a header, one or more answers to the same statement."""
    # beeline echoes its prompt in front of each statement's header, even when silent
    lines = [line for line in re.sub(r"^\d+: jdbc:\S*> ", "", text.strip(), flags=re.M).splitlines() if line]
    if not lines:
        return []
    header = lines[0]
    return list(csv.DictReader(io.StringIO("\n".join([header, *(line for line in lines[1:] if line != header)]))))


def wait_for(ready: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {seconds:g} s")
        time.sleep(0.5)


def metric(text: str, name: str) -> dict[str, float]:
    """One metric's samples in Prometheus' text format, by their label set."""
    return {labels: float(value) for labels, value in re.findall(rf"^{name}(\{{.*?\}}|) (\S+)$", text, re.M)}


def land(source: Path, landing: Path, part: int, parts: int) -> None:
    """Every `parts`-th landing file of each stream, from the `part`-th on, as one new file per stream that
    appears at once (renamed into place), so a cycle lands a stream's part whole or not at all."""
    for stream in LANDING:
        (landing / stream).mkdir(parents=True, exist_ok=True)
        text = "".join(f.read_text() for f in sorted((source / stream).glob("*.jsonl"))[part::parts])
        if text:
            (landing / stream / f".part-{part}.tmp").write_text(text)
            (landing / stream / f".part-{part}.tmp").rename(landing / stream / f"part-{part}.jsonl")


ANOMALY_ROWS = ("SELECT anomaly_type, reason, broker_name, uniq_key, consumer_group, topic, queue_id, event_ts, as_of, "
                "detail FROM txn_recon.anomalies")  # fmt: skip


def anomaly_rows(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The anomalies as beeline printed them (ANOMALY_ROWS), with their types back."""
    ints = ("queue_id", "event_ts", "as_of")
    return [{k: None if v in ("", "NULL") else int(v) if k in ints else v for k, v in r.items()} for r in rows]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The serve processes a test starts, killed if the test ends before they stop."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_serve_cycles_sql_metrics_kill_and_stop(tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    source = tmp_path / "source"
    make_landing(source, n=120, per_file=60)
    landing, warehouse, log = tmp_path / "landing", tmp_path / "warehouse", tmp_path / "serve.log"
    conf = tmp_path / "serve.yaml"
    conf.write_text(json.dumps({"serve": {"every_s": 2, "http": f"127.0.0.1:{_free_port()}",
                                          "sql": f"127.0.0.1:{_free_port()}", "compact_every_cycles": 2},
                                "ingest": {"archive": True},
                                "spark": {"conf": {"spark.sql.shuffle.partitions": "2"}}}))  # fmt: skip
    land(source, landing, 0, 2)

    served = Served(landing, conf, warehouse, log, processes)
    # A bound on waiting, not on speed: a first cycle (a cold JVM, a full reconcile) took 296 s in a full suite
    # run on a busy machine, its reconcile of 68 transactions 159 s.
    wait_for(lambda: bool(served.cycles()), CYCLE_WAIT_S, "a first cycle")
    assert served.cycles()[0] == "ok", served.text()[-3000:]
    status, health = served.get("/healthz")
    assert status == 200 and health.startswith("ok: last good cycle"), health
    status, page = served.get("/")
    assert status == 200 and "<html" in page.lower()
    text = served.get("/metrics")[1]
    findings = metric(text, "txn_recon_findings")
    # Nothing new has landed since: the cycles after the first rest, and the first one's row counts its findings.
    counts = "SELECT (SELECT count(*) FROM txn_recon.half_events) AS h, (SELECT count(*) FROM txn_recon.anomalies) AS a"
    found, [pending], delivered_rows, [first] = served.sql(
        "SELECT anomaly_type, count(*) AS n, (SELECT anomalies FROM txn_recon.serve_cycles WHERE status = 'ok') "
        "AS recorded FROM txn_recon.anomalies GROUP BY anomaly_type",
        "SELECT count_if(r.as_of - l.born_ts >= 60000) AS old FROM txn_recon.txn_lifecycle l CROSS JOIN "
        "(SELECT max(as_of) AS as_of FROM txn_recon.reconcile_runs) r WHERE l.state = 'PENDING'",
        "SELECT consumer_group, status, count(*) AS n FROM txn_recon.deliveries GROUP BY 1, 2",
        counts,
    )  # fmt: skip
    by_type = {r["anomaly_type"]: int(r["n"]) for r in found}
    summed: dict[str, float] = {}
    for labels, value in findings.items():
        kind = re.search(r'type="(\w+)"', labels).group(1)  # type: ignore[union-attr]
        summed[kind] = summed.get(kind, 0) + value
    assert by_type and summed == by_type
    assert {int(r["recorded"]) for r in found} == {sum(by_type.values())}
    assert metric(text, "txn_recon_pending_transactions")['{older_than="1m"}'] == int(pending["old"]) > 0
    delivered = {(r["consumer_group"], r["status"]): int(r["n"]) for r in delivered_rows}
    shown = {tuple(re.findall(r'="([^"]*)"', k)): v for k, v in metric(text, "txn_recon_deliveries").items()}
    assert delivered and shown == delivered
    lags = metric(text, "txn_recon_op_lag_seconds")
    assert list(lags) == ['{quantile="0.5"}', '{quantile="0.99"}', '{quantile="1"}'], lags
    assert 0 <= lags['{quantile="0.5"}'] <= lags['{quantile="0.99"}'] <= lags['{quantile="1"}']

    # The second half lands while it runs. Every answer over JDBC during the cycle that brings it in (its
    # ingest and its reconcile) is each table before or after that cycle's commit to it, never a part of one.
    # Then kill -9 once that cycle checks quality: the reconcile is committed, the quality and report not.
    halves = sum(1 for f in (source / "half").glob("*.jsonl") for _ in f.read_text().splitlines())
    assert 0 < int(first["h"]) < halves
    land(source, landing, 1, 2)
    done = len(served.cycles())
    checking = re.compile(r"cycle (\d+): quality")
    answers = tmp_path / "answers.csv"
    served.ask_while(counts, answers, lambda: not any(int(n) > done for n in checking.findall(served.text())))
    served.proc.kill()
    seen = {(int(r["h"]), int(r["a"])) for r in printed_rows(answers.read_text())}
    served.proc.wait(30)
    killed = len(served.cycles())
    restarted = Served(landing, conf, warehouse, log, processes)
    wait_for(lambda: "ok" in restarted.cycles()[killed:], CYCLE_WAIT_S, "a good cycle after the restart")
    status_rows, job_rows, [compacting], mode_rows, [last], found_rows = restarted.sql(
        "SELECT status, count(*) AS n FROM txn_recon.serve_cycles GROUP BY status",
        "SELECT spark_jobs FROM txn_recon.serve_cycles WHERE status = 'ok' ORDER BY started_at",
        "SELECT count(*) AS n FROM txn_recon.serve_cycles WHERE compact_s IS NOT NULL",
        "SELECT mode FROM txn_recon.reconcile_runs ORDER BY finished_at",
        counts,
        ANOMALY_ROWS,
    )
    statuses = {r["status"]: int(r["n"]) for r in status_rows}
    assert "failed" not in statuses and statuses.get("ok", 0) >= 2, statuses
    # Each cycle counts the Spark jobs its steps ran, from Spark's own counter: the line, the row and the metric.
    printed = [int(n) for n in re.findall(r"cycle \d+ ok: .*, Spark jobs (\d+) \(", restarted.text())]
    jobs = [int(r["spark_jobs"]) for r in job_rows]
    assert printed and all(n > 0 for n in jobs) and set(printed) <= set(jobs), (printed, jobs)
    assert metric(restarted.get("/metrics")[1], "txn_recon_last_cycle_step_spark_jobs")
    # After each cycle that did work, Python's reference cycles are collected: the JVM frees what they held.
    worked = re.findall(r"cycle \d+ ok: .*", restarted.text())
    assert worked and all(re.search(r", gc [\d.]+ s,", line) for line in worked), worked
    # Every second cycle (an idle one too) joins the small files that each cycle adds to the tables, such as
    # a row per stream in ingest_files; reconcile goes on incrementally all the same.
    assert re.search(r"ingest_files: \d+ small files joined into 1\n", restarted.text()), restarted.text()[-3000:]
    assert int(compacting["n"]) >= 1
    modes = [r["mode"] for r in mode_rows]
    # The cycle after the restart reconciles all the same, and finds nothing new since the last run (unless
    # the kill came between ingest and reconcile).
    assert modes[0] == "full" and "incremental" in modes and set(modes[1:]) <= {"incremental", "unchanged"}, modes
    assert int(last["h"]) == halves
    # ingest.archive: every file landed has moved, once recorded, from its stream folder to _ingested/.
    moved = sorted(str(p.relative_to(run)) for run in (landing / "_ingested").iterdir() for p in run.rglob("*.jsonl"))
    assert moved == sorted(f"{s}/part-{i}.jsonl" for s in LANDING for i in (0, 1)
                           if sorted((source / s).glob("*.jsonl"))[i::2])  # fmt: skip
    assert not [p for s in LANDING for p in (landing / s).iterdir()]
    allowed = {(int(first["h"]), int(first["a"])), (halves, int(first["a"])), (halves, int(last["a"]))}
    assert seen and seen <= allowed, (seen, allowed)
    # `txn-recon sql` cannot open the catalog serve holds: it asks serve's SQL server instead.
    cli = subprocess.run([sys.executable, "-m", "jobs.sql", "SELECT count(*) AS n FROM half_events", "--format", "csv",
                          "--warehouse", str(warehouse)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (cli.returncode, cli.stdout) == (0, f"n\n{halves}\n"), cli.stderr[-2000:]
    truth, _ = read_truth(source / "_truth")
    scores = score(truth, anomaly_rows(found_rows))
    assert all(s.perfect for s in scores.values()), report(scores)

    restarted.proc.send_signal(signal.SIGTERM)
    assert restarted.proc.wait(60) == 0, restarted.text()[-3000:]
    assert re.search(r"stopped by SIGTERM after \d+ cycle", restarted.text())
    assert "Traceback" not in restarted.text() and "is a view" not in restarted.text()  # not compacted
    assert "Failed to cancel job group" not in restarted.text()  # what Spark says of each query it answered


def test_a_long_running_session_keeps_the_latest_queries_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's status store keeps a thousand SQL executions by default; serve's session keeps 50, and its JVM
    compiles with the optimizing JIT too (a service runs the same code every cycle), keeps the classes Spark
    generates for a cycle's queries and broadcasts no join by its estimated size, unless the config says
    otherwise."""
    monkeypatch.delenv(SUITE_SPARK_ARGS)  # the suite's Spark defaults set JVM flags: they win
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    ours = long_running(load_config()).spark.conf
    assert (ours["spark.sql.ui.retainedExecutions"], ours["spark.ui.retainedJobs"]) == ("50", "100")
    assert ours["spark.driver.defaultJavaOptions"] == OPTIMIZING_JIT  # not stopped at the quick compiler
    assert int(ours["spark.sql.codegen.cache.maxEntries"]) >= 1000  # a cycle's generated classes, kept
    assert ours["spark.sql.autoBroadcastJoinThreshold"] == "-1"  # a broadcast is a Spark job of its own
    theirs = load_config(overrides={"spark": {"conf": {"spark.sql.ui.retainedExecutions": "7",
                                                       "spark.driver.defaultJavaOptions": "-Xss4m"}}})  # fmt: skip
    assert long_running(theirs).spark.conf["spark.sql.ui.retainedExecutions"] == "7"
    assert long_running(theirs).spark.conf["spark.driver.defaultJavaOptions"] == "-Xss4m"


def test_the_engine_keeps_the_data_time_reconcile_would_read(
    spark: SparkSession, config: Config, tmp_path: Path
) -> None:
    """Serve raises bronze's latest event time by what each ingest read, instead of reading it back from
    `ingest_files` every cycle: the time the tables give, the one reconcile runs as of."""
    cfg = fresh_db(spark, config, "t_serve_data_time")
    source, landing = tmp_path / "source", tmp_path / "landing"
    make_landing(source, n=40, per_file=40)
    engine = Engine(spark, cfg, landing, None, Stop())
    times: list[int] = []
    for part in (0, 1):  # each stream's earlier files first, then the later ones
        for stream in ("half", "op", "real", "offset"):
            (landing / stream).mkdir(parents=True, exist_ok=True)
            files = sorted((source / stream).glob("*.jsonl"))
            for f in files[: len(files) // 2] if part == 0 else files[len(files) // 2 :]:
                (landing / stream / f.name).write_text(f.read_text())
        c = Cycle(f"cycle-{part}", dt.datetime(2026, 1, 1))
        engine.ingest(c)
        if part == 0:  # the first reconcile finds the time; from then on each ingest raises it
            engine.reconcile(c)
            [recorded] = spark.table(cfg.table("reconcile_runs")).collect()
            assert engine.latest_event == recorded["as_of"]
        found = latest_event(spark, cfg, read_bronze(spark, cfg).frames)
        assert found is not None and engine.latest_event == found, (part, engine.latest_event)
        times.append(found)
    assert times[0] < times[1]  # the second cycle's data time is its ingest's, not the first's
