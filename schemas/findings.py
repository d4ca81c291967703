"""Every finding type the rules report, in one place: the anomalies table's expectations, the documentation
site's page per type (docs/findings/<TYPE>.md) and `txn-recon explain` all read it."""

FINDINGS = {
    "STUCK_HALF": "a transaction pending longer than thresholds.stuck_after_ms",
    "DISCARDED_AFTER_MAX_CHECKS": "the broker gave up after transactionCheckMax checks",
    "DISCARDED_EXPIRED": "the broker dropped a half older than its file retention",
    "ORPHANED_COMMIT": "a commit the transaction's records do not account for",
    "DUPLICATE_COMMIT": "one transaction committed more than once",
    "RECHECKED_AFTER_RESOLUTION": "a resolved transaction the broker keeps checking",
    "OFFSET_REGRESSION": "a consumer group's committed offset went backwards",
    "SUBSCRIPTION_CONFLICT": "members of one group subscribe differently",
    "STRANDED_QUEUE": "a queue with messages no subscribing member holds",
    "REDELIVERY_AT_HANDOFF": "a queue handed over with consumed, uncommitted messages",
    "OFFSET_JUMP": "a committed offset moved forward by no member",
    "UNDELIVERED": "wanted messages a tag filter refused while the offset passed them",
    "DEAD_LETTERED": "a message parked in the group's dead-letter queue",
    "TOPIC_NOT_ON_BROKER": "a live master lacks a topic the rest of its cluster serves, or cannot take its writes",
    "BROKER_WITHOUT_WRITES": "a live master stored nothing while the rest of its cluster stored many",
    "CHECK_ANSWER_LOST": "a producer answered a check COMMIT or ROLLBACK, and the broker went on checking",
    "DUPLICATE_CONSUMPTION": "one message consumed successfully more than once in one group (traced)",
    "CONSUME_FAILED": "consumption attempts a group's listener failed (traced)",
    "TRACE_CONTRADICTION": "the message trace contradicts what txn-recon inferred: a finding about txn-recon",
}
ANOMALY_TYPES = tuple(FINDINGS)
