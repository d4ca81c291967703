"""The anomaly rules of DESIGN §2, one function per type. Pure DataFrame -> DataFrame.

A transaction rule names its `Finding`s about a lifecycle row; `findings` turns any set of them into
rows of the `anomalies` schema, as `offset_regressions` does for commits. `anomaly_id` is a SHA-256 of
the type and the key, (type, broker_name, uniq_key, reason) for transactions and (broker_name,
consumer_group, topic, queue_id, commit_timestamp, seq) for offset regressions, so reruns update
rather than duplicate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from schemas.landing import ROCKSDB_HALF_TOPIC
from transforms.frames import any_of, detail_json, union_all
from transforms.lifecycle import DISCARDED, EXPIRED, MAX_CHECKS, PENDING, Rules, age
from transforms.trace import answer_lost, answer_without_check, answered, discard_answers, discard_cause

OFFSET_KEY = ["broker_name", "consumer_group", "topic", "queue_id"]
REGRESSION = [*OFFSET_KEY, "commit_timestamp", "seq", "offset", "prev_offset", "client_id", "prev_client_id"]


@dataclass(frozen=True)
class Finding:
    """One rule's finding about a lifecycle row: when it `holds`, and the anomaly it records."""

    kind: Column
    reason: Column
    holds: Column
    event_ts: Column
    detail: Column  # a struct, stored as JSON


def findings(*found: Finding, as_of: int) -> Callable[[DataFrame], DataFrame]:
    """Lifecycle rows into anomaly rows, every finding in one pass: each row carries the findings that
    hold for it, exploded, so the lifecycle is read once however many rules there are."""
    hits = F.array(*(
        F.when(f.holds, F.struct(f.kind.alias("anomaly_type"), f.reason.cast("string").alias("reason"),
                                 f.event_ts.cast("bigint").alias("event_ts"), detail_json(f.detail).alias("detail")))
        for f in found
    ))  # fmt: skip

    # Most rows hold no finding. They are left out by a filter Spark compiles before the array is built: the
    # lambda that drops its nulls is interpreted, with every rule in it, row by row (the findings of a full run
    # of 1M transactions: 5.7 s of task time instead of 13.3).
    some = any_of(f.holds for f in found)

    def transform(lifecycle_df: DataFrame) -> DataFrame:
        out = lifecycle_df.where(some).select(
            "broker_name", "uniq_key", F.explode(F.filter(hits, lambda h: h.isNotNull())).alias("f")
        )
        key = F.concat_ws("|", "f.anomaly_type", "broker_name", "uniq_key", F.coalesce("f.reason", F.lit("")))
        return out.select(
            F.sha2(key, 256).alias("anomaly_id"), "f.anomaly_type", "f.reason", "broker_name", "uniq_key",
            F.lit(None).cast("string").alias("consumer_group"), F.lit(None).cast("string").alias("topic"),
            F.lit(None).cast("int").alias("queue_id"), "f.event_ts", F.lit(as_of).alias("as_of"), "f.detail",
        )  # fmt: skip

    return transform


def stuck_half(as_of: int, rules: Rules) -> list[Finding]:
    """PENDING for at least stuck_after_ms; says whether the broker still checks it."""
    still_checking = age(as_of, "last_copy_ts") <= 2 * rules.check_interval_ms + rules.transaction_timeout_ms
    detail = F.struct(age(as_of, "born_ts").alias("age_ms"), still_checking.alias("broker_still_checking"),
                      "copies", "check_times", "producer_group")  # fmt: skip
    holds = (F.col("state") == PENDING) & (age(as_of, "born_ts") >= rules.stuck_after_ms)
    return [Finding(F.lit("STUCK_HALF"), F.lit(None), holds, F.col("born_ts"), detail)]


def discard() -> list[Finding]:
    """DISCARDED_AFTER_MAX_CHECKS and DISCARDED_EXPIRED, by the lifecycle's discard reason."""
    kind = F.when(F.col("reason") == MAX_CHECKS, "DISCARDED_AFTER_MAX_CHECKS").when(
        F.col("reason") == EXPIRED, "DISCARDED_EXPIRED"
    )
    rocksdb = F.coalesce(F.col("half_topic") == ROCKSDB_HALF_TOPIC, F.lit(False))  # a discard leaves no message
    detail = F.struct(
        "check_times", "copies", (F.col("discard_ts").isNotNull() & ~rocksdb).alias("has_evidence"),
        F.when(F.col("reason") == MAX_CHECKS, discard_answers()).alias("answers"),
        F.when(F.col("reason") == MAX_CHECKS, discard_cause()).alias("cause"),
    )  # fmt: skip
    event_ts = F.coalesce("discard_ts", "last_copy_ts")
    return [Finding(kind, F.col("reason"), F.col("state") == DISCARDED, event_ts, detail)]


def traced_answers(as_of: int, rules: Rules) -> list[Finding]:
    """CHECK_ANSWER_LOST, and TRACE_CONTRADICTION ANSWER_WITHOUT_CHECK, from the check answers traced
    (`transforms.trace.answered`)."""
    lost = F.struct("decision", "decided_at", "resolved_ts", "last_copy_ts", "check_times", "producer_group")
    said = F.struct("answers_unknown", "answers_commit", "answers_rollback", "check_times", "copies")
    return [
        Finding(F.lit("CHECK_ANSWER_LOST"), F.lit(None), answer_lost(rules), F.col("decided_at"), lost),
        Finding(F.lit("TRACE_CONTRADICTION"), F.lit("ANSWER_WITHOUT_CHECK"), answer_without_check(),
                F.col("born_ts"), said),
    ]  # fmt: skip


def orphaned_commit(as_of: int, rules: Rules) -> list[Finding]:
    """Commits with no half (NO_HALF), with halves none of which is resolved op_grace_ms after the first
    commit (NO_OP), stored after the discard (AFTER_DISCARD), or pointing at no copy (OFFSET_MISMATCH)."""
    committed, has_half = F.col("commit_count") > 0, F.col("copies") > 0
    after_discard = F.filter("commit_ts", lambda t: t > F.col("discard_ts"))
    stray = F.array_except("prepared_offsets", "copy_offsets")
    by_reason: list[tuple[str, Column, Column, Column]] = [
        ("NO_HALF", ~has_half, F.col("first_commit_ts"), F.struct("commit_count")),
        ("NO_OP", has_half & F.col("resolved_ts").isNull() & (age(as_of, "first_commit_ts") > rules.op_grace_ms),
         F.col("first_commit_ts"), F.struct("commit_count", age(as_of, "first_commit_ts").alias("unresolved_ms"))),
        ("AFTER_DISCARD", F.col("discard_ts").isNotNull() & (F.size(after_discard) > 0),
         F.element_at(after_discard, 1), F.struct("discard_ts", "commit_count")),
        ("OFFSET_MISMATCH", has_half & (F.size(stray) > 0), F.col("first_commit_ts"),
         F.struct(stray.alias("prepared_offsets"), "copy_offsets")),
    ]  # fmt: skip
    return [Finding(F.lit("ORPHANED_COMMIT"), F.lit(reason), committed & cond, ts, detail)
            for reason, cond, ts, detail in by_reason]  # fmt: skip


def duplicate_commit() -> list[Finding]:
    """More than one final message for one transaction; the event is the second commit."""
    detail = F.struct("commit_count", "commit_ts")
    return [Finding(F.lit("DUPLICATE_COMMIT"), F.lit(None), F.col("commit_count") > 1, F.element_at("commit_ts", 2),
                    detail)]  # fmt: skip


def rechecked_after_resolution() -> list[Finding]:
    """Resolved by an op, but the last check copy no op lists: the broker wrote it before the op reached
    it and keeps checking it until a check answer commits it again or it is discarded. The event is the
    first resolution; `op_lag_ms` is how long after the first commit the op was stored."""
    detail = F.struct(
        "state", "unresolved_checks", "check_times",
        (F.col("resolved_ts") - F.col("first_commit_ts")).alias("op_lag_ms"),
        F.col("discard_ts").isNotNull().alias("discarded"), (F.col("commit_count") > 1).alias("committed_twice"),
    )  # fmt: skip
    # A discard ends the checks, so a discarded transaction was checked after its resolution only if a check
    # copy came after it: after its first final message (the broker stores it on the end request) or its op
    # (lagged by seconds, it may follow the discard). A late commit through the original half after the
    # discard is ORPHANED_COMMIT AFTER_DISCARD alone.
    settled = F.least("first_commit_ts", "resolved_ts")  # least skips nulls
    checked_after = F.try_element_at("check_copies", F.lit(-1))["ts"] > settled
    quiet_since = F.col("discard_ts").isNotNull() & ~F.coalesce(checked_after, F.lit(False))
    holds = F.col("resolved_ts").isNotNull() & ~F.coalesce(F.col("last_check_resolved"), F.lit(True)) & ~quiet_since
    return [Finding(F.lit("RECHECKED_AFTER_RESOLUTION"), F.lit(None), holds, F.col("resolved_ts"), detail)]


def offset_commits(offset_df: DataFrame) -> DataFrame:
    """Silver offset commits: each with the queue's previous commit, ordered by (commit_timestamp, seq)."""
    order = Window.partitionBy(*OFFSET_KEY).orderBy("commit_timestamp", "seq", "offset", "client_id")
    return offset_df.select(
        *OFFSET_KEY, "offset", "commit_timestamp", "client_id", "seq",
        F.lag("offset").over(order).alias("prev_offset"),
        F.lag("client_id").over(order).alias("prev_client_id"),
    ).select(
        "*", F.coalesce(F.col("offset") < F.col("prev_offset"), F.lit(False)).alias("is_regression"),
    )  # fmt: skip


def offset_regressions(real_df: DataFrame, as_of: int) -> Callable[[DataFrame], DataFrame]:
    """OFFSET_REGRESSION per regressing commit, with the redelivery estimate: the real messages of the
    queue in [to, from), which a consumer starting from `to` receives again."""

    def transform(offset_commits_df: DataFrame) -> DataFrame:
        regressions = offset_commits_df.where("is_regression").select(*REGRESSION)
        queue = real_df.select("broker_name", "topic", "queue_id", F.col("queue_offset").alias("_qo"))
        in_range = (F.col("_qo") >= F.col("offset")) & (F.col("_qo") < F.col("prev_offset"))
        # Regressions are few: broadcast them against the queue's messages, then count per regression
        # (each also counted with 0 so one without redelivered messages stays; null keys group fine).
        hits = F.broadcast(regressions).join(queue, on=["broker_name", "topic", "queue_id"]).where(in_range)
        redelivered = (
            union_all([regressions.withColumn("_n", F.lit(0)), hits.select(*REGRESSION, F.lit(1).alias("_n"))])
            .groupBy(*REGRESSION)
            .agg(F.sum("_n").alias("redelivery_estimate"))
        )
        detail = F.struct(
            F.col("prev_offset").alias("from_offset"), F.col("offset").alias("to_offset"),
            (F.col("prev_offset") - F.col("offset")).alias("rewind"),
            F.col("prev_client_id").alias("client_before"), F.col("client_id").alias("client_after"),
            F.col("prev_client_id").eqNullSafe(F.col("client_id")).alias("same_client"),
            "redelivery_estimate", "seq",
        )  # fmt: skip
        key = F.concat_ws(
            "|",
            F.lit("OFFSET_REGRESSION"),
            *OFFSET_KEY,
            "commit_timestamp",
            F.coalesce(F.col("seq").cast("string"), F.lit("")),
        )
        return redelivered.select(
            F.sha2(key, 256).alias("anomaly_id"), F.lit("OFFSET_REGRESSION").alias("anomaly_type"),
            F.lit(None).cast("string").alias("reason"), "broker_name", F.lit(None).cast("string").alias("uniq_key"),
            "consumer_group", "topic", "queue_id", F.col("commit_timestamp").alias("event_ts"),
            F.lit(as_of).alias("as_of"), detail_json(detail).alias("detail"),
        )  # fmt: skip

    return transform


def transaction_anomalies(
    lifecycle_df: DataFrame, as_of: int, rules: Rules, trace: DataFrame | None = None
) -> DataFrame:
    """The findings about transactions, with what `trace` (trace_events up to as_of; None: none) says of their
    check answers."""
    every = [*stuck_half(as_of, rules), *discard(), *orphaned_commit(as_of, rules), *duplicate_commit(),
             *rechecked_after_resolution(), *traced_answers(as_of, rules)]  # fmt: skip
    return lifecycle_df.transform(answered(trace, rules)).transform(findings(*every, as_of=as_of))


def all_anomalies(lifecycle_df: DataFrame, offset_commits_df: DataFrame, real_df: DataFrame, as_of: int,
                  rules: Rules) -> DataFrame:  # fmt: skip
    """The transaction findings and offset regressions of DESIGN §2 in one DataFrame."""
    return transaction_anomalies(lifecycle_df, as_of, rules).unionByName(
        offset_commits_df.transform(offset_regressions(real_df, as_of))
    )
