"""Silver and gold tables written by reconcile (DESIGN §2)."""

from schemas.model import Field, Schema

TXN_LIFECYCLE = Schema(
    "txn_lifecycle",
    (
        Field("broker_name", "string"),
        Field("uniq_key", "string"),
        Field("producer_group", "string", nullable=True),
        Field("real_topic", "string", nullable=True),
        Field("real_queue_id", "int", nullable=True),
        Field("born_ts", "long", nullable=True),
        Field("first_copy_ts", "long", nullable=True, doc="null: a commit with no half"),
        Field("last_copy_ts", "long", nullable=True),
        Field("copies", "int", doc="half records: the original and its check copies"),
        Field("check_times", "int", doc="largest TRANSACTION_CHECK_TIMES (0: none)"),
        Field("resolved_ts", "long", nullable=True, doc="the first op listing one of its copies"),
        Field("commit_count", "int"),
        Field("first_commit_ts", "long", nullable=True),
        Field("first_commit_topic", "string", nullable=True),
        Field("first_commit_queue_id", "int", nullable=True),
        Field("first_commit_queue_offset", "long", nullable=True),
        Field(
            "discard_ts",
            "long",
            nullable=True,
            doc="first record in TRANS_CHECK_MAX_TIME_TOPIC; RIP-82 leaves none: when the rules say it was deleted",
        ),
        Field("state", "string", doc="COMMITTED, ROLLED_BACK, DISCARDED or PENDING"),
        Field("reason", "string", nullable=True, doc="MAX_CHECKS or EXPIRED when DISCARDED"),
        Field("half_topic", "string", nullable=True, doc="where its halves are: RIP-82 brokers have their own"),
    ),
    key=("broker_name", "uniq_key"),
)

# The columns Delta keeps file statistics for: queries go by identity, state and time.
LIFECYCLE_STATS_COLUMNS = ("broker_name", "uniq_key", "state", "born_ts", "first_copy_ts", "first_commit_ts")

OFFSET_COMMITS = Schema(
    "offset_commits",
    (
        Field("broker_name", "string"),
        Field("consumer_group", "string"),
        Field("topic", "string"),
        Field("queue_id", "int"),
        Field("offset", "long"),
        Field("commit_timestamp", "long"),
        Field("client_id", "string", nullable=True),
        Field("seq", "long", nullable=True),
        Field("prev_offset", "long", nullable=True, doc="the queue's previous commit, by (commit_timestamp, seq)"),
        Field("prev_client_id", "string", nullable=True),
        Field("is_regression", "boolean"),
    ),
)

ANOMALIES = Schema(
    "anomalies",
    (
        Field("anomaly_id", "string", doc="SHA-256 of type and key: a rerun updates, never duplicates"),
        Field("anomaly_type", "string"),
        Field("reason", "string", nullable=True),
        Field("broker_name", "string"),
        Field("uniq_key", "string", nullable=True),
        Field("consumer_group", "string", nullable=True),
        Field("topic", "string", nullable=True),
        Field("queue_id", "int", nullable=True),
        Field("event_ts", "long"),
        Field("as_of", "long", doc="the data time of the run that found the row as it is (reconcile_runs.as_of)"),
        Field("detail", "string", doc="a JSON object"),
    ),
    key=("anomaly_id",),
)

RECONCILE_RUNS = Schema(
    "reconcile_runs",
    (
        Field("run_id", "string"),
        Field("mode", "string", doc="full, incremental, or unchanged (nothing it reads had changed)"),
        Field("reason", "string", nullable=True, doc="why the run was full"),
        Field("as_of", "long"),
        Field("rules", "string", doc="the broker settings and thresholds used, as JSON"),
        Field("transactions", "long", doc="lifecycle rows computed (all of them when full)"),
        Field("queues", "long", doc="consumer queues whose offset commits were computed"),
        Field("half_version", "long", doc="the bronze Delta versions read"),
        Field("op_version", "long"),
        Field("real_version", "long"),
        Field("offset_version", "long"),
        Field("txn_lifecycle_version", "long", doc="the Delta versions written: a later change forces a full run"),
        Field("offset_commits_version", "long"),
        Field("anomalies_version", "long"),
        Field("started_at", "timestamp"),
        Field("finished_at", "timestamp"),
        Field("deliveries_version", "long", nullable=True, doc="null: written by an older version, whole"),
        Field("delivery_counts_version", "long", nullable=True, doc="null: written by an older version"),
        Field("trace_version", "long", nullable=True, doc="the trace_events version read (null: before the trace)"),
        Field(
            "wants",
            "string",
            nullable=True,
            doc="what each group wanted per topic, as JSON: when it changes, deliveries are rewritten whole",
        ),
        Field("consumer_version", "long", nullable=True, doc="the snapshot tables' versions read (null: not recorded)"),
        Field("copy_version", "long", nullable=True),
        Field("topology_version", "long", nullable=True),
        Field(
            "events_until",
            "long",
            nullable=True,
            doc="the latest event in the bronze versions read, when the run knew it (null: as_of was given)",
        ),
        Field("broker_windows_version", "long", nullable=True, doc="null: written by an older version"),
    ),
    key=("run_id",),
)

# Gold: what became of each stored business message in each group that wants it (transforms/deliveries.py),
# as of the as_of of the last reconcile run (reconcile_runs). A PENDING message's age is that as_of minus its
# store_timestamp, not a column: a column of it would change every pending row in every run.
DELIVERIES = Schema(
    "deliveries",
    (
        Field("consumer_group", "string"),
        Field("broker_name", "string"),
        Field("topic", "string"),
        Field("queue_id", "int"),
        Field("queue_offset", "long"),
        Field("uniq_key", "string", nullable=True),
        Field("transaction_id", "string", nullable=True, doc="set on a transaction's committed message"),
        Field("tags", "string", nullable=True),
        Field("store_timestamp", "long"),
        Field("status", "string", doc="CONSUMED, DEAD_LETTERED, UNDELIVERED, POSSIBLY_UNDELIVERED or PENDING"),
        Field("retries", "int", doc="copies the group's consumers sent back to %RETRY% before this status"),
        Field("duplicates_expected", "int", doc="hand-offs and offset regressions that deliver it again"),
    ),
    key=("consumer_group", "broker_name", "topic", "queue_id", "queue_offset"),
)

# Gold: the deliveries counted per group, status and second of store time, kept by reconcile from the changes
# of every write to `deliveries` (transforms/deliveries.py `counted`). What the dashboard and the metrics show
# of deliveries is read from it: its size follows the seconds that hold messages, not the messages.
DELIVERY_COUNTS = Schema(
    "delivery_counts",
    (
        Field("consumer_group", "string"),
        Field("status", "string"),
        Field("second_ts", "long", doc="the second of the messages' store time, epoch milliseconds"),
        Field("messages", "long", doc="deliveries rows of the group, status and second"),
        Field("retries", "long", doc="their retries, summed"),
        Field("duplicates_expected", "long", doc="their duplicates_expected, summed"),
    ),
    key=("consumer_group", "status", "second_ts"),
)

# Silver: what producers stored on each broker per window of thresholds.idle_window_ms, kept by reconcile for
# BROKER_WITHOUT_WRITES, the dashboard's writes chart and the broker metric. A full run writes a row per broker
# and window; an incremental one appends a row per broker and window its new events fall in. A window's total
# is the sum of its rows (`transforms.topology.window_totals`): an append is one Spark job where a merge took
# several. Its size follows the windows and the runs, not the messages.
BROKER_WINDOWS = Schema(
    "broker_windows",
    (
        Field("broker_name", "string"),
        Field("window_ts", "long", doc="the window's start, epoch milliseconds"),
        Field(
            "messages",
            "long",
            doc="original halves (not check copies) and business messages (not discards) "
            "stored; a window's total is the sum of its rows, as an incremental run adds one",
        ),
    ),
)

# A view over bronze (created by reconcile): what producers stored on each broker, per topic and minute; the
# dashboard charts it, one line per broker. A broker that takes no traffic is a line at zero or no line at all.
BROKER_WRITES = Schema(
    "broker_writes",
    (
        Field("broker_name", "string"),
        Field("topic", "string", doc="a business topic (a half counts for its REAL_TOPIC)"),
        Field("minute_ts", "long", doc="the minute, epoch milliseconds"),
        Field("messages", "long", doc="messages stored in the topic: committed and plain (discards not)"),
        Field("halves", "long", doc="transactional halves sent for the topic (originals, not check copies)"),
    ),
    key=("broker_name", "topic", "minute_ts"),
)

# A view over trace_events (docs/concepts/trace.md): what each group's clients traced, per minute of store time.
# A rule concludes from a missing trace only for a group that traced in the same window.
TRACE_COVERAGE = Schema(
    "trace_coverage",
    (
        Field("group_name", "string", doc="a producer or consumer group whose clients trace"),
        Field("role", "string", doc="producer (Pub, EndTransaction) or consumer (SubBefore, SubAfter)"),
        Field("minute_ts", "long", doc="the minute of the trace messages' store time, epoch milliseconds"),
        Field("contexts", "long", doc="trace contexts landed"),
        Field("instances", "long", doc="clients that sent them (their trace producers' addresses)"),
        Field("answers", "long", doc="producer: answers to checks"),
        Field("failed", "long", doc="consumer: failed attempts"),
    ),
    key=("group_name", "role", "minute_ts"),
)

# The views reconcile creates in the catalog beside its tables.
VIEWS = (BROKER_WRITES, TRACE_COVERAGE)
