"""A broker nobody writes to, on a real RocketMQ 5.3.3 cluster: one name server and two brokers of
DefaultCluster on loopback, both with autoCreateTopicEnable=false.

TopicTxn is created on broker-a alone (`mqadmin updateTopic -b`), and a transactional producer (Scenario.java
`produce`, its routes refreshed every 2 s) sends to it. broker-b joins and takes nothing. Then the command the
finding gives, `mqadmin updateTopic -c DefaultCluster -t TopicTxn -w 4 -r 4`, creates the topic on broker-b;
after the producer's next route refresh broker-b takes writes. The collector passes every second meanwhile;
every wait is for something the test sees (a log line, a pass's snapshot), never a fixed time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.cli import main
from jobs.config import Config
from jobs.reconcile import reconcile
from jobs.runs import new_run_id
from sources.collector import Collector, write_runs
from tests.rocketmq.cluster import BrokerSettings, RocketMQ, compile_driver, mqadmin, start_driver, wait_for
from tests.test_ingest import fresh_db, ingest

pytestmark = pytest.mark.spark
TOPIC, CLUSTER = "TopicTxn", "DefaultCluster"
# The producer polls routes every 2 s and a broker registers at once: the route delay leaves it 3 s more. It sends
# every 0.1 s, in turns of four sends (a half and a message each) to each broker's four queues: a window of 10
# messages or more holds sends to both, so broker-a is never idle, and a window of 5 s lacks 10 only if the producer
# stalls for 4 s. Margins for a starved machine, which stretches every wait.
ROUTE_DELAY_MS, WINDOW_MS, IDLE_MIN_MESSAGES = 5_000, 5_000, 10
NO_AUTO_CREATE = ("autoCreateTopicEnable=false",)
SETTINGS = BrokerSettings(check_interval_ms=3_600_000)  # no transaction here is checked


@dataclass(frozen=True)
class Played:
    cfg: Config
    landing: Path
    sent: list[dict[str, Any]]  # the producer's line per send: broker_name, uniq_key, ts
    joined_ms: int  # broker-b registered by then
    update: tuple[int, int]  # updateTopic ran between these times
    passes: list[int]  # when each collect pass ended


def _lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def _now() -> int:
    return int(time.time() * 1000)


@pytest.fixture(scope="module")
def played(spark: SparkSession, config: Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Played]:
    root = tmp_path_factory.mktemp("cluster")
    classes, landing, home = compile_driver(root / "classes"), root / "landing", root / "client"
    with RocketMQ(root / "a", SETTINGS, extra_conf=NO_AUTO_CREATE) as a:
        b = RocketMQ(root / "b", SETTINGS, broker_name="broker-b", namesrv_port=a.namesrv_port,
                     namesrv_home=a.home("namesrv"), extra_conf=NO_AUTO_CREATE)  # fmt: skip
        producer: subprocess.Popen[bytes] | None = None
        try:
            mqadmin(a.namesrv, "updateTopic", "-b", f"127.0.0.1:{a.broker_port}", "-t", TOPIC, "-w", "4", "-r", "4",
                    home=home)  # fmt: skip
            sent = root / "sent.jsonl"
            producer = start_driver(classes, "produce", a.namesrv, sent, TOPIC, "2000", home=home, name="producer")
            wait_for(lambda: len(_lines(sent)) >= 10, "the producer's first sends", 90)
            joined, update, passes = _play(a, b, Collector([a.namesrv], landing, config.collect), producer, sent,
                                           landing, home)  # fmt: skip
        finally:
            if producer is not None and producer.poll() is None:
                producer.kill()
                producer.wait(30)
            b.stop()
    thresholds = dataclasses.replace(config.thresholds, route_delay_ms=ROUTE_DELAY_MS, idle_window_ms=WINDOW_MS,
                                     idle_min_messages=IDLE_MIN_MESSAGES)  # fmt: skip
    cfg = dataclasses.replace(fresh_db(spark, config, "t_real_cluster"), thresholds=thresholds)
    tallies = ingest(spark, cfg, landing, "real-cluster")
    assert all(t.quarantined == 0 for t in tallies.values()), tallies
    reconcile(spark, cfg)
    yield Played(cfg, landing, [s for s in _lines(sent) if s["kind"] == "sent"], joined, update, passes)


def _play(a: RocketMQ, b: RocketMQ, collector: Collector, producer: subprocess.Popen[bytes], sent: Path,
          landing: Path, home: Path) -> tuple[int, tuple[int, int], list[int]]:  # fmt: skip
    """broker-b joins, idles, gets the topic, takes writes; when it joined, when the update ran, each pass."""
    passes: list[int] = []

    def collect() -> None:
        run_id = new_run_id(dt.datetime.now(dt.UTC), "collect")
        runs = collector.run_pass(run_id)
        write_runs(collector.folder, run_id, runs)
        assert all(r.status == "ok" and not r.errors for r in runs), [r.row(run_id) for r in runs]
        passes.append(_now())
        time.sleep(0.5)

    def collect_until(ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 120
        while not ready():
            assert time.monotonic() < deadline, f"timed out collecting until {what}"
            collect()

    collect()
    b.start_broker()
    joined = _now()
    # Past the route delay and two whole windows of broker-b idle after it, as the passes saw them.
    settled = joined + ROUTE_DELAY_MS
    collect_until(lambda: passes[-1] > (settled // WINDOW_MS + 5) * WINDOW_MS, "broker-b idled two windows")
    before = _now()
    mqadmin(a.namesrv, "updateTopic", "-c", CLUSTER, "-t", TOPIC, "-w", "4", "-r", "4", home=home)
    update = (before, _now())
    collect_until(lambda: any(s["broker_name"] == "broker-b" for s in _lines(sent)), "broker-b takes a send")
    first_b = min(s["ts"] for s in _lines(sent) if s["broker_name"] == "broker-b")
    # Past the windows broker-b is judged in again (its table changed), and the ops of the last sends.
    collect_until(lambda: passes[-1] > first_b + ROUTE_DELAY_MS + 3 * WINDOW_MS, "broker-b wrote a while")
    assert producer.stdin is not None
    producer.stdin.close()  # it ends after its current send
    producer.wait(60)
    sends = sum(1 for s in _lines(sent) if s["kind"] == "sent")
    collect_until(lambda: _landed(landing) >= sends, "every send's committed message is collected")
    # The command's own pass lists every broker and its topics.
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["collect", "--namesrv", a.namesrv, "--landing", str(landing.parent / "cli")]) == 0
    assert f"  cluster {CLUSTER}: broker-a topics {TOPIC}; broker-b topics {TOPIC}\n" in out.getvalue(), out.getvalue()
    return joined, update, passes


def _landed(landing: Path) -> int:
    """TopicTxn's messages in the landing's real files so far."""
    return sum(1 for f in (landing / "real").glob("*.jsonl") for line in f.read_text().splitlines()
               if json.loads(line)["topic"] == TOPIC)  # fmt: skip


def _rows(spark: SparkSession, p: Played, table: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.table(p.cfg.table(table)).collect()]


def _findings(spark: SparkSession, p: Played, kind: str) -> list[dict[str, Any]]:
    rows = spark.table(p.cfg.table("anomalies")).where(F.col("anomaly_type") == kind).collect()
    return [{**r.asDict(), "detail": json.loads(r["detail"])} for r in rows]


def test_collect_lands_every_broker_and_what_each_holds(spark: SparkSession, played: Played) -> None:
    rows = _rows(spark, played, "topology_events")
    members = {(r["cluster"], r["broker_name"], r["broker_id"]) for r in rows if r["kind"] == "broker"}
    assert members == {(CLUSTER, "broker-a", 0), (CLUSTER, "broker-b", 0)}
    tables = {b: sorted(r["snapshot_ts"] for r in rows if r["kind"] == "table" and r["broker_name"] == b)
              for b in ("broker-a", "broker-b")}  # fmt: skip
    topics = {(r["snapshot_ts"], r["broker_name"]): r for r in rows if r["kind"] == "topic"}
    # broker-a's table is landed by the first pass and again only when the update touched it; broker-b's when it
    # joined (no business topic) and when it got the topic.
    first = min(r["snapshot_ts"] for r in rows)
    assert tables["broker-a"][0] == first and all(ts > played.update[0] for ts in tables["broker-a"][1:])
    a_topic = topics[(first, "broker-a")]
    assert (a_topic["topic"], a_topic["read_queues"], a_topic["write_queues"], a_topic["perm"]) == (TOPIC, 4, 4, 6)
    b_joined, b_updated = tables["broker-b"]
    assert (b_joined, "broker-b") not in topics and topics[(b_updated, "broker-b")]["topic"] == TOPIC
    assert played.joined_ms <= b_joined < b_updated and b_updated > played.update[1]
    # The routes as the name server gave them: broker-a alone, then both.
    routes: dict[int, set[str]] = {}
    for r in rows:
        if r["kind"] == "route":
            routes.setdefault(r["snapshot_ts"], set()).add(r["broker_name"])
    assert [routes[ts] for ts in sorted(routes)] == [{"broker-a"}, {"broker-a", "broker-b"}]
    # Every pass listed both brokers once broker-b joined; none lists a topic of the brokers' own.
    listed: dict[int, set[str]] = {}
    for r in rows:
        if r["kind"] == "broker":
            listed.setdefault(r["snapshot_ts"], set()).add(r["broker_name"])
    assert len(listed) == len(played.passes)
    assert all(names == {"broker-a", "broker-b"} for ts, names in listed.items() if ts >= b_joined)
    assert {r["topic"] for r in rows if r["kind"] == "topic"} == {TOPIC}


def test_the_topic_missing_from_broker_b_is_a_finding_from_its_join_to_the_update(
    spark: SparkSession, played: Played
) -> None:
    [gap] = _findings(spark, played, "TOPIC_NOT_ON_BROKER")
    d = gap["detail"]
    assert (gap["broker_name"], gap["topic"], gap["reason"], d["cluster"]) == ("broker-b", TOPIC, "MISSING", CLUSTER)
    assert d["served_by"] == ["broker-a"] and d["fix"] == f"mqadmin updateTopic -c {CLUSTER} -t {TOPIC} -w 4 -r 4"
    # It opens with the first pass that saw broker-b and closes with the first after the update; broker-b's own
    # table tells when the update reached it.
    first_seen = min(ts for ts in played.passes if ts >= played.joined_ms)
    assert played.joined_ms <= gap["event_ts"] == d["since"] <= first_seen
    assert d["until"] == min(ts for ts in _snapshots(spark, played) if ts > played.update[1])
    assert played.update[0] <= d["table_ts"] <= played.update[1] and not d["ongoing"]


def _snapshots(spark: SparkSession, p: Played) -> list[int]:
    return sorted({r["snapshot_ts"] for r in _rows(spark, p, "topology_events") if r["kind"] == "broker"})


def test_broker_b_stored_nothing_until_the_route_reached_the_producer(spark: SparkSession, played: Played) -> None:
    found = _findings(spark, played, "BROKER_WITHOUT_WRITES")
    assert len(found) == 1, [(f["broker_name"], f["detail"]) for f in found]
    [idle] = found
    d = idle["detail"]
    assert (idle["broker_name"], d["cluster"], d["stored_by"]) == ("broker-b", CLUSTER, ["broker-a"])
    assert d["window_ms"] == WINDOW_MS
    # Judged from the route delay after its join, until the window its first message fell in at the latest.
    first_b = min(s["ts"] for s in played.sent if s["broker_name"] == "broker-b")
    assert played.joined_ms + ROUTE_DELAY_MS <= d["since"] and d["until"] is not None
    assert d["until"] <= first_b // WINDOW_MS * WINDOW_MS + WINDOW_MS and d["windows"] >= 2
    assert d["cluster_messages"] >= IDLE_MIN_MESSAGES * d["windows"]
    # broker-b stored what the producer says it sent there, and nothing before the update.
    to_b = {s["uniq_key"] for s in played.sent if s["broker_name"] == "broker-b"}
    stored = spark.table(played.cfg.table("real_events")).where(F.col("topic") == TOPIC)
    on_b = {r["uniq_key"]: r["store_timestamp"] for r in stored.where(F.col("broker_name") == "broker-b").collect()}
    assert set(on_b) == to_b and min(on_b.values()) > played.update[0]
    # The per-broker writes view shows broker-b's line starting after the update.
    writes = spark.table(played.cfg.table("broker_writes")).where(F.col("topic") == TOPIC)
    firsts = writes.groupBy("broker_name").agg(F.min("minute_ts").alias("first")).collect()
    first_minute = {r["broker_name"]: r["first"] for r in firsts}
    assert first_minute["broker-b"] >= played.update[0] // 60_000 * 60_000 and "broker-a" in first_minute
    # broker_windows, which the rule, the chart and the metric read, counts the same writes per broker.
    per_broker = spark.table(played.cfg.table("broker_writes")).groupBy("broker_name").agg(
        F.sum(F.col("messages") + F.col("halves")).alias("n"))  # fmt: skip
    windows = spark.table(played.cfg.table("broker_windows"))
    assert sorted(windows.groupBy("broker_name").agg(F.sum("messages").alias("n")).collect()) == sorted(
        per_broker.collect())  # fmt: skip
    [[first_window]] = windows.where(F.col("broker_name") == "broker-b").agg(F.min("window_ts")).collect()
    assert first_window >= played.update[0] // WINDOW_MS * WINDOW_MS
