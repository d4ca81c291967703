"""RocketMQ's message-trace bodies, decoded: one landing record per trace context (DESIGN §1, `trace`). Pure.

A client built with `enableMsgTrace` sends its trace contexts in batches as messages of a trace topic
(`RMQ_SYS_TRACE_TOPIC` unless it names its own). A body is contexts separated by FIELD_SPLITOR (0x02), each
context fields separated by CONTENT_SPLITOR (0x01), the first naming its type (`TraceDataEncoder`, read from
the 5.3.3 client):

    Pub            ts region group topic msgId tags keys storeHost bodyLength costTime msgType [offsetMsgId] success
                   [clientHost]
    SubBefore      ts region group requestId msgId retryTimes keys
    SubAfter       requestId msgId costTime success keys [contextCode [ts group]]
    EndTransaction ts region group topic msgId tags keys storeHost msgType transactionId state fromTransactionCheck
    Recall         ts region group topic msgId success

msgId is the message's UNIQ_KEY (the client's id, shared by a half, its check copies and its commit). Java
writes an absent value as "null"; `split` drops trailing empty fields, so a SubAfter with an empty group ends
at its time. Java's decoder skips a type it does not know and throws on a bad number: here such a context is a
record that says why (`malformed`), for ingest to quarantine, and the good contexts of the same message land.
"""

from __future__ import annotations

import re
from typing import Any

from schemas.landing import TRACE
from sources.commitlog import Message

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
CONTENT, FIELD = "\x01", "\x02"
MESSAGE_TYPES = ("Normal_Msg", "Trans_Msg_Half", "Trans_msg_Commit", "Delay_Msg", "Order_Msg")  # by ordinal
STATES = ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW")  # LocalTransactionState
# The fields a context gives, in the `trace` landing schema's order (after the trace message's own).
NAMES = TRACE.names[TRACE.names.index("trace_type") : TRACE.names.index("malformed")]
# Each type's fields by position, as far as every layout of it has them (`context` reads the rest).
LAYOUT: dict[str, tuple[str, ...]] = {
    "Pub": ("timestamp", "region_id", "group_name", "msg_topic", "uniq_key", "tags", "keys", "store_host",
            "body_length", "cost_ms", "msg_type"),
    "SubBefore": ("timestamp", "region_id", "group_name", "request_id", "uniq_key", "retry_times", "keys"),
    "SubAfter": ("request_id", "uniq_key", "cost_ms", "success", "keys"),
    "EndTransaction": ("timestamp", "region_id", "group_name", "msg_topic", "uniq_key", "tags", "keys", "store_host",
                       "msg_type", "transaction_id", "transaction_state", "from_check"),
    "Recall": ("timestamp", "region_id", "group_name", "msg_topic", "uniq_key", "success"),
}  # fmt: skip
NUMBERS = frozenset({"timestamp", "body_length", "cost_ms", "retry_times", "context_code"})
INTEGER = re.compile(r"[-+]?[0-9]{1,19}")


class Malformed(ValueError):
    """Why a context cannot be read."""


def _value(name: str, text: str) -> Any:
    if name in NUMBERS:
        if not INTEGER.fullmatch(text):  # as Java's parseLong reads it: no spaces, no underscores
            raise Malformed(f"{name} is not a number: {text[:40]!r}")
        return int(text)
    if name in ("success", "from_check"):
        return text.lower() == "true"  # Boolean.parseBoolean
    if name == "msg_type":
        if not text.isdigit() or int(text) >= len(MESSAGE_TYPES):
            raise Malformed(f"unknown message type {text[:40]!r}")
        return MESSAGE_TYPES[int(text)]
    if name == "transaction_state" and text not in STATES:
        raise Malformed(f"unknown transaction state {text[:40]!r}")
    return None if text == "null" else text


def context(text: str) -> dict[str, Any]:
    """One context's fields by name; raises Malformed."""
    parts = text.split(CONTENT)
    while parts and not parts[-1]:  # Java's split drops trailing empty strings
        parts.pop()
    kind = parts[0] if parts else ""
    layout = LAYOUT.get(kind)
    if layout is None:
        raise Malformed(f"unknown trace type {kind[:40]!r}")
    fields = parts[1:]
    if len(fields) < len(layout):
        raise Malformed(f"{kind} has {len(fields)} fields, needs at least {len(layout)}")
    out = {"trace_type": kind} | {n: _value(n, t) for n, t in zip(layout, fields, strict=False)}
    rest = fields[len(layout) :]
    if kind == "Pub":  # 13 fields: success; 14: offsetMsgId, success; 15+: and the client's host
        if len(rest) == 1:
            out["success"] = _value("success", rest[0])
        elif len(rest) >= 2:
            out["offset_msg_id"], out["success"] = _value("offset_msg_id", rest[0]), _value("success", rest[1])
            if len(rest) >= 3:
                out["client_host"] = _value("client_host", rest[2])
    elif kind == "SubAfter" and rest:
        out["context_code"] = _value("context_code", rest[0])
        if len(rest) >= 3:
            out["timestamp"], out["group_name"] = _value("timestamp", rest[1]), _value("group_name", rest[2])
    return out


def contexts(body: bytes) -> list[tuple[str, dict[str, Any] | str]]:
    """Each context of a trace body: its text and its fields, or its text and why it is malformed."""
    text = body.decode("utf-8", "replace")
    out: list[tuple[str, dict[str, Any] | str]] = []
    for part in text.split(FIELD):
        if not part:
            continue
        try:
            out.append((part, context(part)))
        except Malformed as e:
            out.append((part, str(e)))
    return out


def trace_records(broker: str, m: Message) -> list[tuple[Any, ...]]:
    """The landing records of a trace message: one per context, numbered by its place in the body; a message
    with no context at all is one malformed record, so that nothing is dropped unseen."""
    stored = (broker, m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.store_timestamp, m.born_timestamp,
              m.born_host)  # fmt: skip
    found = contexts(m.body or b"") or [((m.body or b"").decode("utf-8", "replace"), "no trace context in the body")]
    records = []
    for i, (text, fields) in enumerate(found):
        if isinstance(fields, str):
            records.append((*stored, i, *(None for _ in NAMES), fields, text[:2000]))
        else:
            records.append((*stored, i, *(fields.get(n) for n in NAMES), None, None))
    return records
