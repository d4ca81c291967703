"""Stored messages into landing records (DESIGN §1), by topic. Pure.

The half topic gives `half` records, the op topic `op` records, business topics and the discard topic
`real` records. Every other topic (retry, DLQ, schedule, trace and the broker's own system topics) is
counted by the caller and skipped: it holds no transaction and no business message.
"""

from __future__ import annotations

from typing import Any

from sources.commitlog import TRANSACTION_BITS, Message, properties

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
# RIP-82 (5.4+, transRocksDBEnable with transWriteOriginTransHalfEnable=false): halves and one op per end
# request in these topics, check counts and discards in RocksDB. Not reconciled yet (README, RocketMQ versions).
ROCKSDB_HALF_TOPIC = "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC"
ROCKSDB_OP_TOPIC = "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC"

COMMIT_TYPE = 0x8
# TopicValidator.SYSTEM_TOPIC_SET (5.5.0) and its prefix; `%` starts retry, DLQ and LMQ topics.
SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRACE_TOPIC", "SELF_TEST_TOPIC",
                           "OFFSET_MOVED_EVENT", "CHECKPOINT_TOPIC", HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC,
                           ROCKSDB_HALF_TOPIC, ROCKSDB_OP_TOPIC})  # fmt: skip


def is_business_topic(topic: str) -> bool:
    return not (topic in SYSTEM_TOPICS or topic.startswith(("rmq_sys_", "%")))


def stream_of(topic: str) -> str | None:
    """The landing stream a topic's messages go to, or None when they are skipped."""
    if topic == HALF_TOPIC:
        return "half"
    if topic == OP_TOPIC:
        return "op"
    if topic == DISCARD_TOPIC or is_business_topic(topic):
        return "real"
    return None


def rocksdb_problem(broker: str, halves: str) -> str:
    """What both readers say of a broker that has stored RIP-82 halves (`halves`: how many, or "its")."""
    return (f"{broker} keeps transactions in RocksDB (RIP-82: transRocksDBEnable, transWriteOriginTransHalfEnable"
            f"=false): {halves} halves in {ROCKSDB_HALF_TOPIC} and their ops are not reconciled, so their commits "
            "show as ORPHANED_COMMIT")  # fmt: skip


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
            _int(get("TRAN_PREPARED_QUEUE_OFFSET")), get("TAGS"), get("KEYS"), m.body_size)  # fmt: skip


def op_record(broker: str, m: Message) -> tuple[Any, ...]:
    body = (m.body or b"").decode("utf-8", "replace")
    return (broker, m.queue_id, m.queue_offset, m.physical_offset, m.store_timestamp, m.born_timestamp,
            properties(m.properties).get("TAGS"), body)  # fmt: skip


def real_record(broker: str, m: Message) -> tuple[Any, ...]:
    get = properties(m.properties).get
    committed = m.sys_flag & TRANSACTION_BITS == COMMIT_TYPE
    # Offset 0 is the first message of a store, a valid half offset; on other messages 0 means none.
    prepared = m.prepared_transaction_offset if committed or m.prepared_transaction_offset else None
    return (broker, m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.store_timestamp, m.born_timestamp,
            get("UNIQ_KEY"), m.sys_flag, get("TRAN_MSG") == "true", prepared, get("PGROUP"), get("__transactionId__"),
            get("TAGS"), get("KEYS"), m.body_size, m.reconsume_times)  # fmt: skip


RECORD = {"half": half_record, "op": op_record, "real": real_record}
