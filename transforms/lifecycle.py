"""Bronze events into one lifecycle row per transaction (DESIGN §2). Pure DataFrame -> DataFrame.

Identity is (broker_name, uniq_key). A half copy is resolved when an op on the same broker and queue
lists its queue offset or its prepared_queue_offset. A commit is a real record with the identity whose
transaction bits are COMMIT (sys_flag & 0xC == 8) or that carries TRAN_MSG, in any topic but
TRANS_CHECK_MAX_TIME_TOPIC; a record in that topic is discard evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
ID = ["broker_name", "uniq_key"]
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


def up_to(as_of: int, time_col: str) -> Callable[[DataFrame], DataFrame]:
    """Only what had happened by `as_of`, so a past data time reproduces its result."""

    def transform(df: DataFrame) -> DataFrame:
        return df.where(F.col(time_col) <= as_of)

    return transform


def resolved_offsets(op_df: DataFrame) -> DataFrame:
    """(broker_name, queue_id, half_offset, resolved_ts): each half offset an op lists, first time seen.
    Bodies are "17" (<= 5.0) or "17,18,20," (5.1+); empty tokens from the trailing comma are skipped."""
    tokens = op_df.select("broker_name", "queue_id", "store_timestamp", F.explode(F.split("body", ",")).alias("t"))
    return (
        tokens.where(F.col("t") != "")
        .groupBy("broker_name", "queue_id", F.col("t").cast("long").alias("half_offset"))
        .agg(F.min("store_timestamp").alias("resolved_ts"))
    )


def with_resolution(resolved_df: DataFrame) -> Callable[[DataFrame], DataFrame]:
    """Half copies plus `resolved_ts`: the first op listing the copy's own or its prepared offset."""

    def transform(half_df: DataFrame) -> DataFrame:
        own = resolved_df.select("broker_name", "queue_id", F.col("half_offset").alias("queue_offset"),
                                 F.col("resolved_ts").alias("_own_ts"))  # fmt: skip
        prepared = resolved_df.select("broker_name", "queue_id", F.col("half_offset").alias("prepared_queue_offset"),
                                      F.col("resolved_ts").alias("_prepared_ts"))  # fmt: skip
        return (
            half_df.join(own, on=["broker_name", "queue_id", "queue_offset"], how="left")
            .join(prepared, on=["broker_name", "queue_id", "prepared_queue_offset"], how="left")
            .withColumn("resolved_ts", F.least("_own_ts", "_prepared_ts"))
            .drop("_own_ts", "_prepared_ts")
        )

    return transform


def transactions(copies_df: DataFrame) -> DataFrame:
    """One row per transaction with a half: its copies aggregated."""
    return copies_df.groupBy(*ID).agg(
        F.min("producer_group").alias("producer_group"),
        F.min("real_topic").alias("real_topic"),
        F.min("real_queue_id").alias("real_queue_id"),
        F.min("born_timestamp").alias("born_ts"),
        F.min("store_timestamp").alias("first_copy_ts"),
        F.max("store_timestamp").alias("last_copy_ts"),
        F.count(F.lit(1)).cast("int").alias("copies"),
        F.max(F.coalesce("check_times", F.lit(0))).alias("check_times"),
        F.min("resolved_ts").alias("resolved_ts"),
        F.collect_set("commit_log_offset").alias("copy_offsets"),
    )


def is_commit() -> Column:
    """A real record that is a transaction's final message (see the module docstring)."""
    return (
        F.col("uniq_key").isNotNull()
        & (F.col("topic") != DISCARD_TOPIC)
        & (((F.col("sys_flag").bitwiseAND(0xC)) == 8) | F.coalesce(F.col("transactional"), F.lit(False)))
    )


def commits(real_df: DataFrame) -> DataFrame:
    """One row per transaction with a final message: count, times, first commit's position."""
    first = F.min(F.struct("store_timestamp", "topic", "queue_id", "queue_offset"))
    return (
        real_df.where(is_commit())
        .groupBy(*ID)
        .agg(
            F.count(F.lit(1)).cast("int").alias("commit_count"),
            F.sort_array(F.collect_list("store_timestamp")).alias("commit_ts"),
            first.alias("_first"),
            F.collect_set("prepared_transaction_offset").alias("prepared_offsets"),
            F.min("producer_group").alias("commit_producer_group"),
        )
        .select(
            *ID,
            "commit_count",
            "commit_ts",
            "prepared_offsets",
            "commit_producer_group",
            F.col("_first.store_timestamp").alias("first_commit_ts"),
            F.col("_first.topic").alias("first_commit_topic"),
            F.col("_first.queue_id").alias("first_commit_queue_id"),
            F.col("_first.queue_offset").alias("first_commit_queue_offset"),
        )
    )


def discards(real_df: DataFrame) -> DataFrame:
    """Discard evidence: the first record of each transaction in TRANS_CHECK_MAX_TIME_TOPIC."""
    evidence = real_df.where((F.col("topic") == DISCARD_TOPIC) & F.col("uniq_key").isNotNull())
    return evidence.groupBy(*ID).agg(F.min("store_timestamp").alias("discard_ts"))


def lifecycle(
    commits_df: DataFrame, discards_df: DataFrame, as_of: int, rules: Rules
) -> Callable[[DataFrame], DataFrame]:
    """Transactions (from `transactions`) joined with commits and discards, with state and reason.
    Keeps the working columns `commit_ts`, `prepared_offsets` and `copy_offsets` for the anomaly rules."""

    def transform(txn_df: DataFrame) -> DataFrame:
        joined = txn_df.join(commits_df, on=ID, how="full_outer").join(discards_df, on=ID, how="left")
        commit_count = F.coalesce("commit_count", F.lit(0))
        check_times = F.coalesce("check_times", F.lit(0))
        maxed = check_times >= rules.check_max
        checks_over = (F.lit(as_of) - F.col("last_copy_ts")) > rules.check_interval_ms + rules.transaction_timeout_ms
        too_old = (F.lit(as_of) - F.col("born_ts")) > rules.file_reserved_hours * 3_600_000
        reason = (
            F.when(F.col("discard_ts").isNotNull(), F.when(maxed, MAX_CHECKS).otherwise(EXPIRED))
            .when(maxed & checks_over, MAX_CHECKS)
            .when(too_old, EXPIRED)
        )
        state = (
            F.when(commit_count > 0, COMMITTED)
            .when(F.col("resolved_ts").isNotNull(), ROLLED_BACK)
            .when(reason.isNotNull(), DISCARDED)
            .otherwise(PENDING)
        )
        return joined.select(
            *ID,
            F.coalesce("producer_group", "commit_producer_group").alias("producer_group"),
            F.coalesce("real_topic", "first_commit_topic").alias("real_topic"),
            F.coalesce("real_queue_id", "first_commit_queue_id").alias("real_queue_id"),
            "born_ts", "first_copy_ts", "last_copy_ts",
            F.coalesce("copies", F.lit(0)).alias("copies"),
            check_times.alias("check_times"),
            "resolved_ts",
            commit_count.alias("commit_count"),
            "first_commit_ts", "first_commit_topic", "first_commit_queue_id", "first_commit_queue_offset",
            "discard_ts",
            state.alias("state"),
            F.when(state == DISCARDED, reason).alias("reason"),
            F.lit(as_of).alias("as_of"),
            F.coalesce("commit_ts", F.array().cast("array<bigint>")).alias("commit_ts"),
            F.coalesce("prepared_offsets", F.array().cast("array<bigint>")).alias("prepared_offsets"),
            F.coalesce("copy_offsets", F.array().cast("array<bigint>")).alias("copy_offsets"),
        )  # fmt: skip

    return transform


def age(as_of: int, col_name: str) -> Column:
    return F.lit(as_of) - F.col(col_name)
