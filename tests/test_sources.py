"""The store decoders (no Spark): bytes a real 5.3.3 broker wrote (tests/data/rocketmq-5.3.3, captured from
the real-broker scenario) and hand-built records for the edges, and the export-store job on both."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from jobs.cli import main
from sources import client, offsets, topology
from sources.commitlog import BLANK_MAGIC, ZERO_SPAN, Corrupt, DataEnd, FileEnd, Message, properties, scan
from sources.records import copy_record, half_log_offset, half_record, real_record, rocksdb_op_record, stream_of
from tests.store_encoding import encode

CAPTURED = Path(__file__).parent / "data" / "rocketmq-5.3.3"
OP = frozenset({"RMQ_SYS_TRANS_OP_HALF_TOPIC"})


def messages(buf: bytes, base: int = 0) -> list[Message]:
    return [e for e in scan(buf, base, 0, OP) if isinstance(e, Message)]


def test_a_real_brokers_first_file() -> None:
    buf = (CAPTURED / "commitlog-00000000000000000000").read_bytes()
    entries = list(scan(buf, 0, 0, OP))
    assert isinstance(entries[-1], FileEnd) and len(buf) - entries[-1].position < 600  # no room for one more
    found = [e for e in entries if isinstance(e, Message)]
    assert all(m.physical_offset == m.position for m in found)  # the broker writes each record's own offset
    assert [m.position for m in found[1:]] == [m.position + m.size for m in found[:-1]]  # back to back
    halves = [m for m in found if m.topic == "RMQ_SYS_TRANS_HALF_TOPIC"]
    assert [m.queue_offset for m in halves] == list(range(len(halves)))  # the half queue is dense
    half_props = [properties(m.properties) for m in halves]
    assert {p["REAL_TOPIC"] for p in half_props} == {"TxnTopic"}
    assert {p["PGROUP"] for p in half_props} == {"PG_MAIN", "PG_GONE"}
    assert all(p["__transactionId__"] == p["UNIQ_KEY"] and p["TRAN_MSG"] == "true" for p in half_props)
    # A final message points at the half copy it committed, which carries its UNIQ_KEY.
    by_position = {m.position: properties(m.properties)["UNIQ_KEY"] for m in halves}
    finals = [m for m in found if m.topic == "TxnTopic"]
    assert finals and all(m.sys_flag & 0xC == 8 for m in finals)
    assert all(by_position[m.prepared_transaction_offset] == properties(m.properties)["UNIQ_KEY"] for m in finals)


def test_a_real_brokers_ops_discards_and_end_of_data() -> None:
    buf = (CAPTURED / "commitlog-00000000000000196608").read_bytes()
    entries = list(scan(buf, 196_608, 0, OP))
    assert entries[-1] == DataEnd(249_444)
    found = [e for e in entries if isinstance(e, Message)]
    ops = [m for m in found if m.topic == "RMQ_SYS_TRANS_OP_HALF_TOPIC"]
    assert ops and all(properties(m.properties)["TAGS"] == "d" for m in ops)
    listed = [t for m in ops for t in (m.body or b"").decode().split(",") if t]
    assert listed and all(t.isdigit() for t in listed) and (ops[0].body or b"").endswith(b",")  # 5.1+ batches
    discards = [properties(m.properties) for m in found if m.topic == "TRANS_CHECK_MAX_TIME_TOPIC"]
    assert discards and {p["TRANSACTION_CHECK_TIMES"] for p in discards} == {"3"}  # check max 3
    assert all("REAL_TOPIC" in p and "PGROUP" in p for p in discards)


def test_both_magic_codes_ipv6_hosts_and_properties() -> None:
    a = encode("orders", {"UNIQ_KEY": "u1", "TAGS": "t"})
    b = encode("t" * 200, {"UNIQ_KEY": "u2"}, position=len(a), v2=True, ipv6=True, body=b"")
    m1, m2 = messages(a + b + bytes(16))
    assert (m1.topic, m1.store_timestamp, m1.born_timestamp, m1.body_size) == ("orders", 2_000, 1_000, 1)
    assert (m2.topic, m2.store_timestamp, m2.body_size, m2.position) == ("t" * 200, 2_000, 0, len(a))
    assert properties("A\x01a\x02junk\x02B\x01\x02\x01c\x02") == {"A": "a", "B": ""}
    assert properties("A\x01a\x01b\x02") == {"A": "a\x01b"} and properties("") == {}


def test_blank_record_ends_the_file_and_zeros_end_the_data() -> None:
    a = encode("orders", {"UNIQ_KEY": "u"})
    blank = struct.pack(">ii", 100, BLANK_MAGIC)
    assert list(scan(a + blank + bytes(92), 0))[-1] == FileEnd(len(a))
    assert list(scan(a + bytes(40), 0))[-1] == DataEnd(len(a))
    assert list(scan(a, 0))[-1] == DataEnd(len(a))


def test_a_record_still_being_written_is_left_for_the_next_run() -> None:
    a, b = encode("orders", {"UNIQ_KEY": "u"}), encode("orders", {"UNIQ_KEY": "v"}, position=1)
    torn = a + b[:30] + bytes(len(b) - 30 + 64)  # its head is there, the rest is still zeros
    assert list(scan(torn, 0))[-1] == DataEnd(len(a), incomplete=True)


def test_corrupt_records_are_reported_and_skipped() -> None:
    a, b, c = (encode("orders", {"UNIQ_KEY": k}) for k in "abc")
    bad_crc = b[:8] + struct.pack(">i", 12345) + b[12:]
    entries = list(scan(a + bad_crc + c + bytes(8), 0))
    assert [type(e).__name__ for e in entries] == ["Message", "Corrupt", "Message", "DataEnd"]
    assert entries[1] == Corrupt(len(a), "body CRC mismatch", len(a) + len(b))
    garbage = a + b"\x01" * 50 + bytes(8)
    assert list(scan(garbage, 0))[1] == Corrupt(len(a), "bad magic code 0x01010101", None)


def test_zeros_end_the_data_unless_a_record_follows_soon_after_them() -> None:
    """A lost page in the middle is a corrupt span the scan resumes after; zeros with no record within
    ZERO_SPAN after them are the end of what the broker wrote (a run does not read a preallocated file whole)."""
    a = encode("orders", {"UNIQ_KEY": "a"})
    b = encode("orders", {"UNIQ_KEY": "b"}, position=len(a) + 4096)
    entries = list(scan(a + bytes(4096) + b + bytes(8), 0))
    assert [type(e).__name__ for e in entries] == ["Message", "Corrupt", "Message", "DataEnd"]
    assert entries[1] == Corrupt(len(a), "4096 zero bytes before the next record", len(a) + 4096)
    far = a + bytes(ZERO_SPAN + 8) + encode("orders", {"UNIQ_KEY": "b"}, position=len(a) + ZERO_SPAN + 8)
    assert list(scan(far, 0))[1:] == [DataEnd(len(a))]


def test_records_by_topic() -> None:
    assert [stream_of(t) for t in ("RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                                   "TRANS_CHECK_MAX_TIME_TOPIC", "orders", "%RETRY%g", "%DLQ%g", "SCHEDULE_TOPIC_XXXX",
                                   "rmq_sys_wheel_timer", "TBW102", "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC",
                                   "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC")] == [
        "half", "op", "real", "real", "copy", "copy", "copy", None, None, "half", "op"]  # fmt: skip
    props = {
        "UNIQ_KEY": "u",
        "PGROUP": "pg",
        "REAL_TOPIC": "orders",
        "REAL_QID": "3",
        "TRANSACTION_CHECK_TIMES": "2",
        "TRAN_PREPARED_QUEUE_OFFSET": "7",
        "CHECK_IMMUNITY_TIME_IN_SECONDS": "10",
        "__transactionId__": "u",
    }
    [h] = messages(encode("RMQ_SYS_TRANS_HALF_TOPIC", props, queue_offset=5))
    assert half_record("b", h) == ("b", 0, 5, 0, 2_000, 1_000, "u", "u", "pg", "orders", 3, 2, 10, 7, None, None, 1,
                                   None)  # fmt: skip
    # RIP-82: a half of the RocksDB topic says so; its op names the half by commit-log offset and is landed
    # listing the half's queue offset, which its reader looked up.
    [r] = messages(encode("RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC", props, queue_offset=5))
    assert half_record("b", r)[-1] == "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC"
    [op] = messages(
        encode("RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC", {"TRANS_OFFSET": "4096", "TAGS": "d"}, queue_offset=2)
    )
    assert half_log_offset(op) == 4096
    assert rocksdb_op_record("b", op, 5)[-3:] == ("d", "5", "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC")
    commit = {"UNIQ_KEY": "u", "TRAN_MSG": "true"}
    [c] = messages(encode("orders", commit, sys_flag=8, prepared=0))
    assert real_record("b", c)[8:11] == (8, True, 0)  # offset 0 is the store's first half: kept
    [n] = messages(encode("orders", {"UNIQ_KEY": "n"}))
    assert real_record("b", n)[8:11] == (0, False, None)
    # A group's copy of a committed transactional message keeps its flags and properties: a copy, never real.
    sent_back = {"UNIQ_KEY": "u", "TRAN_MSG": "true", "__transactionId__": "tx", "RETRY_TOPIC": "orders",
                 "ORIGIN_MESSAGE_ID": "M", "TAGS": "A", "KEYS": "k"}  # fmt: skip
    [d] = messages(encode("%DLQ%g", sent_back, sys_flag=8, queue_offset=3))
    assert copy_record("b", d) == ("b", "%DLQ%g", 0, 3, 0, 2_000, 1_000, "g", "dead_letter", "orders", "M", "u", 0,
                                   True, "tx", "A", "k")  # fmt: skip
    [p] = messages(encode("%RETRY%g+orders", {"RETRY_TOPIC": "orders"}))  # a pop consumer's retry topic
    assert (copy_record("b", p) or ())[7:10] == ("g", "retry", "orders")
    # A send-back waits for its delay in the schedule topic, bound for the retry topic; a producer's own
    # delayed message waits there too, and is no copy.
    [w] = messages(encode("SCHEDULE_TOPIC_XXXX", {**sent_back, "REAL_TOPIC": "%RETRY%g", "REAL_QID": "0",
                                                  "DELAY": "4"}, queue_offset=7))  # fmt: skip
    assert copy_record("b", w) == ("b", "SCHEDULE_TOPIC_XXXX", 0, 7, 0, 2_000, 1_000, "g", "scheduled", "orders",
                                   "M", "u", 0, True, "tx", "A", "k")  # fmt: skip
    [later] = messages(encode("SCHEDULE_TOPIC_XXXX", {"UNIQ_KEY": "v", "REAL_TOPIC": "orders", "DELAY": "2"}))
    assert copy_record("b", later) is None


def test_consumer_offset_file_of_a_real_broker() -> None:
    table = offsets.parse((CAPTURED / "consumerOffset.json").read_text())
    assert table["RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS"] == {0: 361}
    business, skipped = offsets.business_offsets(table)
    assert business == {("CG_RECON", "TxnTopic", q): 0 for q in range(4)} and skipped == 3
    assert offsets.changed({("CG_RECON", "TxnTopic", 0): 0, ("CG_RECON", "TxnTopic", 1): 9}, business) == [
        ("CG_RECON", "TxnTopic", 1), ("CG_RECON", "TxnTopic", 2), ("CG_RECON", "TxnTopic", 3)]  # fmt: skip
    with pytest.raises(offsets.OffsetFileError):
        offsets.parse('{"dataVersion": {}}')


def store_with(files: dict[int, bytes], root: Path, offsets_text: str | None = None) -> Path:
    (root / "commitlog").mkdir(parents=True)
    for start, data in files.items():
        (root / "commitlog" / f"{start:020d}").write_bytes(data)
    if offsets_text is not None:
        (root / "config").mkdir()
        (root / "config" / "consumerOffset.json").write_text(offsets_text)
    return root


def landed(landing: Path, stream: str) -> list[dict[str, object]]:
    return [json.loads(x) for p in sorted((landing / stream).glob("*.jsonl")) for x in p.read_text().splitlines()]


def test_export_store_resumes_across_files_and_offsets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    size = 1024
    half = {"UNIQ_KEY": "u", "PGROUP": "pg", "REAL_TOPIC": "orders", "REAL_QID": "0"}
    a = encode("RMQ_SYS_TRANS_HALF_TOPIC", half)
    first = a + struct.pack(">ii", size - len(a), BLANK_MAGIC) + bytes(size - len(a) - 8)
    b = encode("orders", {"UNIQ_KEY": "u", "TRAN_MSG": "true"}, position=size, sys_flag=8)
    retry = encode("%RETRY%g", {}, position=size + len(b))
    second = b + retry + bytes(size - len(b) - len(retry))
    store = store_with({0: first, size: second[: len(b)] + bytes(size - len(b))}, tmp_path / "store",
                       '{"offsetTable":{"orders@g":{0:5,1:2},"orders@CID_RMQ_SYS_TRANS":{0:1}}}')  # fmt: skip
    landing = tmp_path / "landing"
    args = ["export-store", "--store", str(store), "--landing", str(landing), "--broker-name", "b"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "half 1, op 0, real 1, consumer copies 0, trace contexts 0; offset records 2 (1 internal" in out
    (store / "commitlog" / f"{size:020d}").write_bytes(second)  # the broker wrote on
    (store / "config" / "consumerOffset.json").write_text('{"offsetTable":{"orders@g":{0:3,1:2}}}')
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"commit log {size + len(b)} -> {size + len(b) + len(retry)}" in out and "consumer copies 1" in out
    assert [(o["queue_id"], o["offset"]) for o in landed(landing, "offset")] == [(0, 5), (1, 2), (0, 3)]
    assert [r["topic"] for r in landed(landing, "real")] == ["orders"]
    assert [(r["topic"], r["consumer_group"], r["kind"]) for r in landed(landing, "copy")] == [
        ("%RETRY%g", "g", "retry")
    ]
    assert not list(landing.rglob(".*.tmp"))


def test_export_store_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export-store", "--store", str(tmp_path / "none"), "--landing", str(tmp_path / "l"),
                 "--broker-name", "b"]) == 2  # fmt: skip
    assert capsys.readouterr().err.strip().count("\n") == 0
    a = encode("orders", {"UNIQ_KEY": "a"})
    store = store_with({0: a + b"\x01" * 64 + bytes(64)}, tmp_path / "store")
    args = ["export-store", "--store", str(store), "--landing", str(tmp_path / "l"), "--broker-name", "b"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "position 0" not in err and f"position {len(a)}: bad magic code" in err and "\n" not in err
    assert len(landed(tmp_path / "l", "real")) == 1  # what came before it is exported
    state = json.loads((tmp_path / "l" / "_export" / "b.json").read_text())
    assert state["position"] == len(a)


TOPICS_JSON = """{
	"dataVersion":{"counter":3,"stateVersion":0,"timestamp":1767225600123},
	"topicConfigTable":{
		"orders":{"order":false,"perm":6,"readQueueNums":8,"topicFilterType":"SINGLE_TAG","topicName":"orders","topicSysFlag":0,"writeQueueNums":8},
		"archive":{"perm":4,"readQueueNums":2,"topicName":"archive","writeQueueNums":2},
		"b":{"perm":7,"readQueueNums":1,"topicName":"b","writeQueueNums":1},
		"DefaultCluster":{"perm":7,"readQueueNums":16,"topicName":"DefaultCluster","writeQueueNums":16},
		"RMQ_SYS_TRANS_HALF_TOPIC":{"perm":6,"readQueueNums":1,"topicName":"RMQ_SYS_TRANS_HALF_TOPIC","writeQueueNums":1},
		"%RETRY%g":{"perm":6,"readQueueNums":1,"topicName":"%RETRY%g","writeQueueNums":1}
	}
}"""


def test_export_store_lands_the_brokers_business_topics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = store_with({0: encode("orders", {"UNIQ_KEY": "a"}) + bytes(64)}, tmp_path / "store")
    (store / "config").mkdir(exist_ok=True)
    (store / "config" / "topics.json").write_text(TOPICS_JSON)
    args = ["export-store", "--store", str(store), "--landing", str(tmp_path / "l"), "--broker-name", "b"]
    assert main(args) == 0 and "business topics 2;" in capsys.readouterr().out
    rows = landed(tmp_path / "l", "topology")
    # A table snapshot at the table's own dataVersion time: a rerun lands the same records (ingest drops them).
    assert [(r["kind"], r["snapshot_ts"], r.get("topic"), r.get("perm")) for r in rows] == [
        ("table", 1767225600123, None, None), ("topic", 1767225600123, "archive", 4),
        ("topic", 1767225600123, "orders", 6)]  # fmt: skip
    assert rows[0]["table_ts"] == 1767225600123 and all(r["broker_name"] == "b" and "cluster" not in r for r in rows)
    (store / "config" / "topics.json").write_text('{"topicConfigTable": {"orders": {"perm": "x"}}}')
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "topics.json: not a topic table (KeyError" in err and err.count("\n") == 1


def test_topology_snapshot_lands_members_always_and_tables_and_routes_when_they_change() -> None:
    members = [client.Member("C", "a", 0, "h:1"), client.Member("C", "a", 1, "h:2")]
    table = (100, {"orders": client.Queues(4, 4, 6)})
    landed = topology.Landed()
    first = topology.snapshot(1, members, {"a": ("C", table)}, {"orders": {"a": ("C", client.Queues(4, 4, 6))}},
                              landed)  # fmt: skip
    assert [r[1] for r in first] == ["broker", "broker", "table", "topic", "route"]
    again = topology.snapshot(2, members, {"a": ("C", table)}, {"orders": {"a": ("C", client.Queues(4, 4, 6))}},
                              landed)  # fmt: skip
    assert [r[1] for r in again] == ["broker", "broker"]
    gone = topology.snapshot(3, members[:1], {"a": ("C", (200, {}))}, {"orders": None}, landed)
    assert [(r[1], r[3], r[6], r[10]) for r in gone] == [
        ("broker", "a", None, None), ("table", "a", None, 200), ("route", None, "orders", None)]  # fmt: skip
