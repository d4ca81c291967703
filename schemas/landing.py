"""Landing-file records, one schema per stream (DESIGN §1).

Times are epoch milliseconds. A nullable field may be absent or null in a landing file, unless its
`required_when` holds for the record (a consumer snapshot's queue row needs its client, broker and queue).
"""

from schemas.model import Field, Schema

_STORED = (
    Field("broker_name", "string"),
    Field("queue_id", "int"),
    Field("queue_offset", "long", doc="consume-queue offset, dense per queue"),
    Field("commit_log_offset", "long", doc="physical offset in the broker's commit log"),
    Field("store_timestamp", "long", doc="broker clock at append"),
    Field("born_timestamp", "long", doc="producer clock at send"),
)

# The topics a half or an op is stored in: the classic ones, or RIP-82's (5.4+, transRocksDBEnable with
# transWriteOriginTransHalfEnable=false), whose offsets start at 0 again. A RIP-82 op is landed as a classic
# one: its reader turns the half's commit-log offset it holds (TRANS_OFFSET) into the half's queue offset.
HALF_TOPIC, ROCKSDB_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC"
OP_TOPIC, ROCKSDB_OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC", "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC"
HALF_TOPIC_OF_OP = {OP_TOPIC: HALF_TOPIC, ROCKSDB_OP_TOPIC: ROCKSDB_HALF_TOPIC}

HALF = Schema(
    "half",
    _STORED
    + (
        Field("uniq_key", "string", doc="UNIQ_KEY, shared by the original and every check copy"),
        Field("transaction_id", "string", nullable=True, doc="__transactionId__"),
        Field("producer_group", "string", doc="PGROUP"),
        Field("real_topic", "string", doc="REAL_TOPIC"),
        Field("real_queue_id", "int", doc="REAL_QID"),
        Field("check_times", "int", nullable=True, doc="TRANSACTION_CHECK_TIMES; absent on the original"),
        Field("check_immunity_seconds", "int", nullable=True, doc="CHECK_IMMUNITY_TIME_IN_SECONDS"),
        Field("prepared_queue_offset", "long", nullable=True, doc="TRAN_PREPARED_QUEUE_OFFSET"),
        Field("tags", "string", nullable=True),
        Field("keys", "string", nullable=True),
        Field("body_size", "int", nullable=True),
        Field("topic", "string", nullable=True, default=HALF_TOPIC, doc=f"absent: {HALF_TOPIC}"),
    ),
    key=("broker_name", "topic", "queue_id", "queue_offset"),
)

# An op body lists half-queue offsets: "17" (<= 5.0) or "17,18,20," (5.1+); that is, digits and commas,
# starting with a digit, never two commas in a row. It is checked as two flat patterns rather than as
# "[0-9]+(,[0-9]+)*,?": Java's regex engine recurses once per repetition of a group, and a body of 80,000
# characters overflowed an executor thread's stack and took the JVM down. A repeated character class
# is matched in a loop, so any body is checked in bounded stack.
OP_BODY_CHARS = r"^[0-9][0-9,]*$"
OP_BODY_EMPTY_ITEM = ",,"

OP = Schema(
    "op",
    _STORED
    + (
        Field("tag", "string", doc='always "d"'),
        Field("body", "string", doc='half-queue offsets: "17" (<= 5.0, RIP-82) or "17,18,20," (5.1+)'),
        Field("topic", "string", nullable=True, default=OP_TOPIC,
              doc=f"absent: {OP_TOPIC}; its offsets are of the half topic HALF_TOPIC_OF_OP names"),
    ),
    key=("broker_name", "topic", "queue_id", "queue_offset"),
)  # fmt: skip

REAL = Schema(
    "real",
    (Field("broker_name", "string"), Field("topic", "string"))
    + _STORED[1:]
    + (
        Field("uniq_key", "string", nullable=True),
        Field("sys_flag", "int", doc="transaction bits & 0xC: 0 normal, 8 commit"),
        Field("transactional", "boolean", doc="TRAN_MSG"),
        Field("prepared_transaction_offset", "long", nullable=True, doc="physical offset of the committed half copy"),
        Field("producer_group", "string", nullable=True),
        Field("transaction_id", "string", nullable=True),
        Field("tags", "string", nullable=True),
        Field("keys", "string", nullable=True),
        Field("body_size", "int", nullable=True),
        Field("reconsume_times", "int", nullable=True),
    ),
    key=("broker_name", "topic", "queue_id", "queue_offset"),
)

# A consumer's copies of a message it failed (DESIGN §1, "Consumer copies"): sent back to `%RETRY%<group>`
# to be consumed again after a delay, or to `%DLQ%<group>` once it failed maxReconsumeTimes times. The send-back
# is first stored in SCHEDULE_TOPIC_XXXX (queue: its delay level - 1) with REAL_TOPIC naming the retry topic,
# and copied there when its delay is over (HookUtils.transformDelayLevelMessage, ScheduleMessageService).
RETRY_PREFIX, DLQ_PREFIX, SCHEDULE_TOPIC = "%RETRY%", "%DLQ%", "SCHEDULE_TOPIC_XXXX"
COPY_KINDS = ("retry", "dead_letter", "scheduled")

COPY = Schema(
    "copy",
    (
        Field("broker_name", "string"),
        Field("topic", "string", doc="%RETRY%<group>, %DLQ%<group>, or SCHEDULE_TOPIC_XXXX for a send-back waiting"),
    )
    + _STORED[1:]
    + (
        Field("consumer_group", "string", doc="the group whose consumer sent it back"),
        Field("kind", "string", doc="retry, dead_letter, or scheduled: a send-back waiting for its delay"),
        Field("origin_topic", "string", nullable=True, doc="RETRY_TOPIC: the topic the message was sent to"),
        Field("origin_message_id", "string", nullable=True, doc="ORIGIN_MESSAGE_ID"),
        Field("uniq_key", "string", nullable=True, doc="UNIQ_KEY, the original's"),
        Field("reconsume_times", "int", doc="consumptions it failed so far"),
        Field("transactional", "boolean", doc="TRAN_MSG: a copy keeps the original's properties and flags"),
        Field("transaction_id", "string", nullable=True),
        Field("tags", "string", nullable=True),
        Field("keys", "string", nullable=True),
    ),
    key=("broker_name", "topic", "queue_id", "queue_offset"),
)

OFFSET = Schema(
    "offset",
    (
        Field("broker_name", "string"),
        Field("consumer_group", "string"),
        Field("topic", "string"),
        Field("queue_id", "int"),
        Field("offset", "long", doc="next offset to consume"),
        Field("commit_timestamp", "long"),
        Field("client_id", "string", nullable=True, doc="unknown for consumerOffset.json snapshots"),
        Field("seq", "long", nullable=True, doc="orders commits within one millisecond"),
    ),
)

CONSUMER = Schema(
    "consumer",
    (
        Field("snapshot_ts", "long", doc="when the group was looked at; one snapshot holds all its rows"),
        Field("consumer_group", "string"),
        Field("kind", "string", doc="subscription (a client's, or with no client_id the broker's table) or queue"),
        Field("client_id", "string", nullable=True, required_when=(("kind", "queue"),),
              doc="null: the subscription table broker_name keeps"),
        Field("topic", "string"),
        Field("expression", "string", nullable=True, doc="subscription: the tag expression, e.g. * or TagA || TagB"),
        Field("broker_name", "string", nullable=True, required_when=(("kind", "queue"), ("client_id", None)),
              doc="queue: its broker; broker table: the broker keeping it"),
        Field("queue_id", "int", nullable=True, required_when=(("kind", "queue"),)),
        Field("offset", "long", nullable=True, doc="queue: the in-memory offset, next to consume (null: none yet)"),
    ),
)  # fmt: skip

# The cluster as the name server and the brokers show it (docs/concepts/topology.md). A pass of `collect` lands
# the masters every time (`broker` rows: who was live when it looked) and the rest only when something in it
# changed: each master's business topics (a `table` row, then its `topic` rows; a table with no topic is a
# `table` row alone) and each business topic's route (`route` rows, one per broker in it; a `route` row with
# no broker_name: the name server knows no route for it). What a snapshot does not land is as the last one
# that did. `export-store` lands one broker's table from its config/topics.json.
TOPOLOGY_KINDS = ("broker", "table", "topic", "route")
_TABLED = (("kind", "topic"), ("kind", "route"))
_QUEUED = (("kind", "topic"),)

TOPOLOGY = Schema(
    "topology",
    (
        Field("snapshot_ts", "long", doc="when the cluster was looked at; one pass's rows share it"),
        Field("kind", "string", doc="broker, table, topic or route"),
        Field("cluster", "string", nullable=True, required_when=(("kind", "broker"),),
              doc="the broker's cluster (null in an export: a store does not name it)"),
        Field("broker_name", "string", nullable=True, required_when=(("kind", "broker"), ("kind", "table"),
                                                                        ("kind", "topic")),
              doc="route: null when the name server has no route for the topic"),
        Field("broker_id", "long", nullable=True, required_when=(("kind", "broker"),), doc="broker: 0 is the master"),
        Field("address", "string", nullable=True, required_when=(("kind", "broker"),), doc="broker: host:port"),
        Field("topic", "string", nullable=True, required_when=_TABLED),
        Field("read_queues", "int", nullable=True, required_when=_QUEUED, doc="topic, route: readQueueNums"),
        Field("write_queues", "int", nullable=True, required_when=_QUEUED, doc="topic, route: writeQueueNums"),
        Field("perm", "int", nullable=True, required_when=_QUEUED,
              doc="topic, route: PermName bits, 2 write, 4 read (6: both); a route's unknown: its table decides"),
        Field("table_ts", "long", nullable=True,
              doc="table: the broker's topic-table dataVersion timestamp, when the broker last changed it"),
    ),
)  # fmt: skip

# RocketMQ's message trace (docs/concepts/trace.md): one record per trace context, keyed by the trace message's
# place in its topic and the context's place in the message body (`sources.trace` decodes them). A context
# that could not be decoded is landed with `malformed` (why) and `raw` (its text), and ingest quarantines it.
TRACE_TYPES = ("Pub", "SubBefore", "SubAfter", "EndTransaction", "Recall")
_DECODED = (("malformed", None),)

TRACE = Schema(
    "trace",
    (Field("broker_name", "string"), Field("topic", "string", doc="the trace topic: RMQ_SYS_TRACE_TOPIC or a client's"))
    + _STORED[1:]
    + (
        Field("born_host", "string", nullable=True, doc="ip:port of the client that sent the trace message"),
        Field("context_index", "int", doc="the context's place in the trace message's body, from 0"),
        Field("trace_type", "string", nullable=True, required_when=_DECODED,
              doc="Pub, SubBefore, SubAfter, EndTransaction or Recall"),
        Field("timestamp", "long", nullable=True,
               doc="client clock: the send, the attempt's start, the end request"),
        Field("region_id", "string", nullable=True),
        Field("group_name", "string", nullable=True, doc="the producer group (Pub, EndTransaction) or consumer group"),
        Field("request_id", "string", nullable=True, doc="SubBefore, SubAfter: pairs the two of one attempt"),
        Field("msg_topic", "string", nullable=True, doc="the traced message's topic"),
        Field("uniq_key", "string", nullable=True, required_when=_DECODED, doc="the traced message's UNIQ_KEY (msgId)"),
        Field("tags", "string", nullable=True),
        Field("keys", "string", nullable=True),
        Field("store_host", "string", nullable=True, doc="the broker's address the client sent to"),
        Field("body_length", "int", nullable=True),
        Field("cost_ms", "int", nullable=True, doc="Pub: the send; SubAfter: the consumption, per message"),
        Field("msg_type", "string", nullable=True, doc="Normal_Msg, Trans_Msg_Half, Trans_msg_Commit, ..."),
        Field("offset_msg_id", "string", nullable=True, doc="Pub: the broker's id of the stored message"),
        Field("success", "boolean", nullable=True, doc="Pub, SubAfter, Recall"),
        Field("client_host", "string", nullable=True),
        Field("retry_times", "int", nullable=True, doc="SubBefore: reconsumeTimes of the message consumed"),
        Field("context_code", "int", nullable=True, doc="SubAfter: ConsumeReturnType's ordinal"),
        Field("transaction_id", "string", nullable=True),
        Field("transaction_state", "string", nullable=True, doc="COMMIT_MESSAGE, ROLLBACK_MESSAGE or UNKNOW"),
        Field("from_check", "boolean", nullable=True, doc="EndTransaction: the answer to a check"),
        Field("malformed", "string", nullable=True, doc="why the context could not be decoded (ingest quarantines it)"),
        Field("raw", "string", nullable=True, doc="the context's text, when malformed"),
    ),
    key=("broker_name", "topic", "queue_id", "queue_offset", "context_index"),
)  # fmt: skip

LANDING = {s.name: s for s in (HALF, OP, REAL, OFFSET, CONSUMER, COPY, TOPOLOGY, TRACE)}
