"""Bronze events into one lifecycle row per transaction (DESIGN §2). Pure DataFrame -> DataFrame.

Identity is (broker_name, uniq_key). A half copy is resolved when an op on the same broker and queue, in
the op topic of its half topic, lists its queue offset. Listing an immunity copy's prepared_queue_offset
does not resolve it: a real 5.3.3 broker ignores op offsets below its check progress, and the original's
always is by then. A commit is a real record with the identity whose transaction bits are COMMIT
(sys_flag & 0xC == 8) or that carries TRAN_MSG, in any topic but TRANS_CHECK_MAX_TIME_TOPIC; a record in
that topic is discard evidence. A RIP-82 broker leaves none: `rocksdb_deleted` infers its discards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.landing import HALF_TOPIC_OF_OP, ROCKSDB_HALF_TOPIC
from transforms.frames import union_all

DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
ID = ["broker_name", "uniq_key"]
LOOKUP = ["broker_name", "half_topic", "queue_id", "half_offset"]  # what an op lists, and where
COMMITTED, ROLLED_BACK, DISCARDED, PENDING = "COMMITTED", "ROLLED_BACK", "DISCARDED", "PENDING"
MAX_CHECKS, EXPIRED = "MAX_CHECKS", "EXPIRED"


@dataclass(frozen=True)
class Rules:
    """Broker settings and detection thresholds (DESIGN §2), from configuration."""

    transaction_timeout_ms: int = 6000
    check_interval_ms: int = 30000
    check_max: int = 15
    file_reserved_hours: int = 72
    stuck_after_ms: int = 60000
    op_grace_ms: int = 10000
    stranded_after_ms: int = 60000
    route_delay_ms: int = 60000
    idle_window_ms: int = 60000
    idle_min_messages: int = 100


def up_to(as_of: int, time_col: str) -> Callable[[DataFrame], DataFrame]:
    """Only what had happened by `as_of`, so a past data time reproduces its result."""

    def transform(df: DataFrame) -> DataFrame:
        return df.where(F.col(time_col) <= as_of)

    return transform


def op_offsets(op_df: DataFrame) -> DataFrame:
    """(*LOOKUP, store_timestamp): one row per half offset an op lists. Bodies are "17" (<= 5.0, RIP-82)
    or "17,18,20," (5.1+); empty tokens from the trailing comma are skipped."""
    half_topic = F.create_map(*(F.lit(t) for pair in HALF_TOPIC_OF_OP.items() for t in pair))[F.col("topic")]
    tokens = op_df.select("broker_name", half_topic.alias("half_topic"), "queue_id", "store_timestamp",
                          F.explode(F.split("body", ",")).alias("t"))  # fmt: skip
    return tokens.where(F.col("t") != "").select(
        "broker_name", "half_topic", "queue_id", F.col("t").cast("long").alias("half_offset"), "store_timestamp"
    )


def listed_copies(op_df: DataFrame) -> DataFrame:
    """(broker_name, topic, queue_id, queue_offset): the half copies the ops list, named as half_events
    names them."""
    return op_offsets(op_df).select("broker_name", F.col("half_topic").alias("topic"), "queue_id",
                                    F.col("half_offset").alias("queue_offset"))  # fmt: skip


def earliest(op_offsets_df: DataFrame) -> DataFrame:
    """`op_offsets` reduced to (*LOOKUP, resolved_ts): the first listing."""
    return op_offsets_df.groupBy(*LOOKUP).agg(F.min("store_timestamp").alias("resolved_ts"))


def resolved_offsets(op_df: DataFrame) -> DataFrame:
    """Each half offset an op lists, with the first time it was listed."""
    return earliest(op_offsets(op_df))


def copy_lookups(half_df: DataFrame) -> DataFrame:
    """(broker_name, uniq_key, half_topic, queue_id, half_offset): the listing that resolves each copy."""
    return half_df.select(*ID, F.col("topic").alias("half_topic"), "queue_id",
                          F.col("queue_offset").alias("half_offset"))  # fmt: skip


def resolutions(half_df: DataFrame, resolved_df: DataFrame) -> DataFrame:
    """(broker_name, uniq_key, half_offset, resolved_ts) for every copy whose offset `resolved_df` lists."""
    return copy_lookups(half_df).join(resolved_df, on=LOOKUP).select(*ID, "half_offset", "resolved_ts")


def is_commit() -> Column:
    """A real record that is a transaction's final message (see the module docstring)."""
    return (
        F.col("uniq_key").isNotNull()
        & (F.col("topic") != DISCARD_TOPIC)
        & (((F.col("sys_flag").bitwiseAND(0xC)) == 8) | F.coalesce(F.col("transactional"), F.lit(False)))
    )


# Every event of a transaction becomes one "fact" row of one shape, so a single aggregation by identity
# builds the lifecycle: one shuffle, where joining per-source aggregates takes three more.
HALF_FACT, RESOLVED_FACT, COMMIT_FACT, DISCARD_FACT = "half", "resolved", "commit", "discard"
_FACT_TYPES = {"ts": "bigint", "grp": "string", "topic": "string", "queue_id": "int", "queue_offset": "bigint",
               "log_offset": "bigint", "born_ts": "bigint", "check_times": "int", "half_topic": "string"}  # fmt: skip


def facts(half_df: DataFrame, resolutions_df: DataFrame, real_df: DataFrame) -> DataFrame:
    """Half copies, resolutions, commits and discard evidence as rows of one schema, keyed by identity."""

    def fact(df: DataFrame, kind: str, **cols: str | Column) -> DataFrame:
        values = [F.col(c) if isinstance(c, str) else c for c in (cols.get(n, F.lit(None)) for n in _FACT_TYPES)]
        return df.select(
            *ID,
            F.lit(kind).alias("kind"),
            *(v.cast(t).alias(n) for v, (n, t) in zip(values, _FACT_TYPES.items(), strict=True)),
        )

    discard_evidence = (F.col("topic") == DISCARD_TOPIC) & F.col("uniq_key").isNotNull()
    return union_all([
        fact(half_df, HALF_FACT, ts="store_timestamp", grp="producer_group", topic="real_topic",
             queue_id="real_queue_id", queue_offset="queue_offset", log_offset="commit_log_offset",
             born_ts="born_timestamp", check_times=F.coalesce("check_times", F.lit(0)), half_topic="topic"),
        fact(resolutions_df, RESOLVED_FACT, ts="resolved_ts", queue_offset="half_offset"),
        fact(real_df.where(is_commit()), COMMIT_FACT, ts="store_timestamp", grp="producer_group", topic="topic",
             queue_id="queue_id", queue_offset="queue_offset", log_offset="prepared_transaction_offset"),
        fact(real_df.where(discard_evidence), DISCARD_FACT, ts="store_timestamp"),
    ])  # fmt: skip


def lifecycle(as_of: int, rules: Rules) -> Callable[[DataFrame], DataFrame]:
    """`facts` into one row per transaction with a half or a commit, with state and reason. Keeps the
    working columns `commit_ts`, `prepared_offsets`, `copy_offsets`, `check_copies` (time and queue offset of
    each, in time order), `resolved_copies` (the queue offsets ops list), `last_check_resolved` (null: no check
    copy) and `unresolved_checks` for the anomaly rules."""

    def of(kind: str, col: str | Column) -> Column:  # a fact's column, null for other kinds
        return F.when(F.col("kind") == kind, F.col(col) if isinstance(col, str) else col)

    def transform(facts_df: DataFrame) -> DataFrame:
        # The facts are shuffled by identity before they are aggregated. A transaction has about three, so
        # the partial aggregation Spark runs before its own shuffle merged almost none and shuffled twenty
        # aggregation buffers per fact instead of the fact (1M transactions: about 10 s against 16).
        partitions = int(facts_df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 1)
        by_id = facts_df.repartition(partitions, *ID)
        agg = by_id.groupBy(*ID).agg(
            F.min(of(HALF_FACT, "grp")).alias("producer_group"),
            F.min(of(HALF_FACT, "topic")).alias("real_topic"),
            F.min(of(HALF_FACT, "queue_id")).alias("real_queue_id"),
            F.min(of(HALF_FACT, "born_ts")).alias("born_ts"),
            F.min(of(HALF_FACT, "ts")).alias("first_copy_ts"),
            F.max(of(HALF_FACT, "ts")).alias("last_copy_ts"),
            F.count(of(HALF_FACT, F.lit(1))).cast("int").alias("copies"),
            F.coalesce(F.max(of(HALF_FACT, "check_times")), F.lit(0)).alias("check_times"),
            F.array_sort(F.collect_set(of(HALF_FACT, "log_offset"))).alias("copy_offsets"),
            F.min(of(RESOLVED_FACT, "ts")).alias("resolved_ts"),
            F.max(of(HALF_FACT, F.when(F.col("check_times") > 0, F.col("queue_offset")))).alias("_last_check"),
            F.collect_set(of(HALF_FACT, F.when(F.col("check_times") > 0, F.col("queue_offset")))).alias("_checks"),
            F.collect_set(of(RESOLVED_FACT, "queue_offset")).alias("_resolved"),
            F.array_sort(
                F.collect_list(of(HALF_FACT, F.when(F.col("check_times") > 0, F.struct("ts", "queue_offset"))))
            ).alias("check_copies"),
            F.count(of(COMMIT_FACT, F.lit(1))).cast("int").alias("commit_count"),
            F.sort_array(F.collect_list(of(COMMIT_FACT, "ts"))).alias("commit_ts"),
            F.min(of(COMMIT_FACT, F.struct("ts", "topic", "queue_id", "queue_offset"))).alias("_first"),
            F.array_sort(F.collect_set(of(COMMIT_FACT, "log_offset"))).alias("prepared_offsets"),
            F.min(of(COMMIT_FACT, "grp")).alias("commit_producer_group"),
            F.min(of(DISCARD_FACT, "ts")).alias("_evidence_ts"),
            F.min(of(HALF_FACT, "half_topic")).alias("half_topic"),
        )
        maxed = F.col("check_times") >= rules.check_max
        slack = rules.check_interval_ms + rules.transaction_timeout_ms
        checks_over = (F.lit(as_of) - F.col("last_copy_ts")) > slack
        too_old = (F.lit(as_of) - F.col("born_ts")) > rules.file_reserved_hours * 3_600_000
        deleted = rocksdb_deleted(as_of, rules)
        reason = (
            F.when(F.col("_evidence_ts").isNotNull(), F.when(maxed, MAX_CHECKS).otherwise(EXPIRED))
            .when(deleted.isNotNull(), MAX_CHECKS)
            .when(maxed & checks_over, MAX_CHECKS)
            .when(too_old, EXPIRED)
        )
        state = (
            F.when(F.col("commit_count") > 0, COMMITTED)
            .when(F.col("resolved_ts").isNotNull(), ROLLED_BACK)
            .when(reason.isNotNull(), DISCARDED)
            .otherwise(PENDING)
        )
        return agg.where((F.col("copies") > 0) | (F.col("commit_count") > 0)).select(
            *ID,
            F.coalesce("producer_group", "commit_producer_group").alias("producer_group"),
            F.coalesce("real_topic", "_first.topic").alias("real_topic"),
            F.coalesce("real_queue_id", "_first.queue_id").alias("real_queue_id"),
            "born_ts", "first_copy_ts", "last_copy_ts", "copies", "check_times", "resolved_ts", "commit_count",
            F.col("_first.ts").alias("first_commit_ts"), F.col("_first.topic").alias("first_commit_topic"),
            F.col("_first.queue_id").alias("first_commit_queue_id"),
            F.col("_first.queue_offset").alias("first_commit_queue_offset"),
            F.coalesce("_evidence_ts", deleted).alias("discard_ts"),
            state.alias("state"),
            F.when(state == DISCARDED, reason).alias("reason"),
            "half_topic",
            "commit_ts", "prepared_offsets", "copy_offsets", "check_copies",
            F.col("_resolved").alias("resolved_copies"),
            F.when(F.col("_last_check").isNotNull(), F.array_contains("_resolved", F.col("_last_check")))
            .alias("last_check_resolved"),
            F.size(F.array_except("_checks", "_resolved")).alias("unresolved_checks"),
        )  # fmt: skip

    return transform


def rocksdb_deleted(as_of: int, rules: Rules) -> Column:
    """When a RIP-82 broker deleted an unresolved half, by the rules: it checks the original once more than
    check_max times, the first at the timeout, then every interval, and deletes it at the last check, with
    no message and its count kept in RocksDB (README, RocketMQ versions). Null unless a commit or an op
    came after that time or none came, and the rules' slack has passed (as `checks_over` for a classic
    half). Over the aggregated lifecycle columns."""
    at = F.col("first_copy_ts") + rules.transaction_timeout_ms + rules.check_max * rules.check_interval_ms
    settled = F.least(F.col("resolved_ts"), F.col("_first.ts"))  # least skips nulls
    return F.when(
        (F.col("half_topic") == ROCKSDB_HALF_TOPIC)
        & (F.lit(as_of) - at > rules.check_interval_ms + rules.transaction_timeout_ms)
        & F.coalesce(settled > at, F.lit(True)),
        at,
    )


def open_transactions() -> Column:
    """Lifecycle rows whose result can change with a later as_of alone, without new events: pending,
    discarded only by the clock (EXPIRED may still become MAX_CHECKS), or committed but unresolved
    (NO_OP and its `unresolved_ms` grow). Every other row is final until its transaction has new events."""
    return (
        (F.col("state") == PENDING)
        | ((F.col("state") == DISCARDED) & F.col("discard_ts").isNull())
        | ((F.col("commit_count") > 0) & (F.col("copies") > 0) & F.col("resolved_ts").isNull())
    )


def age(as_of: int, col_name: str) -> Column:
    return F.lit(as_of) - F.col(col_name)
