"""The ground truth the broker model writes beside a landing folder (DESIGN §3)."""

from typing import Any

from schemas.model import Field, Schema

TRUTH_TRANSACTION = Schema(
    "truth_transaction",
    (
        Field("broker_name", "string"),
        Field("uniq_key", "string"),
        Field("producer_group", "string"),
        Field("real_topic", "string"),
        Field("real_queue_id", "int"),
        Field("born_timestamp", "long"),
        Field("state", "string", doc="COMMITTED, ROLLED_BACK, DISCARDED or PENDING as of meta.json's as_of"),
        Field("reason", "string", nullable=True, doc="MAX_CHECKS or EXPIRED for DISCARDED"),
        Field("business_outcome", "string", nullable=True, doc="what the local transaction decided, if ever"),
        Field("commit_count", "int"),
        Field("check_times", "int", doc="the largest TRANSACTION_CHECK_TIMES among its copies (0: none)"),
        Field("resolved", "boolean", doc="an op lists one of its copies"),
        Field("discarded", "boolean", doc="the broker wrote it to TRANS_CHECK_MAX_TIME_TOPIC"),
        Field("faults", "strings", doc="the injected faults and broker events that touched it"),
    ),
    key=("broker_name", "uniq_key"),
)

# Per anomaly type, the fields that identify a finding: of a truth record, or of an anomaly row with its
# detail's fields; transaction findings go by TXN_KEY.
QUEUE_KEY = ("broker_name", "consumer_group", "topic", "queue_id", "event_ts")
KEY_FIELDS = {
    "OFFSET_REGRESSION": (*QUEUE_KEY, "seq"),
    "OFFSET_JUMP": (*QUEUE_KEY, "seq"),
    "STRANDED_QUEUE": QUEUE_KEY,
    "UNDELIVERED": QUEUE_KEY,
    "DEAD_LETTERED": (*QUEUE_KEY, "uniq_key", "dlq_queue_offset", "reconsume_times", "transaction_id"),
    "REDELIVERY_AT_HANDOFF": (*QUEUE_KEY, "old_holder"),
    "SUBSCRIPTION_CONFLICT": ("broker_name", "consumer_group", "event_ts"),
    "TOPIC_NOT_ON_BROKER": ("cluster", "broker_name", "topic", "reason", "event_ts", "until"),
    "BROKER_WITHOUT_WRITES": ("cluster", "broker_name", "event_ts", "until"),
    # The cause is scored with the discard: what its group's trace says of its checks (null: untraced).
    "DISCARDED_AFTER_MAX_CHECKS": ("broker_name", "uniq_key", "reason", "cause"),
    "DUPLICATE_CONSUMPTION": ("consumer_group", "uniq_key", "consumed"),
    "CONSUME_FAILED": ("consumer_group", "uniq_key", "failed"),
}
TXN_KEY = ("broker_name", "uniq_key", "reason")


def truth_key(a: dict[str, Any]) -> tuple[Any, ...]:
    """The key a finding is scored by; `a` is a truth record or an anomaly row (detail fields merged in)."""
    fields = {**a.get("detail", {}), **a} if isinstance(a.get("detail"), dict) else a
    return tuple(fields.get(f) for f in KEY_FIELDS.get(a["anomaly_type"], TXN_KEY))
