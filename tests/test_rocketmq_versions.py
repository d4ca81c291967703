"""The version matrix: every RocketMQ version `make rocketmq` fetched besides the main one (ROCKETMQ_VERSIONS,
by default 4.9.7 and 5.5.0) plays the transaction phase of the real-broker scenario, driven by the suite's
client, while `txn-recon collect --every 1` reads it. Then the broker is killed (its store stays as it is)
and export-store reads the store. The collector must land exactly what the store holds, and the pipeline
on its landing must find every lifecycle state and anomaly that follows from what the driver did and saw.

On 4.9.7 the collector used to land no op at all: a 4.x broker keeps no topic config for its op topic, so
a pull of it answers TOPIC_NOT_EXIST (sources/client.read_by_index). The main version's own, longer scenario
(resets, young halves, a restart) is tests/test_real_broker.py.

A 5.5.0 broker in RIP-82 mode (transactions kept in RocksDB) is not reconciled: collect and export-store
must say so, and land none of its system messages as business messages (they did: 125 halves and 105 ops
as `real` records of two made-up topics).
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

from jobs.cli import main
from jobs.collect import _iso as collect_time
from jobs.collect import _now as now
from jobs.config import Config
from jobs.reconcile import reconcile
from tests.rocketmq.cluster import VERSIONS, BrokerSettings, RocketMQ, compile_driver, run_driver, wait_for
from tests.rocketmq.truth import expected
from tests.test_ingest import fresh_db, ingest, landed
from tests.test_real_broker import collect_runs, export, start_collector, stop_collector, whole_passes

pytestmark = pytest.mark.spark
SETTINGS = BrokerSettings()


@dataclass(frozen=True)
class Played:
    version: str
    truth: list[dict[str, Any]]
    live: Path  # what the collector landed
    exported: Path  # what export-store read from the store afterwards
    collector_log: str
    collector_exit: int  # after the SIGTERM that stopped it


NONE = pytest.param(None, marks=pytest.mark.skip("ROCKETMQ_VERSIONS names no version but the main one"))


@pytest.fixture(scope="module", params=VERSIONS[1:] or [NONE])
def played(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Played:
    version: str = request.param
    root = tmp_path_factory.mktemp(f"rocketmq-{version}")
    classes = compile_driver(root / "classes")
    truth, live, exported, log = root / "truth.jsonl", root / "live", root / "exported", root / "collector.log"
    with RocketMQ(root, SETTINGS, version=version) as rmq:
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
    lines = [json.loads(line) for line in truth.read_text().splitlines()]
    return Played(version, lines, live, exported, log.read_text(), exit_code)


def test_collect_lands_what_the_store_holds(played: Played) -> None:
    for stream in ("half", "op", "real"):
        live, stored = landed(played.live / stream), landed(played.exported / stream)
        assert stored and live == stored, (played.version, stream, len(live), len(stored))
    runs = whole_passes(played.live)
    assert runs and all(r["status"] == "ok" and not r["errors"] for r in runs), (played.version, runs[-3:])
    assert "Traceback" not in played.collector_log
    assert played.collector_exit == 0 and "collect: stopped by SIGTERM" in played.collector_log


def test_pipeline_matches_what_the_broker_did(spark: SparkSession, config: Config, played: Played) -> None:
    broker = dataclasses.replace(config.broker, transaction_timeout_ms=SETTINGS.transaction_timeout_ms,
                                 check_interval_ms=SETTINGS.check_interval_ms, check_max=SETTINGS.check_max,
                                 op_batch_interval_ms=SETTINGS.op_batch_interval_ms)  # fmt: skip
    name = "t_rocketmq_" + played.version.replace(".", "_")
    cfg = dataclasses.replace(fresh_db(spark, config, name), broker=broker)
    tallies = ingest(spark, cfg, played.live, f"versions-{played.version}")
    assert all(t.quarantined == 0 for t in tallies.values()), tallies
    reconcile(spark, cfg)

    txns = [t for t in played.truth if t["kind"] == "txn"]
    assert Counter(t["fate"] for t in txns)["LATE_COMMIT"] == 5
    want = {t["uniq_key"]: expected(t, SETTINGS.check_max, SETTINGS.check_interval_ms) for t in txns}
    life = {r["uniq_key"]: r for r in spark.table(cfg.table("txn_lifecycle")).collect()}
    assert {k: r["state"] for k, r in life.items()} == {k: e.state for k, e in want.items()}
    rows = spark.table(cfg.table("anomalies")).collect()
    got = {(r["anomaly_type"], r["uniq_key"], r["reason"]) for r in rows if r["uniq_key"] is not None}
    wanted = {(kind, k, reason) for k, e in want.items() for kind, reason in e.anomalies}
    assert got == wanted, (played.version, sorted(got - wanted)[:5], sorted(wanted - got)[:5])
    assert {kind for kind, _, _ in got} >= {"DISCARDED_AFTER_MAX_CHECKS", "ORPHANED_COMMIT"}
    # Every final message reached the consumers, duplicates included.
    consumed = sum(r["messages"] for r in played.truth if r["kind"] == "consumed")
    finals = spark.table(cfg.table("real_events")).where("topic = 'TxnTopic'").count()
    assert consumed == finals == sum(r["commit_count"] for r in life.values())


RIP_82 = ("transRocksDBEnable=true", "transWriteOriginTransHalfEnable=false")


@pytest.mark.skipif("5.5.0" not in VERSIONS[1:], reason="ROCKETMQ_VERSIONS does not name 5.5.0")
def test_a_rip_82_broker_is_reported_not_reconciled(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    classes = compile_driver(tmp_path / "classes")
    live, exported = tmp_path / "live", tmp_path / "exported"
    with RocketMQ(tmp_path, SETTINGS, version="5.5.0", extra_conf=RIP_82) as rmq:
        run_driver(classes, "young", rmq.namesrv, tmp_path / "truth.jsonl", home=tmp_path / "client")
        assert main(["collect", "--namesrv", rmq.namesrv, "--landing", str(live), "--once"]) == 0
        rmq.kill_broker()
    assert main(["export-store", "--store", str(rmq.store), "--landing", str(exported), "--broker-name",
                 rmq.broker_name]) == 0  # fmt: skip
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC 5" in summary and "half 0, op 0, real 0" in summary, summary
    [run] = collect_runs(live)
    assert run["status"] == "partial" and (run["half"], run["op"], run["real"]) == (0, 0, 0), run
    assert [e for e in run["errors"] if "RIP-82" in e and "its 5 halves" in e], run["errors"]
    warnings = [r.getMessage() for r in caplog.records if "RIP-82" in r.getMessage()]
    assert len(warnings) == 2, warnings  # one from each reader
    landed_files = [f for landing in (live, exported) for s in ("half", "op", "real") for f in (landing / s).glob("*")]
    assert landed_files == []
