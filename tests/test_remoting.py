"""The remoting protocol on frames captured from a real RocketMQ 5.3.3 broker and name server
(tests/data/remoting-5.3.3, recorded by tests/rocketmq/capture_frames.py), and the collector's handling of
each pull answer. No broker runs here."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from schemas.landing import CONSUMER
from sources import client, offsets, remoting, topology
from sources import consumers as consumer_snapshot
from sources.client import HeldQueue
from sources.collector import BrokerRun, BrokerState, _apply
from sources.commitlog import Message, scan
from sources.fastjson import FastjsonError, loads, object_key
from sources.landing_files import ENCODE, Stream
from sources.records import HALF_TOPIC, RECORD
from sources.remoting import Credentials

FRAMES = Path(__file__).parent / "data" / "remoting-5.3.3"
KEYS = Credentials("txnrecon", "s3cret-Key")  # the ACL broker's account when the frames were captured


def answer(name: str) -> remoting.Command:
    return remoting.decode((FRAMES / f"{name}.answer.bin").read_bytes())


def request(name: str) -> remoting.Command:
    frame = (FRAMES / f"{name}.request.bin").read_bytes()
    assert remoting.frame_length(frame[:4]) == len(frame) - 4
    return remoting.decode(frame[4:])


class Canned:
    """Stands in for a socket connection: answers from captured frames, in order."""

    address = "127.0.0.1:10911"

    def __init__(self, *names: str) -> None:
        self.answers = [answer(n) for n in names]

    def call(self, code: int, fields: object = None, body: bytes = b"") -> remoting.Command:
        return self.answers.pop(0)


def test_request_frames_round_trip() -> None:
    pull = request("pull_found")
    assert pull.code == remoting.PULL_MESSAGE and not pull.is_response
    assert pull.fields == {"consumerGroup": "txn_recon_collector", "topic": HALF_TOPIC, "queueId": "0",
                           "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0",
                           "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
                           "expressionType": "TAG"}  # fmt: skip
    assert answer("pull_found").code == remoting.SUCCESS, "the broker took this request"
    assert int(pull.fields["sysFlag"]) & 0x1 == 0, "never FLAG_COMMIT_OFFSET"
    rebuilt = remoting.encode(pull.code, pull.opaque, pull.fields)
    assert rebuilt == (FRAMES / "pull_found.request.bin").read_bytes()


def test_cluster_and_topic_tables() -> None:
    brokers = client.master_brokers(Canned("cluster_info"))  # type: ignore[arg-type]
    assert list(brokers) == ["broker-a"] and brokers["broker-a"][1] == "DefaultCluster"
    assert brokers["broker-a"][0].startswith("127.0.0.1:")
    topics = client.topic_queues(Canned("topic_config"))  # type: ignore[arg-type]
    assert topics[HALF_TOPIC] == 1 and topics["RMQ_SYS_TRANS_OP_HALF_TOPIC"] == 1 and topics["TxnTopic"] == 4


def test_members_and_topic_table_for_the_topology() -> None:
    [member] = client.cluster_members(Canned("cluster_info"))  # type: ignore[arg-type]
    assert (member.cluster, member.broker_name, member.broker_id) == ("DefaultCluster", "broker-a", 0)
    stamp, table = client.topic_table(Canned("topic_config"))  # type: ignore[arg-type]
    assert stamp is not None and stamp > 1_700_000_000_000  # the broker's dataVersion: when it last changed
    # Its business topics: not the system ones, not those the broker made for itself (its name, its cluster's).
    assert {"broker-a", "DefaultCluster", HALF_TOPIC} <= set(table)
    assert topology.business("broker-a", table) == {t: client.Queues(4, 4, 6) for t in ("BulkTopic", "TxnTopic")}


def test_pull_answers() -> None:
    found = client.pull_result(answer("pull_found"))
    assert found.code == remoting.SUCCESS and (found.next_offset, found.min_offset) == (found.max_offset, 0)
    messages = [m for m in scan(found.body, 0) if isinstance(m, Message)]
    assert [m.queue_offset for m in messages] == list(range(found.next_offset or 0))
    assert {m.topic for m in messages} == {HALF_TOPIC} and sum(m.size for m in messages) == len(found.body)
    at_end = client.pull_result(answer("pull_at_end"))
    assert (at_end.code, at_end.next_offset) == (remoting.PULL_NOT_FOUND, found.max_offset)
    moved = client.pull_result(answer("pull_moved"))
    assert (moved.code, moved.next_offset, moved.remark) == (remoting.PULL_OFFSET_MOVED, found.max_offset,
                                                             "OFFSET_OVERFLOW_BADLY")  # fmt: skip
    gone = client.pull_result(answer("pull_no_topic"))
    assert gone.code == remoting.TOPIC_NOT_EXIST and gone.reason.startswith("code 17: topic[NoSuchTopic] not exist")
    assert "\n" not in gone.reason


def test_signature_is_the_one_the_broker_accepted() -> None:
    signed = request("signed_topic_config")
    unsigned = {k: v for k, v in signed.fields.items() if k not in ("AccessKey", "Signature")}
    assert remoting.sign(unsigned, b"", KEYS) == signed.fields
    assert answer("signed_topic_config").code == remoting.SUCCESS
    wrong = answer("wrong_secret_topic_config")
    assert (wrong.code, wrong.remark) == (remoting.NO_PERMISSION, "check signature failed.")
    assert "s3cret" not in repr(KEYS)
    with pytest.raises(client.Refused, match=r"code 16: check signature failed\. \(ACL: check the access key"):
        client.topic_queues(Canned("wrong_secret_topic_config"))  # type: ignore[arg-type]


def test_signature_covers_fields_in_key_order_and_the_body() -> None:
    a = remoting.sign({"b": "2", "a": "1"}, b"body", KEYS)["Signature"]
    assert a == remoting.sign({"a": "1", "b": "2"}, b"body", KEYS)["Signature"]
    assert a != remoting.sign({"a": "1", "b": "2"}, b"other", KEYS)["Signature"]
    assert a != remoting.sign({"a": "2", "b": "1"}, b"body", KEYS)["Signature"]


def test_binary_header_answers_decode() -> None:
    """A broker started with -Drocketmq.serialize.type=ROCKETMQ answers in RocketMQSerializable's layout."""
    ext = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v
                   for k, v in ((b"nextBeginOffset", b"20"), (b"maxOffset", b"20")))  # fmt: skip
    remark = b"OFFSET_OVERFLOW_ONE"
    header = (struct.pack(">hbhii", 19, 0, 479, 7, 1) + struct.pack(">i", len(remark)) + remark
              + struct.pack(">i", len(ext)) + ext)  # fmt: skip
    cmd = remoting.decode(struct.pack(">i", (1 << 24) | len(header)) + header + b"xyz")
    assert (cmd.code, cmd.opaque, cmd.is_response, cmd.remark) == (19, 7, True, "OFFSET_OVERFLOW_ONE")
    assert cmd.fields == {"nextBeginOffset": "20", "maxOffset": "20"} and cmd.body == b"xyz"


@pytest.mark.parametrize("frame", [b"", b"\x00\x00\x00\x10{}", b"\x07\x00\x00\x02{}", b"\x00\x00\x00\x02[]"])
def test_bad_frames_are_protocol_errors(frame: bytes) -> None:
    with pytest.raises(remoting.ProtocolError):
        remoting.decode(frame)


def test_fastjson_bare_integer_keys() -> None:
    text = '{"a":{0:"127.0.0.1:1", 1 :"x,2:y"},"b":[1,2],"c":"{3:4}","d":"q\\"{5:6}","e":{-1:7}}'
    assert loads(text) == {"a": {"0": "127.0.0.1:1", "1": "x,2:y"}, "b": [1, 2], "c": "{3:4}", "d": 'q"{5:6}',
                           "e": {"-1": 7}}  # fmt: skip


def test_fastjson_object_keys_and_bad_text() -> None:
    text = '{"mqTable":{{"topic":"T","queueId":2,"brokerName":"b"}:{"commitOffset":5}},"n":[1.5,-2e3,true,null]}'
    doc = loads(text)
    assert doc == {"mqTable": {object_key({"brokerName": "b", "queueId": 2, "topic": "T"}): {"commitOffset": 5}},
                   "n": [1.5, -2e3, True, None]}  # fmt: skip
    for bad in ('{"a":1', '{"a" 1}', "{a:1}", '{"a":1} x', '{"a":"x}'):
        with pytest.raises(FastjsonError):
            loads(bad)


def test_a_group_whose_members_subscribe_differently() -> None:
    """Captured from CG_CONFLICT (Scenario.java `conflict`): one member on TopicA, one on TopicB. The broker
    keeps one subscription table for the group, and it holds TopicA only: the TopicB member's was
    overwritten. Each member holds its own topic's share of the queues (2 of 4, allocated over both
    members): the other two queues of each topic belong to a member that does not subscribe to it."""
    group = client.consumer_connections(Canned("consumer_connections"), "CG_CONFLICT")  # type: ignore[arg-type]
    assert group is not None
    members = sorted(c["clientId"].split("@")[1] for c in group["connectionSet"])
    assert members == ["member-TopicA", "member-TopicB"] and group["messageModel"] == "CLUSTERING"
    assert sorted(group["subscriptionTable"]) == ["%RETRY%CG_CONFLICT", "TopicA"]
    held = {}
    for member in ("topica", "topicb"):
        subs, queues = client.consumer_running_info(Canned(f"running_info_{member}"), "CG_CONFLICT", "x")  # type: ignore[arg-type]
        held[member] = ({s["topic"] for s in subs}, {(q.topic, q.queue_id): q.commit_offset for q in queues})
    assert held["topica"][0] == {"%RETRY%CG_CONFLICT", "TopicA"}
    assert held["topicb"][0] == {"%RETRY%CG_CONFLICT", "TopicB"}
    assert held["topica"][1] == {("%RETRY%CG_CONFLICT", 0): 0, ("TopicA", 0): 5, ("TopicA", 1): 5}
    assert held["topicb"][1] == {("TopicB", 2): 5, ("TopicB", 3): 5}


def test_the_conflict_as_consumer_landing_records() -> None:
    """The captured answers as the `consumer` stream: each member's subscriptions and held queues, then the
    table the broker kept; a queue being dropped is left out and an offset of -1 lands as null."""
    group = client.consumer_connections(Canned("consumer_connections"), "CG_CONFLICT")  # type: ignore[arg-type]
    assert group is not None
    members = {cid: client.consumer_running_info(Canned(f"running_info_{cid.split('-')[-1].lower()}"),  # type: ignore[arg-type]
                                                 "CG_CONFLICT", cid)
               for cid in consumer_snapshot.client_ids(group)}  # fmt: skip
    records = consumer_snapshot.snapshot_records(7, "CG_CONFLICT", {"broker-a": group}, members)
    by_who = Counter((r[3] or "broker").split("@")[-1] + " " + r[2] for r in records)
    assert by_who == {"member-TopicA subscription": 2, "member-TopicA queue": 3, "member-TopicB subscription": 2,
                      "member-TopicB queue": 2, "broker subscription": 2}  # fmt: skip
    assert all(len(r) == len(CONSUMER.names) and r[:2] == (7, "CG_CONFLICT") for r in records)
    table = sorted((r[4], r[6]) for r in records if r[3] is None)
    assert table == [("%RETRY%CG_CONFLICT", "broker-a"), ("TopicA", "broker-a")]
    held = [HeldQueue("broker-a", "T", 0, -1, False), HeldQueue("broker-a", "T", 1, 4, True)]
    [(_, _, kind, _, topic, _, broker, queue_id, offset)] = [
        r for r in consumer_snapshot.snapshot_records(7, "g", {}, {"c": ([], held)}) if r[2] == "queue"
    ]
    assert (kind, topic, broker, queue_id, offset) == ("queue", "T", "broker-a", 0, None)


def test_consumer_offsets_answer_holds_the_check_services_progress() -> None:
    """GET_ALL_CONSUMER_OFFSET answers with consumerOffset.json's format; the check service's own group is
    there (op lag), and it is not a business consumer's offset."""
    table = offsets.parse(answer("consumer_offsets").body.decode())
    assert table == {f"{HALF_TOPIC}@CID_RMQ_SYS_TRANS": {0: 20}}
    assert offsets.business_offsets(table) == ({}, 1)


def apply(name: str, position: int, tmp_path: Path) -> tuple[bool, BrokerState, BrokerRun, Stream]:
    state = BrokerState(positions={(HALF_TOPIC, 0): position})
    run = BrokerRun("broker-a", None, None)  # type: ignore[arg-type]
    streams = {s: Stream(tmp_path / s, "t", ENCODE[s]) for s in RECORD}
    more = _apply(client.pull_result(answer(name)), (HALF_TOPIC, 0), "broker-a", state, streams, {}, run, Counter(),
                  None)  # type: ignore[arg-type]  # fmt: skip
    for s in streams.values():
        s.close()
    return more, state, run, streams["half"]


def test_collector_takes_each_pull_answer(tmp_path: Path) -> None:
    more, state, run, half = apply("pull_found", 0, tmp_path / "found")
    end = client.pull_result(answer("pull_found")).max_offset
    assert (more, state.positions[(HALF_TOPIC, 0)], half.total, run.errors) == (False, end, end, [])
    more, state, run, half = apply("pull_at_end", end or 0, tmp_path / "end")
    assert (more, state.positions[(HALF_TOPIC, 0)], half.total, run.errors) == (False, end, 0, [])
    # Past the end (the topic was re-created, or another store): read again from where the queue ends.
    more, state, run, _ = apply("pull_moved", 10**6, tmp_path / "moved")
    assert state.positions[(HALF_TOPIC, 0)] == end and run.errors == [f"{HALF_TOPIC} queue 0: offset moved back "
                                                                      f"from {10**6} to {end}"]  # fmt: skip
    more, state, run, _ = apply("pull_no_topic", 3, tmp_path / "gone")
    assert (more, state.positions, run.errors) == (False, {}, [f"topic {HALF_TOPIC} deleted"])


def test_collect_needs_no_spark_and_says_in_one_line_when_nothing_answers(tmp_path: Path) -> None:
    argv = ["collect", "--namesrv", "127.0.0.1:1;127.0.0.1:2", "--landing", str(tmp_path), "--once"]
    probe = (f"import sys; from jobs.cli import main; code = main({argv!r}); "
             "print('spark' if 'pyspark' in sys.modules else 'none', code)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "none 1", done.stdout + done.stderr
    err = done.stderr.strip().splitlines()
    assert err[-1].startswith("txn-recon collect: failed: nothing could be read: no name server answered: "
                              "127.0.0.1:1: cannot connect"), err  # fmt: skip
    assert "127.0.0.1:2: cannot connect" in err[-1] and "Traceback" not in done.stderr
    runs = [json.loads(line) for f in (tmp_path / "_collect" / "runs").glob("*.jsonl") for line in f.open()]
    assert [(r["broker_name"], r["status"]) for r in runs] == [(None, "failed")]


@pytest.mark.parametrize("namesrv", ["", "localhost", "host:port;"])
def test_collect_rejects_a_bad_name_server_list(namesrv: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from jobs.cli import main

    assert main(["collect", "--namesrv", namesrv, "--landing", str(tmp_path), "--once"]) == 2
    assert capsys.readouterr().err.startswith("txn-recon collect: error: --namesrv")
