"""The version matrix: every RocketMQ version `make rocketmq` fetched besides the main one (ROCKETMQ_VERSIONS,
by default 4.9.7 and 5.5.0) plays the transaction phase of the real-broker scenario, driven by the suite's
client, while `txn-recon collect --every 1` reads it. Then the broker is killed (its store stays as it is)
and export-store reads the store. The collector must land exactly what the store holds, and the pipeline
on its landing must find every lifecycle state and anomaly that follows from what the driver did and saw.

On 4.9.7 the collector used to land no op at all: a 4.x broker keeps no topic config for its op topic, so
a pull of it answers TOPIC_NOT_EXIST (sources/client.read_by_index). The main version's own, longer scenario
(resets, young halves, a restart) is tests/test_real_broker.py.

5.5.0 plays it twice: as it comes, and in RIP-82 mode (transRocksDBEnable with
transWriteOriginTransHalfEnable=false: halves and ops in topics of their own, no check copy, no discard
message), where the truth follows tests/rocketmq/truth.rip_82_expected. Both readers once landed those
topics as business messages (125 halves and 105 ops as `real` records of two made-up topics).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from jobs.config import Config
from jobs.reconcile import reconcile
from sources.collector import _iso as collect_time
from sources.collector import _now as now
from tests.rocketmq.cluster import VERSIONS, BrokerSettings, RocketMQ, compile_driver, run_driver, wait_for
from tests.rocketmq.truth import expected, rip_82_deletions, rip_82_expected
from tests.test_ingest import fresh_db, ingest, landed
from tests.test_real_broker import collect_runs, export, start_collector, stop_collector, whole_passes

pytestmark = pytest.mark.spark
SETTINGS = BrokerSettings()


RIP_82 = ("transRocksDBEnable=true", "transWriteOriginTransHalfEnable=false")


@dataclass(frozen=True)
class Played:
    version: str
    rip_82: bool
    truth: list[dict[str, Any]]
    live: Path  # what the collector landed
    exported: Path  # what export-store read from the store afterwards
    collector_log: str
    collector_exit: int  # after the SIGTERM that stopped it
    deletions: dict[str, int]  # the halves a RIP-82 broker deleted unresolved, with its check count then


NONE = pytest.param(None, marks=pytest.mark.skip("ROCKETMQ_VERSIONS names no version but the main one"))
PLAYS = [pytest.param((v, False), id=v) for v in VERSIONS[1:]]
PLAYS += [pytest.param(("5.5.0", True), id="5.5.0-rip82")] if "5.5.0" in VERSIONS[1:] else []


@pytest.fixture(scope="module", params=PLAYS or [NONE])
def played(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Played:
    version, rip_82 = request.param
    root = tmp_path_factory.mktemp(f"rocketmq-{version}")
    classes = compile_driver(root / "classes")
    truth, live, exported, log = root / "truth.jsonl", root / "live", root / "exported", root / "collector.log"
    with RocketMQ(root, SETTINGS, version=version, extra_conf=RIP_82 if rip_82 else ()) as rmq:
        collector = start_collector(rmq.namesrv, live, log, "--every", "1")
        try:
            run_driver(classes, "txn", rmq.namesrv, truth, str(SETTINGS.check_max), str(SETTINGS.check_interval_ms),
                       home=root / "client")  # fmt: skip
            settled = collect_time(now())
            wait_for(lambda: any(r["status"] == "ok" and r["started_at"] > settled for r in collect_runs(live)),
                     "a whole collect pass after the driver settled")  # fmt: skip
        finally:
            exit_code = stop_collector(collector)
        rmq.kill_broker()
        time.sleep(0.5)
        export(rmq.store, exported, rmq.broker_name)
        deletions = rip_82_deletions(rmq.log("broker", "transaction.log"))
    lines = [json.loads(line) for line in truth.read_text().splitlines()]
    return Played(version, rip_82, lines, live, exported, log.read_text(), exit_code, deletions)


def test_collect_lands_what_the_store_holds(played: Played) -> None:
    for stream in ("half", "op", "real"):
        live, stored = landed(played.live / stream), landed(played.exported / stream)
        assert stored and live == stored, (played.version, stream, len(live), len(stored))
    runs = whole_passes(played.live)
    failed = [(r["run_id"], r["status"], r["errors"]) for r in runs if r["status"] != "ok" or r["errors"]]
    assert runs and not failed, (played.version, failed)
    assert "Traceback" not in played.collector_log
    assert played.collector_exit == 0 and "collect: stopped by SIGTERM" in played.collector_log


def test_pipeline_matches_what_the_broker_did(spark: SparkSession, config: Config, played: Played) -> None:
    broker = dataclasses.replace(config.broker, transaction_timeout_ms=SETTINGS.transaction_timeout_ms,
                                 check_interval_ms=SETTINGS.check_interval_ms, check_max=SETTINGS.check_max,
                                 op_batch_interval_ms=SETTINGS.op_batch_interval_ms)  # fmt: skip
    name = "t_rocketmq_" + played.version.replace(".", "_") + ("_rip82" if played.rip_82 else "")
    cfg = dataclasses.replace(fresh_db(spark, config, name), broker=broker)
    tallies = ingest(spark, cfg, played.live, f"versions-{played.version}")
    assert all(t.quarantined == 0 for t in tallies.values()), tallies
    reconcile(spark, cfg)

    txns = [t for t in played.truth if t["kind"] == "txn"]
    assert Counter(t["fate"] for t in txns)["LATE_COMMIT"] == 5
    want = {t["uniq_key"]: rip_82_expected(t, SETTINGS.check_max, played.deletions) if played.rip_82
            else expected(t, SETTINGS.check_max, SETTINGS.check_interval_ms) for t in txns}  # fmt: skip
    life = {r["uniq_key"]: r for r in spark.table(cfg.table("txn_lifecycle")).collect()}
    assert {k: r["state"] for k, r in life.items()} == {k: e.state for k, e in want.items()}
    rows = spark.table(cfg.table("anomalies")).collect()
    got = {(r["anomaly_type"], r["uniq_key"], r["reason"]) for r in rows if r["uniq_key"] is not None}
    wanted = {(kind, k, reason) for k, e in want.items() for kind, reason in e.anomalies}
    either = {(kind, k, reason) for k, e in want.items() for kind, reason in e.either}
    assert got - either == wanted, (played.version, sorted(got - either - wanted)[:5], sorted(wanted - got)[:5])
    assert {kind for kind, _, _ in got} >= {"DISCARDED_AFTER_MAX_CHECKS", "ORPHANED_COMMIT"}
    # Every final message reached the consumers, duplicates included.
    consumed = sum(r["messages"] for r in played.truth if r["kind"] == "consumed")
    finals = spark.table(cfg.table("real_events")).where("topic = 'TxnTopic'").count()
    assert consumed == finals == sum(r["commit_count"] for r in life.values())
