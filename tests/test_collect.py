"""`txn-recon collect` against a real RocketMQ 5.3.3 broker with ACL on: signed requests are accepted and a
wrong secret gets one clear line; a collector killed in the middle of a pass and run again ends with the
same bronze, after ingest, as an uninterrupted one; one stopped by SIGTERM in the middle of a pass ends it
there, exits 0 and loses nothing. (The scenario collected live, and a broker restart
under a running collector, are in tests/test_real_broker.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.cli import main
from jobs.config import Config
from tests.rocketmq.cluster import BrokerSettings, RocketMQ, compile_driver, run_driver
from tests.test_ingest import fresh_db, ingest, landed, rows

ACL = ("txnrecon", "s3cret-Key-42")
BULK = 30_000


@dataclass(frozen=True)
class Broker:
    rmq: RocketMQ
    root: Path


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("rocketmq-acl")
    classes = compile_driver(root / "classes")
    # No check pass in this module (the interval is an hour): the store stays as the driver left it, so
    # collections at different times must land the same records.
    with RocketMQ(root, BrokerSettings(check_interval_ms=3_600_000), acl=ACL) as rmq:
        for phase, args in (("young", ()), ("bulk", (str(BULK),))):
            run_driver(classes, phase, rmq.namesrv, root / "truth.jsonl", *args, home=root / "client", acl=ACL)
        yield Broker(rmq, root)


def collect(broker: Broker, landing: Path, keys: tuple[str, str] | None, capsys: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:  # fmt: skip
    for name, value in zip(("TXN_RECON_ACCESS_KEY", "TXN_RECON_SECRET_KEY"), keys or (None, None), strict=True):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    code = main(["collect", "--namesrv", broker.rmq.namesrv, "--landing", str(landing), "--once"])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_acl_right_keys_read_wrong_keys_fail_in_one_line(broker: Broker, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    code, out = collect(broker, tmp_path / "right", ACL, capsys, monkeypatch)
    assert code == 0, out
    real = Counter(r["topic"] for r in landed(tmp_path / "right" / "real"))
    assert real["BulkTopic"] == BULK
    assert landed(tmp_path / "right" / "half"), "the young halves"

    code, out = collect(broker, tmp_path / "wrong", (ACL[0], "not-the-secret"), capsys, monkeypatch)
    errors = [line for line in out.splitlines() if line.startswith("txn-recon collect: error:")]
    assert code == 2 and len(errors) == 1, out
    assert "check signature failed" in errors[0] and "access key" in errors[0]
    assert "not-the-secret" not in out and ACL[1] not in out
    assert not (tmp_path / "wrong" / "real").exists()

    code, out = collect(broker, tmp_path / "none", None, capsys, monkeypatch)
    assert code == 2 and "username cannot be null" in out.splitlines()[-1], out


@pytest.mark.spark
def test_a_collector_killed_mid_pass_resumes_and_lands_the_same(broker: Broker, tmp_path: Path, spark: SparkSession,
                                                                config: Config, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    killed = tmp_path / "killed"
    env = dict(os.environ, TXN_RECON_ACCESS_KEY=ACL[0], TXN_RECON_SECRET_KEY=ACL[1])
    cmd = [sys.executable, "-m", "jobs.collect", "--namesrv", broker.rmq.namesrv, "--landing", str(killed), "--once"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any((killed / "real").glob(".*.tmp")):  # a landing file half written: mid-pass
        assert proc.poll() is None and time.monotonic() < deadline, "the pass ended before it could be killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "_collect" / "runs").exists(), "killed before its pass was accounted"

    code, out = collect(broker, killed, ACL, capsys, monkeypatch)
    assert code == 0, out
    code, out = collect(broker, tmp_path / "whole", ACL, capsys, monkeypatch)
    assert code == 0, out
    bronze = {}
    for way in ("killed", "whole"):
        cfg = fresh_db(spark, config, f"t_collect_{way}")
        tallies = ingest(spark, cfg, tmp_path / way, f"collect-{way}")
        assert all(t.quarantined == 0 for t in tallies.values()), tallies
        bronze[way] = {stream: rows(spark, cfg, stream) for stream in ("half", "op", "real")}
    assert bronze["killed"] == bronze["whole"] and len(bronze["whole"]["real"]) == BULK
    assert Counter(r["topic"] for r in landed(killed / "real"))["BulkTopic"] == BULK
    assert not list(killed.rglob(".*.tmp")), "the rerun wrote the killed pass's files whole"
    state = json.loads((killed / "_collect" / "broker-a.json").read_text())
    assert state["passes"] == 1, "the killed pass is redone under its own number, not a new one"


def test_sigterm_mid_pass_stops_cleanly_and_loses_nothing(broker: Broker, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    landing = tmp_path / "stopped"
    env = dict(os.environ, TXN_RECON_ACCESS_KEY=ACL[0], TXN_RECON_SECRET_KEY=ACL[1])
    cmd = [sys.executable, "-m", "jobs.collect", "--namesrv", broker.rmq.namesrv, "--landing", str(landing),
           "--every", "60"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not any((landing / "real").glob(".*.tmp")):  # mid-pass
        assert proc.poll() is None and time.monotonic() < deadline, "the pass ended before it could be stopped"
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "collect: stopped by SIGTERM" in out and "Traceback" not in out, out
    [run] = [json.loads(line) for f in (landing / "_collect" / "runs").glob("*.jsonl") for line in f.open()]
    assert run["status"] == "partial" and run["errors"][0].startswith("stopped by SIGTERM with"), run
    assert 0 < run["real"] < BULK, run  # stopped in the middle, with what it read landed
    assert not list(landing.rglob(".*.tmp")), "a stopped pass leaves no half-written file"

    code, out = collect(broker, landing, ACL, capsys, monkeypatch)
    assert code == 0, out
    assert Counter(r["topic"] for r in landed(landing / "real"))["BulkTopic"] == BULK  # nothing lost, nothing twice
