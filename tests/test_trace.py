"""The trace decoder (`sources.trace`) on bodies laid out as RocketMQ's client writes them, and a trace message
read from a commit log: every context a record, a malformed one with its reason beside the good ones."""

from __future__ import annotations

from schemas.landing import TRACE
from sources.commitlog import Message, scan
from sources.records import keep_body, stream_of
from sources.trace import TRACE_TOPIC, contexts, trace_records
from tests.store_encoding import encode
from tests.trace_encoding import KEY, C, F, end_transaction, pub, sub_after, sub_before

STORE = "127.0.0.1:10911"


def _records(body: bytes) -> list[dict[str, object]]:
    m = Message(0, 0, 1, 0, 4, 9_000, 0, 2, 3, 0, 0, len(body), TRACE_TOPIC, "", body, "10.0.0.7:51000")
    return [dict(zip(TRACE.names, r, strict=True)) for r in trace_records("broker-a", m)]


def test_each_type_as_the_client_writes_it() -> None:
    body = (pub(1, "PG", "TxnTopic", KEY, "K-1", STORE, 3, 1, "OFF", success=True)
            + end_transaction(2, "PG", "TxnTopic", KEY, "K-1", STORE, "ROLLBACK_MESSAGE", True)
            + sub_before(3, "CG", "REQ", KEY, 2, None)
            + sub_after(4, "CG", "REQ", KEY, 7, False, None, code=1))  # fmt: skip
    p, e, before, after = (fields for _, fields in contexts(body.encode()))
    assert p == {"trace_type": "Pub", "timestamp": 1, "region_id": "DefaultRegion", "group_name": "PG",
                 "msg_topic": "TxnTopic", "uniq_key": KEY, "tags": None, "keys": "K-1", "store_host": STORE,
                 "body_length": 12, "cost_ms": 3, "msg_type": "Trans_Msg_Half", "offset_msg_id": "OFF",
                 "success": True}  # fmt: skip
    assert isinstance(e, dict) and e["transaction_state"] == "ROLLBACK_MESSAGE" and e["from_check"] is True
    assert e["transaction_id"] is None and e["msg_type"] == "Trans_msg_Commit"
    assert before == {"trace_type": "SubBefore", "timestamp": 3, "region_id": "DefaultRegion", "group_name": "CG",
                      "request_id": "REQ", "uniq_key": KEY, "retry_times": 2, "keys": None}  # fmt: skip
    assert after == {"trace_type": "SubAfter", "request_id": "REQ", "uniq_key": KEY, "cost_ms": 7, "success": False,
                     "keys": None, "context_code": 1, "timestamp": 4, "group_name": "CG"}  # fmt: skip


def test_older_layouts_decode_as_the_java_decoder_reads_them() -> None:
    # A Pub of 13 fields has no offsetMsgId; a SubAfter of 6 none of its code, time or group.
    old_pub = C.join(["Pub", "1", "R", "PG", "T", KEY, "null", "null", STORE, "1", "2", "0", "false"])
    [(_, fields)] = contexts(old_pub.encode())
    assert isinstance(fields, dict) and fields["success"] is False and "offset_msg_id" not in fields
    [(_, after)] = contexts(C.join(["SubAfter", "REQ", KEY, "3", "true", "null"]).encode())
    assert isinstance(after, dict) and "timestamp" not in after and after["success"] is True


def test_a_malformed_context_is_a_record_with_its_reason_and_the_good_ones_land() -> None:
    good = sub_before(3, "CG", "REQ", KEY, 0, "K")
    bad = [C.join(["SubAfter", "REQ", KEY, "soon", "true", "K"]) + F, C.join(["Pub", "1"]) + F, "Gossip" + C + "1" + F,
           end_transaction(2, "PG", "T", KEY, None, STORE, "MAYBE", True)]  # fmt: skip
    records = _records((good + "".join(bad)).encode())
    assert [r["context_index"] for r in records] == [0, 1, 2, 3, 4]
    assert (
        records[0]["malformed"] is None
        and records[0]["uniq_key"] == KEY
        and records[0]["born_host"] == "10.0.0.7:51000"
    )
    assert [r["malformed"] for r in records[1:]] == [
        "cost_ms is not a number: 'soon'", "Pub has 1 fields, needs at least 11", "unknown trace type 'Gossip'",
        "unknown transaction state 'MAYBE'"]  # fmt: skip
    assert all(r["trace_type"] is None and r["raw"] for r in records[1:])
    assert [r["malformed"] for r in _records(b"")] == ["no trace context in the body"]


def test_a_trace_message_in_the_commit_log_keeps_its_body_and_sender() -> None:
    body = sub_before(3, "CG", "REQ", KEY, 0, "K").encode()
    data = encode(TRACE_TOPIC, {"KEYS": KEY}, body=body, queue_offset=5) + encode("MyTrace", {}, body=body, position=1)
    first, second = (e for e in scan(data, 0, 0, keep_body(frozenset({TRACE_TOPIC}))) if isinstance(e, Message))
    assert first.body == body and first.born_host == "127.0.0.1:10911"
    assert second.body is None and second.born_host is None  # a topic not asked for keeps neither
    # A client's own trace topic is a trace topic once configured, a business topic before.
    assert stream_of("MyTrace") == "real" and stream_of("MyTrace", frozenset({TRACE_TOPIC, "MyTrace"})) == "trace"
    assert stream_of(TRACE_TOPIC) == "trace"
