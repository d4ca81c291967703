"""The ground truth the broker model writes beside a landing folder (DESIGN §3)."""

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
