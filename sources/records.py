"""Stored messages into landing records (DESIGN §1), by topic. Pure.

The half topics give `half` records, the op topics `op` records, business topics and the discard topic
`real` records, a group's retry and DLQ topics `copy` records, the trace topics `trace` records (one per
context, `sources.trace`). Every other topic (schedule and the broker's own system topics) is counted by
the caller and skipped: it holds no transaction and no business message. A copy keeps the original's
properties and flags, a committed transactional message's included:
it must never land as `real`, where it would count as a second commit.

A RIP-82 broker (5.4+, transRocksDBEnable with transWriteOriginTransHalfEnable=false) keeps its halves in
ROCKSDB_HALF_TOPIC and writes one op per end request to ROCKSDB_OP_TOPIC, whose body is one zero byte: the
half is named by its commit-log offset (TRANS_OFFSET). Its reader looks that half up and lands the op as
a classic one listing the half's queue offset (`rocksdb_op_record`). Check counts and discards stay in
RocksDB: a discard leaves no message (README, RocketMQ versions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schemas.landing import (
    DLQ_PREFIX,
    HALF_TOPIC,
    OP_TOPIC,
    RETRY_PREFIX,
    ROCKSDB_HALF_TOPIC,
    ROCKSDB_OP_TOPIC,
    SCHEDULE_TOPIC,
)
from sources.commitlog import TRANSACTION_BITS, Message, properties
from sources.trace import TRACE_TOPIC, trace_records

DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TRACE_TOPICS = frozenset({TRACE_TOPIC})

COMMIT_TYPE = 0x8
# TopicValidator.SYSTEM_TOPIC_SET (5.5.0) and its prefix; `%` starts retry, DLQ and LMQ topics.
SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRACE_TOPIC", "SELF_TEST_TOPIC",
                           "OFFSET_MOVED_EVENT", "CHECKPOINT_TOPIC", HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC,
                           ROCKSDB_HALF_TOPIC, ROCKSDB_OP_TOPIC})  # fmt: skip


def is_business_topic(topic: str) -> bool:
    return not (topic in SYSTEM_TOPICS or topic.startswith(("rmq_sys_", "%")))


def stream_of(topic: str, trace_topics: frozenset[str] = TRACE_TOPICS) -> str | None:
    """The landing stream a topic's messages go to, or None when they are skipped. `trace_topics`: the
    default trace topic and those clients name (`collect.trace_topics`)."""
    if topic in trace_topics:
        return "trace"
    if topic in (HALF_TOPIC, ROCKSDB_HALF_TOPIC):
        return "half"
    if topic in (OP_TOPIC, ROCKSDB_OP_TOPIC):
        return "op"
    if topic == DISCARD_TOPIC or is_business_topic(topic):
        return "real"
    if is_copy_topic(topic):
        return "copy"
    return None


def is_copy_topic(topic: str) -> bool:
    """A consumer group's retry or DLQ topic, or the schedule topic where send-backs wait for their delay."""
    return topic.startswith((RETRY_PREFIX, DLQ_PREFIX)) or topic == SCHEDULE_TOPIC


def _int(value: str | None) -> int | None:
    """A numeric property, or None when absent or not a number (ingest then quarantines a missing one)."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def half_record(broker: str, m: Message) -> tuple[Any, ...]:
    get = properties(m.properties).get
    return (broker, m.queue_id, m.queue_offset, m.physical_offset, m.store_timestamp, m.born_timestamp,
            get("UNIQ_KEY"), get("__transactionId__"), get("PGROUP"), get("REAL_TOPIC"), _int(get("REAL_QID")),
            _int(get("TRANSACTION_CHECK_TIMES")), _int(get("CHECK_IMMUNITY_TIME_IN_SECONDS")),
            _int(get("TRAN_PREPARED_QUEUE_OFFSET")), get("TAGS"), get("KEYS"), m.body_size,
            _unless_classic(m.topic))  # fmt: skip


def op_record(broker: str, m: Message) -> tuple[Any, ...]:
    body = (m.body or b"").decode("utf-8", "replace")
    return (broker, m.queue_id, m.queue_offset, m.physical_offset, m.store_timestamp, m.born_timestamp,
            properties(m.properties).get("TAGS"), body, None)  # fmt: skip


def half_log_offset(m: Message) -> int | None:
    """The commit-log offset of the half a RIP-82 op resolves (TRANS_OFFSET)."""
    return _int(properties(m.properties).get("TRANS_OFFSET"))


def rocksdb_op_record(broker: str, m: Message, half_queue_offset: int) -> tuple[Any, ...]:
    """A RIP-82 op as a classic one of its topic, listing the queue offset of the half it resolves."""
    return (broker, m.queue_id, m.queue_offset, m.physical_offset, m.store_timestamp, m.born_timestamp,
            properties(m.properties).get("TAGS"), str(half_queue_offset), m.topic)  # fmt: skip


def _unless_classic(topic: str) -> str | None:
    """The `topic` field: absent for the classic topics, as in landing files from before RIP-82."""
    return None if topic in (HALF_TOPIC, OP_TOPIC) else topic


def real_record(broker: str, m: Message) -> tuple[Any, ...]:
    get = properties(m.properties).get
    committed = m.sys_flag & TRANSACTION_BITS == COMMIT_TYPE
    # Offset 0 is the first message of a store, a valid half offset; on other messages 0 means none.
    prepared = m.prepared_transaction_offset if committed or m.prepared_transaction_offset else None
    return (broker, m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.store_timestamp, m.born_timestamp,
            get("UNIQ_KEY"), m.sys_flag, get("TRAN_MSG") == "true", prepared, get("PGROUP"), get("__transactionId__"),
            get("TAGS"), get("KEYS"), m.body_size, m.reconsume_times)  # fmt: skip


def copy_record(broker: str, m: Message) -> tuple[Any, ...] | None:
    """A retry or DLQ copy; in SCHEDULE_TOPIC_XXXX, a send-back waiting for its delay (REAL_TOPIC names the
    retry topic it is bound for), and None for anything else there (a producer's delayed message)."""
    if m.topic != SCHEDULE_TOPIC:
        return _copy(broker, m, m.topic, "dead_letter" if m.topic.startswith(DLQ_PREFIX) else "retry")
    bound_for = properties(m.properties).get("REAL_TOPIC") or ""
    return _copy(broker, m, bound_for, "scheduled") if bound_for.startswith(RETRY_PREFIX) else None


def _copy(broker: str, m: Message, copy_topic: str, kind: str) -> tuple[Any, ...]:
    get = properties(m.properties).get
    # A pop consumer's retry topic (5.x) also names the topic: %RETRY%<group>+<topic>.
    group = copy_topic.removeprefix(DLQ_PREFIX if kind == "dead_letter" else RETRY_PREFIX).split("+")[0]
    return (broker, m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.store_timestamp, m.born_timestamp,
            group, kind, get("RETRY_TOPIC"), get("ORIGIN_MESSAGE_ID"), get("UNIQ_KEY"), m.reconsume_times,
            get("TRAN_MSG") == "true", get("__transactionId__"), get("TAGS"), get("KEYS"))  # fmt: skip


# Each gives the landing record of a message of its stream, or None for one the stream does not take; a trace
# message gives a list, a record per context.
Record = tuple[Any, ...] | list[tuple[Any, ...]] | None
RECORD: dict[str, Callable[[str, Message], Record]] = {
    "half": half_record, "op": op_record, "real": real_record, "copy": copy_record, "trace": trace_records}  # fmt: skip


def keep_body(trace_topics: frozenset[str]) -> frozenset[str]:
    """The topics whose bodies are data: the op topic's (half offsets) and the trace topics' (contexts)."""
    return frozenset({OP_TOPIC}) | trace_topics
