"""A real RocketMQ 5.3.3 broker, driven by the official Java client, read back two ways, through export-store
and through a live `txn-recon collect`, then ingest and reconcile: every lifecycle state and anomaly must
match what the scenario driver did and saw, and the two ways must land the same bronze rows.

One module fixture runs the scenario once (about a minute of broker time): the transaction fates and a
two-member consumer group, an export of the live store, an admin reset of the group's offsets back to
the start with the group offline, young halves, then SIGKILL (the store stays as it is) and two more
exports, the last of which must find nothing new. A collector runs every second all along. It sees the
broker go, and, once the broker is started again on the same store (with its check service idle, so the
store stays as exported), reads the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from jobs.cli import main
from jobs.config import Config
from jobs.export_store import commitlog_files
from jobs.reconcile import reconcile
from jobs.report import _collect_runs as report_collect_runs
from sources.collector import _iso as collect_time
from sources.collector import _now as now
from sources.commitlog import Message, scan
from tests.rocketmq.cluster import BrokerSettings, RocketMQ, compile_driver, run_driver, wait_for
from tests.rocketmq.truth import expected
from tests.test_ingest import fresh_db, ingest, landed, rows

pytestmark = pytest.mark.spark
SETTINGS = BrokerSettings()
TRACE_FLUSH_MS = 5000  # a client's trace dispatcher sends what it holds at least this often


@dataclass(frozen=True)
class Scenario:
    truth: list[dict[str, Any]]
    landing: Path
    exports: list[str]  # each export-store run's summary line
    broker: RocketMQ
    live: Path  # what the collector landed
    collector_log: str
    collector_exit: int  # after the SIGTERM that stopped it


def start_collector(namesrv: str, landing: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "jobs.collect", "--namesrv", namesrv, "--landing", str(landing), *args]
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def collect_runs(landing: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted((landing / "_collect" / "runs").glob("*.jsonl"))
            for line in f.read_text().splitlines()]  # fmt: skip


def stop_collector(collector: subprocess.Popen[bytes]) -> int:
    """Stop a `collect --every` as a service manager does (SIGTERM); its exit code."""
    collector.send_signal(signal.SIGTERM)
    return collector.wait(30)


def whole_passes(landing: Path) -> list[dict[str, Any]]:
    """The collector's passes but a last one that the SIGTERM stopping it cut short (it says so)."""
    runs = collect_runs(landing)
    stopped = [r for r in runs if any(e.startswith("stopped by SIGTERM") for e in r["errors"])]
    assert stopped in ([], runs[-1:]), stopped
    return runs[: len(runs) - len(stopped)]


def export(store: Path, landing: Path, broker_name: str) -> str:
    """One export-store run; its summary line."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["export-store", "--store", str(store), "--landing", str(landing), "--broker-name", broker_name])
    assert code == 0, out.getvalue()
    return out.getvalue().strip().splitlines()[-1]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    root = tmp_path_factory.mktemp("rocketmq")
    classes = compile_driver(root / "classes")
    truth, landing, live, log = root / "truth.jsonl", root / "landing", root / "live", root / "collector.log"
    with RocketMQ(root, SETTINGS, extra_conf=("traceTopicEnable=true",)) as rmq:
        collector = start_collector(rmq.namesrv, live, log, "--every", "1")
        try:
            started = int(time.time() * 1000)
            run_driver(classes, "txn", rmq.namesrv, truth, str(SETTINGS.check_max), str(SETTINGS.check_interval_ms),
                       home=root / "client", trace=True)  # fmt: skip
            time.sleep(2)  # the broker writes consumerOffset.json every second
            exports = [export(rmq.store, landing, rmq.broker_name)]
            run_driver(classes, "reset", rmq.namesrv, truth, str(started), home=root / "client")
            time.sleep(2)
            run_driver(classes, "young", rmq.namesrv, truth, home=root / "client")
            rmq.kill_broker()
            exports += [export(rmq.store, landing, rmq.broker_name), export(rmq.store, landing, rmq.broker_name)]
            wait_for(lambda: "has no master registered" in log.read_text(), "the collector to miss the broker")
            rmq.settings = dataclasses.replace(SETTINGS, check_interval_ms=3_600_000)  # no check: the store stays
            restarted = collect_time(now())
            rmq.start_broker()
            wait_for(lambda: any(r["status"] == "ok" and r["started_at"] > restarted for r in collect_runs(live)),
                     "a whole collect pass after the restart")  # fmt: skip
            assert collector.poll() is None, "the collector must carry on when its broker goes"
        finally:
            exit_code = stop_collector(collector)
    lines = [json.loads(line) for line in truth.read_text().splitlines()]
    return Scenario(lines, landing, exports, rmq, live, log.read_text(), exit_code)


def test_scenario_played_every_fate(scenario: Scenario) -> None:
    fates = Counter(t["fate"] for t in scenario.truth if t["kind"] == "txn")
    assert fates == {"COMMIT": 40, "ROLLBACK": 20, "CHECK_COMMIT": 10, "CHECK_ROLLBACK": 10, "UNKNOW_FOREVER": 10,
                     "ORPHAN_SENDER": 10, "GONE": 10, "SLOW_NO_CHECKER": 5, "IMMUNITY": 5, "LATE_COMMIT": 5,
                     "YOUNG": 5}  # fmt: skip
    # A check goes to any live member of the group, not the sender: main-2's orphans were answered by main-1.
    orphans = [t for t in scenario.truth if t["kind"] == "txn" and t["fate"] == "ORPHAN_SENDER"]
    assert all(t["checks"] and t["checks"][-1]["by"] == "main-1" for t in orphans)
    resets = [r for r in scenario.truth if r["kind"] == "reset"]
    assert resets and any(r["to"] < r["from"] for r in resets)


def test_export_is_incremental_and_misses_nothing(scenario: Scenario, tmp_path: Path) -> None:
    nothing = "half 0, op 0, real 0, consumer copies 0, trace contexts 0; offset records 0"
    assert nothing in scenario.exports[-1], scenario.exports
    once = tmp_path / "once"
    export(scenario.broker.store, once, scenario.broker.broker_name)
    for stream in ("half", "op", "real", "trace"):
        assert landed(scenario.landing / stream) == landed(once / stream), stream
    files = sorted(p.name for p in (scenario.broker.store / "commitlog").iterdir())
    assert len(files) > 2, "the scenario should span several commit-log files"


@pytest.fixture(scope="module")
def warehouses(spark: SparkSession, config: Config, scenario: Scenario) -> dict[str, Config]:
    """Each landing (export-store's, the collector's) ingested and reconciled in a database of its own."""
    broker = dataclasses.replace(config.broker, transaction_timeout_ms=SETTINGS.transaction_timeout_ms,
                                 check_interval_ms=SETTINGS.check_interval_ms, check_max=SETTINGS.check_max,
                                 op_batch_interval_ms=SETTINGS.op_batch_interval_ms)  # fmt: skip
    out = {}
    for way, landing in (("export", scenario.landing), ("live", scenario.live)):
        cfg = dataclasses.replace(fresh_db(spark, config, f"t_real_broker_{way}"), broker=broker)
        tallies = ingest(spark, cfg, landing, f"real-broker-{way}")
        assert all(t.quarantined == 0 for t in tallies.values()), (way, tallies)
        reconcile(spark, cfg)
        out[way] = cfg
    return out


def test_collector_reported_the_broker_restart(scenario: Scenario) -> None:
    runs = whole_passes(scenario.live)
    statuses = [r["status"] for r in runs if r["broker_name"] == scenario.broker.broker_name]
    assert statuses[0] == "ok" and statuses[-1] == "ok" and "failed" in statuses, statuses
    assert sum(r["half"] for r in runs) > 0 and sum(r["offset_records"] for r in runs) > 0
    assert "Traceback" not in scenario.collector_log
    assert scenario.collector_exit == 0 and "collect: stopped by SIGTERM" in scenario.collector_log
    # It commits nothing: its group never shows in the broker's offset table.
    offsets = (scenario.broker.store / "config" / "consumerOffset.json").read_text()
    assert "CG_RECON" in offsets and "txn_recon_collector" not in offsets


def test_live_collection_lands_what_export_store_lands(spark: SparkSession, scenario: Scenario,
                                                       warehouses: dict[str, Config]) -> None:  # fmt: skip
    for stream in ("half", "op", "real", "trace"):
        exported, live = (rows(spark, warehouses[way], stream) for way in ("export", "live"))
        assert exported and live == exported, stream
    # Offsets: the same last committed offset of every queue (their commit times are each reader's own).
    last = {way: {(r["consumer_group"], r["topic"], r["queue_id"]): r["offset"]
                  for r in sorted(rows(spark, cfg, "offset"), key=lambda r: (r["commit_timestamp"], r.get("seq") or 0))}
            for way, cfg in warehouses.items()}  # fmt: skip
    assert last["live"] == last["export"] and last["live"]
    landed_runs = spark.table(warehouses["live"].table("collect_runs"))
    assert landed_runs.count() == len(collect_runs(scenario.live))
    # The dashboard's run history: the last pass read the broker and knows the check service's backlog.
    latest = report_collect_runs(landed_runs)
    assert latest[0]["status"] == "ok" and latest[0]["check_backlog"] is not None, latest[0]
    assert any(r["status"] == "failed" and "no master registered" in r["errors"] for r in latest)

    # Topics: export-store's snapshot of config/topics.json holds what the live broker's table last said.
    def tables(cfg: Config) -> dict[int, set[tuple[Any, ...]]]:
        found: dict[int, set[tuple[Any, ...]]] = {}
        for r in (r for r in rows(spark, cfg, "topology") if r["kind"] in ("table", "topic")):
            queues = {(r["topic"], r["read_queues"], r["write_queues"], r["perm"])} if r["kind"] == "topic" else set()
            found[r["snapshot_ts"]] = found.get(r["snapshot_ts"], set()) | queues
        return found

    from_store, collected = tables(warehouses["export"]), tables(warehouses["live"])
    assert len(from_store) == 1 and list(from_store.values()) == [collected[max(collected)]]
    assert "TxnTopic" in {t for t, *_ in collected[max(collected)]}, collected


@pytest.mark.parametrize("way", ["export", "live"])
def test_pipeline_matches_what_the_broker_did(spark: SparkSession, scenario: Scenario,
                                              warehouses: dict[str, Config], way: str) -> None:  # fmt: skip
    cfg = warehouses[way]

    txns = [t for t in scenario.truth if t["kind"] == "txn"]
    want = {t["uniq_key"]: expected(t, SETTINGS.check_max, SETTINGS.check_interval_ms) for t in txns}
    states = {r["uniq_key"]: r["state"] for r in spark.table(cfg.table("txn_lifecycle")).collect()}
    assert states == {k: e.state for k, e in want.items()}

    rows = spark.table(cfg.table("anomalies")).collect()
    got = {(r["anomaly_type"], r["uniq_key"], r["reason"]) for r in rows if r["uniq_key"] is not None}
    wanted = {(kind, k, reason) for k, e in want.items() for kind, reason in e.anomalies}
    either = {(kind, k, reason) for k, e in want.items() for kind, reason in e.either}
    assert got - either == wanted, (sorted(got - either - wanted)[:5], sorted(wanted - got)[:5])
    assert {kind for kind, _, _ in got} >= {"DUPLICATE_COMMIT", "RECHECKED_AFTER_RESOLUTION",
                                            "DISCARDED_AFTER_MAX_CHECKS", "ORPHANED_COMMIT"}  # fmt: skip

    regressions = {(r["consumer_group"], r["topic"], r["queue_id"]): json.loads(r["detail"])
                   for r in rows if r["anomaly_type"] == "OFFSET_REGRESSION"}  # fmt: skip
    resets = {(r["consumer_group"], r["topic"], r["queue_id"]): (r["from"], r["to"])
              for r in scenario.truth if r["kind"] == "reset" and r["to"] < r["from"]}  # fmt: skip
    assert {k: (d["from_offset"], d["to_offset"]) for k, d in regressions.items()} == resets
    # The reset rewinds to the start, so everything the queue held is redelivered.
    assert all(d["redelivery_estimate"] == d["rewind"] for d in regressions.values())

    # Every final message reached the consumers, duplicates included: a duplicate commit is consumed twice.
    consumed = sum(r["messages"] for r in scenario.truth if r["kind"] == "consumed")
    finals = spark.table(cfg.table("real_events")).where("topic = 'TxnTopic'").count()
    life = {r["uniq_key"]: r for r in spark.table(cfg.table("txn_lifecycle")).collect()}
    commits = sum(r["commit_count"] for r in life.values())
    assert consumed == finals == commits, {"consumed": consumed, "stored in TxnTopic": finals, "commits": commits}
    # A discard comes after the last check copy: in the same pass, or a later one when a younger half stops
    # the walk first (seen: 9 ms and about 2 s on an idle machine, more under load). The model does the same.
    gaps = [r["discard_ts"] - r["last_copy_ts"] for r in life.values() if r["discard_ts"] is not None]
    assert gaps and min(gaps) >= 0, gaps

    # The producers traced (enableMsgTrace): each discard counts the answers its checks got, as the application
    # logged them, and says why: UNKNOW answered (UNKNOW_FOREVER, LATE_COMMIT), or nobody left to answer (GONE).
    # A member that shut down may have lost what it traced in its dispatcher's last flush interval (5 s,
    # AsyncTraceDispatcher.flushTraceInterval) and after: its answers then are traced or not.
    discards = {
        r["uniq_key"]: json.loads(r["detail"]) for r in rows if r["anomaly_type"] == "DISCARDED_AFTER_MAX_CHECKS"
    }
    left = {r["member"]: r["at"] for r in scenario.truth if r["kind"] == "left"}
    assert set(left) == {"gone-1", "main-1", "main-2"}, left

    def unsent(check: dict[str, Any]) -> bool:
        return check["at"] >= left[check["by"]] - TRACE_FLUSH_MS

    causes: Counter[tuple[str, str]] = Counter()
    for t in (t for t in txns if t["uniq_key"] in discards):
        d = discards[t["uniq_key"]]
        got = d["answers"]
        said = Counter(c["answer"] for c in t["checks"] if not unsent(c))
        maybe = Counter(c["answer"] for c in t["checks"] if unsent(c))
        for ours, app in (("unknown", "UNKNOW"), ("commit", "COMMIT"), ("rollback", "ROLLBACK")):
            assert said[app] <= got[ours] <= said[app] + maybe[app], (t, d)
        not_given = d["check_times"] - len(t["checks"])  # checks the application never saw
        assert not_given <= got["unanswered"] <= not_given + maybe.total(), (t, d)
        assert d["cause"] == ("ANSWERED_UNKNOWN" if got["unknown"] else "UNANSWERED"), (t, d)
        causes[(t["fate"], d["cause"])] += 1
    # A GONE producer may answer a check (UNKNOW) before it is shut down: each discard's cause is what it did.
    assert causes[("UNKNOW_FOREVER", "ANSWERED_UNKNOWN")] == 10 and causes[("GONE", "UNANSWERED")] > 0, causes
    assert not [r for r in rows if r["anomaly_type"] in ("TRACE_CONTRADICTION", "CHECK_ANSWER_LOST")]


def test_a_corrupt_store_loses_its_damaged_spans_and_nothing_else(
    spark: SparkSession,
    config: Config,
    scenario: Scenario,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 45: a copy of the broker's store with a bit flipped in the body of a record in each of its first
    two commit-log files, a page of zeros in the middle of the third, and its last written file cut in the
    middle of a record. export-store reports each damaged span in one line with its physical offset and lands
    every other record: what a clean export lands, less exactly the records the damage touches. Ingest and
    reconcile then run clean."""
    clean, damaged = tmp_path / "clean", tmp_path / "damaged"
    shutil.copytree(scenario.broker.store, damaged / "store")
    export(scenario.broker.store, clean, scenario.broker.broker_name)
    # The files written so far (the broker makes the next ones ahead of time, zeros until it writes there).
    files = [(start, path) for start, path in commitlog_files(damaged / "store" / "commitlog")
             if path.read_bytes()[:8].strip(b"\0")]  # fmt: skip
    assert len(files) >= 4, files
    records = [m for start, path in files for m in scan(path.read_bytes(), start) if isinstance(m, Message)]
    spans: list[tuple[int, int]] = []  # [from, to): the physical offsets each damage covers
    before = {start: path.read_bytes() for start, path in files}

    def rewrite(start: int, path: Path, at: int, data: bytes) -> None:
        buf = bytearray(path.read_bytes())
        buf[at - start : at - start + len(data)] = data
        path.write_bytes(bytes(buf))

    for start, path in files[:2]:  # a bit of a body: its CRC no longer holds
        m = next(m for m in records if m.position > start + 1024 and m.body_size > 0)
        body_at = m.position + m.size - len(m.properties.encode()) - 2 - len(m.topic.encode()) - 1 - m.body_size
        rewrite(start, path, body_at, bytes([path.read_bytes()[body_at - start] ^ 0x10]))
        spans.append((body_at, body_at + 1))
    start, path = files[2]
    rewrite(start, path, start + 8192, bytes(4096))  # a page lost in the middle of a file
    spans.append((start + 8192, start + 8192 + 4096))
    start, path = files[-1]
    # Three records from its end, or its first when the broker had written fewer there (timing decides how many).
    cut = [m for m in records if m.position >= start][-3:][0]
    with open(path, "r+b") as f:  # the last written file, cut short in the middle of a record
        f.truncate(cut.position - start + cut.size // 2)
    spans.append((cut.position + cut.size // 2, start + path.stat().st_size + (1 << 40)))
    # The records whose bytes changed (a zero written over a zero changes nothing), and for each damaged span
    # the first of them: where the scan finds it.
    now = {start: path.read_bytes() for start, path in files}

    def changed(m: Message) -> bool:
        start = max(s for s in now if s <= m.position)
        at = m.position - start
        return now[start][at : at + m.size] != before[start][at : at + m.size]

    lost = [m for m in records if changed(m)]
    assert len(lost) > 4 and len(lost) < len(records) // 2, (len(lost), len(records))
    firsts = [next(m.position for m in lost if m.position < b and a < m.position + m.size) for a, b in spans]

    landing = damaged / "landing"
    args = ["export-store", "--store", str(damaged / "store"), "--landing", str(landing),
            "--broker-name", scenario.broker.broker_name]  # fmt: skip
    with caplog.at_level("WARNING", logger="jobs.export_store"):
        assert main(args) == 2  # the cut record ends the data: one line says where, and all before it is landed
    error = capsys.readouterr().err.strip()
    reported = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] + [error]
    assert all("\n" not in line for line in reported), reported
    positions = [int(found[1]) for found in (re.search(r"position (\d+)", line) for line in reported) if found]
    assert positions == firsts, reported

    gone = {m.position for m in lost}
    for stream in ("half", "op", "real"):
        whole = landed(clean / stream)
        assert landed(landing / stream) == [r for r in whole if r["commit_log_offset"] not in gone], stream
    assert landed(landing / "offset") == landed(clean / "offset")

    cfg = fresh_db(spark, config, "t_real_broker_corrupt")
    tallies = ingest(spark, cfg, landing, "real-broker-corrupt")
    assert all(t.quarantined == 0 for t in tallies.values()), tallies
    reconcile(spark, cfg)
    assert spark.table(cfg.table("txn_lifecycle")).count() > 0
