"""Bronze tables: landing records as ingested, plus quarantine and ingest bookkeeping (DESIGN §1)."""

from schemas.landing import LANDING
from schemas.model import Field, Schema

# Bookkeeping columns every bronze row carries.
BOOKKEEPING = (
    Field("_record_hash", "string", doc="SHA-256 of the record's data columns: tells a repeat from a conflict"),
    Field("_source_file", "string"),
    Field("_ingested_at", "timestamp"),
    Field("_run_id", "string"),
)

# Natural keys (DESIGN §1); an offset commit or a snapshot row has none, so the whole record is its key.
KEYS = {
    "half": ("broker_name", "topic", "queue_id", "queue_offset"),
    "op": ("broker_name", "topic", "queue_id", "queue_offset"),
    "real": ("broker_name", "topic", "queue_id", "queue_offset"),
    "offset": ("_record_hash",),
    "consumer": ("_record_hash",),
    "copy": ("broker_name", "topic", "queue_id", "queue_offset"),
    "topology": ("_record_hash",),
    "trace": ("broker_name", "topic", "queue_id", "queue_offset", "context_index"),
}

BRONZE = {
    stream: Schema(f"{stream}_events", schema.fields + BOOKKEEPING, KEYS[stream]) for stream, schema in LANDING.items()
}

# Liquid clustering: queries go by broker and time.
CLUSTER_BY = {
    "half": ("broker_name", "store_timestamp"),
    "op": ("broker_name", "store_timestamp"),
    "real": ("broker_name", "store_timestamp"),
    "offset": ("broker_name", "commit_timestamp"),
    "consumer": ("consumer_group", "snapshot_ts"),
    "copy": ("consumer_group", "store_timestamp"),
    "topology": ("kind", "snapshot_ts"),
    "trace": ("uniq_key", "store_timestamp"),  # `txn-recon trace KEY` looks a message up by its key
}

# When each record happened, in its stream's own terms: stored, committed or snapshotted. A run's data time
# (`as_of`) defaults to the latest of them.
EVENT_TIME = {
    "half": "store_timestamp",
    "op": "store_timestamp",
    "real": "store_timestamp",
    "offset": "commit_timestamp",
    "consumer": "snapshot_ts",
    "copy": "store_timestamp",
    "topology": "snapshot_ts",
    "trace": "store_timestamp",
}

# The columns Delta keeps file statistics for: key, clustering and time; nothing filters bronze by others.
STATS_COLUMNS = {
    stream: tuple(dict.fromkeys(c for c in KEYS[stream] + CLUSTER_BY[stream] if not c.startswith("_")))
    for stream in LANDING
}

QUARANTINE = Schema(
    "quarantine",
    (
        Field("stream", "string"),
        Field("source_file", "string"),
        Field("raw", "string", nullable=True, doc="the line as landed (JSON Lines) or the row as JSON (Parquet)"),
        Field("reason", "string"),
        Field("raw_hash", "string", doc="SHA-256 of raw (or of the file name for an unreadable file)"),
        Field("run_id", "string"),
        Field("ingested_at", "timestamp"),
    ),
    key=("stream", "source_file", "raw_hash"),
)

INGEST_RUNS = Schema(
    "ingest_runs",
    (
        Field("run_id", "string"),
        Field("stream", "string"),
        Field("started_at", "timestamp"),
        Field("finished_at", "timestamp"),
        Field("files", "int"),
        Field("files_failed", "int", doc="unreadable files, each quarantined as one item"),
        Field("records_read", "long", doc="= inserted + duplicates + quarantined"),
        Field("inserted", "long"),
        Field("duplicates", "long", doc="exact repeats dropped, within the run or of earlier rows"),
        Field("quarantined", "long"),
    ),
)

INGEST_FILES = Schema(
    "ingest_files",
    (
        Field("stream", "string"),
        Field("path", "string"),
        Field("size", "long"),
        Field("modified_ms", "long"),
        Field("status", "string", doc="ingested, or failed (unreadable: quarantined, tried again if it changes)"),
        Field("run_id", "string"),
        Field(
            "events_until",
            "long",
            nullable=True,
            doc="no record the file brought happened later (EVENT_TIME): the latest of its batch, inserted or "
            "already stored (0 when it held none); for a file ingested before this column, its stream's latest "
            "then; null for a failed file",
        ),
    ),
    key=("stream", "path", "size", "modified_ms"),
)

COLLECT_RUNS = Schema(
    "collect_runs",
    (
        Field("run_id", "string", doc="one pass of `txn-recon collect` over the cluster"),
        Field("broker_name", "string", nullable=True, doc="null: the name servers did not answer"),
        Field("address", "string", nullable=True),
        Field("started_at", "timestamp"),
        Field("finished_at", "timestamp"),
        Field("status", "string", doc="ok; partial (read, then an error); failed (nothing read)"),
        Field("half", "long", doc="half records written"),
        Field("op", "long"),
        Field("real", "long", doc="final and discarded messages"),
        Field("discarded", "long", doc="of which from TRANS_CHECK_MAX_TIME_TOPIC"),
        Field("offset_records", "long", doc="queues whose committed offset changed since the last snapshot"),
        Field("check_backlog", "long", nullable=True, doc="half messages the check service has not passed"),
        Field("op_backlog", "long", nullable=True, doc="op messages the check service has not read"),
        Field("errors", "strings", doc="one line each"),
    ),
    key=("run_id", "broker_name"),
)
