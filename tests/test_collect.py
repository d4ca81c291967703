"""`txn-recon collect` against a real RocketMQ 5.3.3 broker with ACL on: signed requests are accepted and a
wrong secret gets one clear line; a collector killed in the middle of a pass and run again ends with the
same bronze, after ingest, as an uninterrupted one; one stopped by SIGTERM in the middle of a pass ends it
there, exits 0 and loses nothing; one reading through a faulty network goes on past every fault and lands
what export-store lands. (The scenario collected live, and a broker restart under a running collector, are
in tests/test_real_broker.py.)
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
from typing import Any

import pytest
from pyspark.sql import SparkSession

from jobs.cli import main
from jobs.config import Config
from tests.rocketmq.cluster import BrokerSettings, RocketMQ, compile_driver, run_driver, wait_for
from tests.rocketmq.faults import Blackhole, FaultProxy, with_body
from tests.test_ingest import fresh_db, ingest, landed, rows

ACL = ("txnrecon", "s3cret-Key-42")
BULK = 30_000


@dataclass(frozen=True)
class Broker:
    rmq: RocketMQ
    root: Path
    classes: Path


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("rocketmq-acl")
    classes = compile_driver(root / "classes")
    # No check pass in this module (the interval is an hour): the store stays as the driver left it, so
    # collections at different times must land the same records.
    # The broker listens on 127.0.0.1 alone, so a fault proxy can take its port on 127.0.0.2.
    with RocketMQ(
        root, BrokerSettings(check_interval_ms=3_600_000), acl=ACL, extra_conf=("bindAddress=127.0.0.1",)
    ) as rmq:
        for phase, args in (("young", ()), ("bulk", (str(BULK),))):
            run_driver(classes, phase, rmq.namesrv, root / "truth.jsonl", *args, home=root / "client", acl=ACL)
        yield Broker(rmq, root, classes)


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


def _passes(landing: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted((landing / "_collect" / "runs").glob("*.jsonl"))
            for line in f.read_text().splitlines()]  # fmt: skip


def _whole_files(landing: Path) -> None:
    """Every landing file ingest can see is whole: each line a JSON record, the last one ended."""
    for path in landing.glob("*/*.jsonl"):
        text = path.read_text()
        assert text.endswith("\n"), path
        for line in text.splitlines():
            json.loads(line)


def test_collect_through_a_faulty_network_goes_on_and_loses_nothing(broker: Broker, tmp_path: Path) -> None:
    """Issue 45: `collect --every 1` reads the name server and the broker through fault proxies: answers held
    past its timeout, a connection reset in the middle of a pull answer, a pull answer cut short, a broker
    that accepts and never answers, and a name server that lists a broker which never answers. Messages
    arrive during each fault. Each failure is one line and the collector goes on; once the faults clear,
    its landing holds what export-store lands from the same store, each record once, and no half-written
    file was ever visible."""
    rmq, landing = broker.rmq, tmp_path / "faulty"
    real, proxied = f"127.0.0.1:{rmq.broker_port}", f"127.0.0.2:{rmq.broker_port}"
    to_broker = FaultProxy(("127.0.0.2", rmq.broker_port), ("127.0.0.1", rmq.broker_port), delay_s=3)
    ghost = Blackhole()
    listing = {"ghost": False}
    entry = b'"broker-ghost":{"brokerAddrs":{0:"%s"},"brokerName":"broker-ghost","cluster":"DefaultCluster"},'

    def route(frame: bytes) -> bytes:
        """The broker at its proxy's address; and, while `listing["ghost"]`, a second broker that hangs."""
        frame = frame.replace(real.encode(), proxied.encode())
        if listing["ghost"] and b'"brokerAddrTable":{' in frame:
            add = entry % ghost.address.encode()
            frame = with_body(frame, lambda body: body.replace(b'"brokerAddrTable":{', b'"brokerAddrTable":{' + add))
        return frame

    to_namesrv = FaultProxy(("127.0.0.1", 0), ("127.0.0.1", rmq.namesrv_port), rewrite=route)
    conf = tmp_path / "collect.yaml"
    conf.write_text("collect:\n  timeout_s: 2\n")
    env = dict(os.environ, TXN_RECON_ACCESS_KEY=ACL[0], TXN_RECON_SECRET_KEY=ACL[1])
    cmd = [sys.executable, "-m", "jobs.collect", "--namesrv", to_namesrv.address, "--landing", str(landing),
           "--every", "1", "--conf", str(conf)]  # fmt: skip
    log = tmp_path / "collector.log"
    sent = 0

    def passes_after(n: int) -> None:
        def seen() -> bool:
            return any(r["status"] == "ok" for r in _passes(landing)[n:] if r["broker_name"] == "broker-a")

        wait_for(seen, "a whole pass of broker-a", timeout_s=90)

    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    # Each fault, and what the pass it fails says.
    faults = {"slow": "no answer within 2 s", "reset": "Connection reset", "cut": "connection was closed mid-answer",
              "silent": "no answer within 2 s", "ghost": f"{ghost.address}: no answer within 2 s"}  # fmt: skip
    try:
        passes_after(0)
        for fault, says in faults.items():
            n, touched = len(_passes(landing)), to_broker.faults
            if fault == "ghost":
                listing["ghost"] = True
            else:
                to_broker.mode = fault
            run_driver(broker.classes, "send", rmq.namesrv, tmp_path / "sent.jsonl", "FaultTopic", "200",
                       home=broker.root / "client", acl=ACL)  # fmt: skip
            sent += 200
            if fault != "ghost":
                wait_for(lambda: to_broker.faults > touched, f"the {fault} fault to touch an answer")  # noqa: B023
            try:
                wait_for(lambda: any(says in e for r in _passes(landing)[n:] for e in r["errors"]),  # noqa: B023
                         f"a pass failed by the {fault} fault", timeout_s=90)  # fmt: skip
            except AssertionError as e:
                raise AssertionError(f"{e}: {[r['errors'] for r in _passes(landing)[n:]]}") from None
            _whole_files(landing)
            listing["ghost"], to_broker.mode = False, "pass"
            passes_after(len(_passes(landing)))
        assert proc.poll() is None, "the collector must go on through every fault"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        to_broker.close()
        to_namesrv.close()
        ghost.close()
    assert to_broker.faults > 0
    output = log.read_text()
    assert "Traceback" not in output, output[-3000:]
    errors = [e for r in _passes(landing) for e in r["errors"]]
    assert all("\n" not in e for e in errors), errors

    exported = tmp_path / "exported"
    assert main(["export-store", "--store", str(rmq.store), "--landing", str(exported),
                 "--broker-name", rmq.broker_name]) == 0  # fmt: skip
    for stream in ("half", "op", "real"):
        assert landed(landing / stream) == landed(exported / stream), stream
    assert Counter(r["topic"] for r in landed(landing / "real"))["FaultTopic"] == sent
