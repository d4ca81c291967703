"""The message-trace rules (transforms/trace.py) end to end on landing records written by hand: ingest, then
reconcile; every cause of a discard, a lost answer, a contradiction, a duplicate linked to its regression, a
failed attempt, and a malformed context quarantined beside the good ones."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from jobs.cli import main
from jobs.config import Config
from jobs.reconcile import reconcile
from jobs.report import LATENCY_WINDOW_MS, _trace
from jobs.story import story
from jobs.web import Health, Metrics, start_http
from tests.test_ingest import fresh_db, ingest
from transforms.frames import gathered

pytestmark = pytest.mark.spark
T = 1_767_225_600_000
HALF_TOPIC, DISCARD = "RMQ_SYS_TRANS_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"


class Landing:
    """Records by stream, with dense offsets per queue, written as JSON Lines."""

    def __init__(self) -> None:
        self.records: dict[str, list[dict[str, Any]]] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}

    def add(self, stream: str, topic: str, queue: int, at: int, **fields: Any) -> int:
        offset = self.offsets.get((stream, topic, queue), 0)
        self.offsets[(stream, topic, queue)] = offset + 1
        rec = {"broker_name": "b", "queue_id": queue, "queue_offset": offset, "commit_log_offset": 1000 + offset,
               "store_timestamp": at, "born_timestamp": at, **fields}  # fmt: skip
        if stream != "half":
            rec["topic"] = topic
        self.records.setdefault(stream, []).append(rec)
        return offset

    def half(self, key: str, group: str, at: int, checks: int = 0, every: int = 2000) -> list[int]:
        """The original and `checks` check copies, `every` ms apart; their queue offsets."""
        base = {"uniq_key": key, "producer_group": group, "real_topic": "TopicC", "real_queue_id": 0}
        return [self.add("half", HALF_TOPIC, 0, at + i * every, **base, **({"check_times": i} if i else {}))
                for i in range(checks + 1)]  # fmt: skip

    def real(self, key: str, topic: str, at: int, committed: bool = False, prepared: int | None = None) -> int:
        return self.add("real", topic, 0, at, uniq_key=key, sys_flag=8 if committed else 0, transactional=committed,
                        prepared_transaction_offset=prepared)  # fmt: skip

    def op(self, at: int, *offsets: int) -> None:
        self.add("op", "RMQ_SYS_TRANS_OP_HALF_TOPIC", 0, at, tag="d", body="".join(f"{o}," for o in offsets))

    def trace(self, kind: str, at: int, host: str = "10.0.0.1:1", **fields: Any) -> None:
        # The client's clock is an hour behind: the rules read broker times through the message's own times.
        skew = -3_600_000
        self.add("trace", "RMQ_SYS_TRACE_TOPIC", 0, at + 5, born_timestamp=at + 4 + skew, born_host=host,
                 context_index=0, trace_type=kind, timestamp=at + skew, **fields)  # fmt: skip

    def write(self, root: Path) -> Path:
        for stream, records in self.records.items():
            (root / stream).mkdir(parents=True, exist_ok=True)
            (root / stream / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return root


def answer(land: Landing, key: str, group: str, at: int, state: str, from_check: bool = True) -> None:
    land.trace("EndTransaction", at, group_name=group, uniq_key=key, transaction_state=state, from_check=from_check)


def story_landing() -> Landing:
    land = Landing()
    # Answered UNKNOW at each of its 3 checks, then discarded.
    land.half("K-UNKNOWN", "PG", T, checks=3)
    land.trace("Pub", T, group_name="PG", uniq_key="K-UNKNOWN", msg_type="Trans_Msg_Half", success=True)
    for i in (1, 2, 3):
        answer(land, "K-UNKNOWN", "PG", T + i * 2000 + 10, "UNKNOW")
    land.real("K-UNKNOWN", DISCARD, T + 8000)
    # Same group, same times: no answer while the group traced the answers above (no check reached it).
    land.half("K-NO-CALLBACK", "PG", T, checks=3)
    land.trace("Pub", T, group_name="PG", uniq_key="K-NO-CALLBACK", msg_type="Trans_Msg_Half", success=True)
    land.real("K-NO-CALLBACK", DISCARD, T + 8000)
    # Its group traced its send and then nothing: gone.
    land.half("K-GONE", "PG_GONE", T, checks=3)
    land.trace("Pub", T, group_name="PG_GONE", uniq_key="K-GONE", msg_type="Trans_Msg_Half", success=True)
    land.real("K-GONE", DISCARD, T + 8000)
    # A group that traces nothing: its discard has no cause.
    land.half("K-QUIET", "PG_QUIET", T, checks=3)
    land.real("K-QUIET", DISCARD, T + 8000)
    # COMMIT answered to check 1 and lost; answered again at check 2, which commits.
    lost = land.half("K-LOST", "PG", T, checks=2, every=5000)
    answer(land, "K-LOST", "PG", T + 5010, "COMMIT_MESSAGE")
    answer(land, "K-LOST", "PG", T + 10_010, "COMMIT_MESSAGE")
    land.real("K-LOST", "TopicC", T + 10_020, committed=True, prepared=1000 + lost[2])
    land.op(T + 10_100, lost[2])
    # A broker restarted behind its check progress checks a copy and the copy an earlier check of it wrote, in one
    # pass, and both are answered COMMIT at once. The first answer is lost and the second commits, or the other
    # way round; the copy whose answer was lost is checked again, and that answer commits.
    for key, arrives in (("K-LOST-FIRST-OF-TWO", 1), ("K-LOST-SECOND-OF-TWO", 0)):
        fields = {"uniq_key": key, "producer_group": "PG", "real_topic": "TopicC", "real_queue_id": 0}
        land.add("half", HALF_TOPIC, 0, T, **fields)
        both = [land.add("half", HALF_TOPIC, 0, T + 5000, **fields, check_times=n) for n in (1, 2)]
        again = land.add("half", HALF_TOPIC, 0, T + 10_000, **fields, check_times=2)
        for at, answers, copy in ((T + 5010, 2, both[arrives]), (T + 10_010, 1, again)):
            for _ in range(answers):
                answer(land, key, "PG", at, "COMMIT_MESSAGE")
            land.real(key, "TopicC", at + 10, committed=True, prepared=1000 + copy)
            land.op(at + 90, copy)
    # A check answer traced where no check copy was ever stored.
    first = land.half("K-NO-CHECK", "PG", T)
    answer(land, "K-NO-CHECK", "PG", T + 3000, "ROLLBACK_MESSAGE")
    land.op(T + 3100, first[0])
    # Consumption: M0 consumed twice (the group's offset went back from 3 to 0), M1 failed once then consumed.
    for key in ("M0", "M1", "M2"):
        land.real(key, "TopicM", T)
    for group_offset, at, client in ((3, T + 1000, "c1"), (0, T + 2000, "c2")):
        land.records.setdefault("offset", []).append(
            {"broker_name": "b", "consumer_group": "CG", "topic": "TopicM", "queue_id": 0, "offset": group_offset,
             "commit_timestamp": at, "client_id": client})  # fmt: skip
    attempts = [("M0", "10.0.0.7:1", True), ("M1", "10.0.0.7:1", False), ("M1", "10.0.0.7:1", True),
                ("M2", "10.0.0.7:1", True), ("M0", "10.0.0.8:1", True)]  # fmt: skip
    for n, (key, host, ok) in enumerate(attempts):
        at = T + 500 + n * 1000
        land.trace("SubBefore", at, host, group_name="CG", request_id=f"R{n}", uniq_key=key, retry_times=0)
        land.trace("SubAfter", at + 3, host, group_name="CG", request_id=f"R{n}", uniq_key=key, success=ok, cost_ms=3)
    # A context its reader could not decode: quarantined with the reason it gives.
    land.add("trace", "RMQ_SYS_TRACE_TOPIC", 0, T, born_host="h:1", context_index=0, malformed="unknown trace type 'X'",
             raw="X\x011")  # fmt: skip
    return land


@pytest.fixture(scope="module")
def traced(spark: SparkSession, config: Config, tmp_path_factory: pytest.TempPathFactory) -> Config:
    landing = story_landing().write(tmp_path_factory.mktemp("trace") / "landing")
    broker = dataclasses.replace(config.broker, check_max=3, check_interval_ms=2000, transaction_timeout_ms=1000)
    thresholds = dataclasses.replace(config.thresholds, op_grace_ms=1000)
    cfg = dataclasses.replace(fresh_db(spark, config, "t_trace_rules"), broker=broker, thresholds=thresholds)
    tallies = ingest(spark, cfg, landing, "trace-rules")
    assert tallies["trace"].quarantined == 1 and tallies["trace"].inserted == len(story_landing().records["trace"]) - 1
    reasons = [r["reason"] for r in spark.table(cfg.table("quarantine")).collect()]
    assert reasons == ["malformed trace context: unknown trace type 'X'"]
    reconcile(spark, cfg)
    return cfg


def found(spark: SparkSession, cfg: Config, kind: str) -> dict[str, dict[str, Any]]:
    rows = spark.table(cfg.table("anomalies")).where(f"anomaly_type = '{kind}'").collect()
    return {r["uniq_key"]: {**r.asDict(), "detail": json.loads(r["detail"])} for r in rows}


def test_each_discard_says_why_from_its_groups_trace(spark: SparkSession, traced: Config) -> None:
    discards = {k: (f["detail"]["cause"], f["detail"]["answers"])
                for k, f in found(spark, traced, "DISCARDED_AFTER_MAX_CHECKS").items()}  # fmt: skip
    nothing = {"unknown": 0, "commit": 0, "rollback": 0, "unanswered": 3}
    assert discards == {
        "K-UNKNOWN": ("ANSWERED_UNKNOWN", {"unknown": 3, "commit": 0, "rollback": 0, "unanswered": 0}),
        "K-NO-CALLBACK": ("CHECKS_WITHOUT_CALLBACK", nothing),
        "K-GONE": ("UNANSWERED", nothing),
        "K-QUIET": (None, None),
    }


def test_a_lost_answer_and_an_answer_to_no_check(spark: SparkSession, traced: Config) -> None:
    lost = found(spark, traced, "CHECK_ANSWER_LOST")
    assert sorted(lost) == ["K-LOST", "K-LOST-FIRST-OF-TWO"]
    assert {f["event_ts"] for f in lost.values()} == {T + 5010 + 1}  # broker time: store minus born
    assert {f["detail"]["decision"] for f in lost.values()} == {"COMMIT_MESSAGE"}
    contradictions = found(spark, traced, "TRACE_CONTRADICTION")
    assert {k: f["reason"] for k, f in contradictions.items()} == {"K-NO-CHECK": "ANSWER_WITHOUT_CHECK"}


def test_consumed_twice_is_linked_to_the_regression_and_a_failure_is_counted(spark: SparkSession,
                                                                             traced: Config) -> None:  # fmt: skip
    [twice] = found(spark, traced, "DUPLICATE_CONSUMPTION").values()
    assert (twice["uniq_key"], twice["consumer_group"], twice["topic"]) == ("M0", "CG", "TopicM")
    assert [a["instance"] for a in twice["detail"]["attempts"]] == ["10.0.0.7:1", "10.0.0.8:1"]
    [regression] = found(spark, traced, "OFFSET_REGRESSION").values()
    assert twice["detail"]["explained_by"] == [{"type": "OFFSET_REGRESSION", "anomaly_id": regression["anomaly_id"]}]
    [failed] = found(spark, traced, "CONSUME_FAILED").values()
    assert (failed["uniq_key"], failed["detail"]["failed"], failed["detail"]["consumed"]) == ("M1", 1, 1)


def test_the_dashboard_times_each_groups_first_attempt_from_its_store_time(spark: SparkSession, traced: Config) -> None:
    """M0, M1 and M2 were stored at T and first tried at T + 501, 1,501 and 3,501 in broker time (M0 again later):
    their latencies. An hour later the window holds no trace: no latency."""
    tables = {n: spark.table(traced.table(n)) for n in ("anomalies", "trace_events", "real_events")}
    as_of = spark.table(traced.table("reconcile_runs")).collect()[0]["as_of"]
    latency = ("consumer_group", "latency_p50_s", "latency_p99_s", "traced_last_hour")

    def shown(at: int) -> list[tuple[Any, ...]]:
        [trace] = gathered(_trace(tables["anomalies"], tables["trace_events"], tables["real_events"], at))
        return [tuple(g[c] for c in latency) for g in trace["groups"] if g["traced_last_hour"] is not None]

    assert shown(as_of) == [("CG", 1.501, 3.501, 3)]
    assert shown(as_of + LATENCY_WINDOW_MS + 10_000) == []


def test_the_story_of_one_message_in_time_order(spark: SparkSession, traced: Config) -> None:
    events = story(spark, traced, "K-LOST")
    assert [e["event"] for e in events if e["at"] is not None] == [
        "half stored", "check", "answer", "finding", "check", "answer", "stored", "op"]  # fmt: skip
    assert [e["what"] for e in events if e["event"] == "answer"] == [
        "answer to a check: COMMIT_MESSAGE by PG from 10.0.0.1:1"
    ] * 2
    assert any(e["event"] == "finding" and e["what"] == "CHECK_ANSWER_LOST" for e in events)
    consumed = [e["what"] for e in story(spark, traced, "M0") if e["event"] == "consumption"]
    assert consumed == ["group CG on 10.0.0.7:1: consumed in 3 ms, retry 0", "group CG on 10.0.0.8:1: consumed in "
                        "3 ms, retry 0"]  # fmt: skip


def test_the_command_and_serve_tell_it_and_an_unknown_key_is_one_line(
    spark: SparkSession, traced: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "db.yaml"
    conf.write_text(f"database: {traced.database}\n")
    common = ["--warehouse", traced.warehouse, "--conf", str(conf)]
    assert main(["trace", "K-GONE", "--format", "json", *common]) == 0
    events = json.loads(capsys.readouterr().out)
    assert [e["event"] for e in events if e["event"] in ("check", "discarded")] == ["check"] * 3 + ["discarded"]
    assert main(["trace", "NOPE", *common]) == 2
    assert (
        capsys.readouterr().err.strip() == f"txn-recon trace: error: no message with UNIQ_KEY NOPE in {traced.database}"
    )
    server = start_http("127.0.0.1:0", Metrics(), Health(60, 3, tmp_path / "none.html"),
                        trace=lambda key: story(spark, traced, key))  # fmt: skip
    base = "http://{}:{}/trace/".format(*server.server_address[:2])
    try:
        with urllib.request.urlopen(base + "K-GONE?format=json", timeout=60) as answer:
            assert json.loads(answer.read()) == events
        with urllib.request.urlopen(base + "K-GONE", timeout=60) as answer:
            page = answer.read().decode()
            assert "<h1>K-GONE</h1>" in page and "DISCARDED_AFTER_MAX_CHECKS" in page
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "NOPE", timeout=60)
        assert missing.value.code == 404
    finally:
        server.shutdown()
