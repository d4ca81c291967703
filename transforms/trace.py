"""The message-trace rules (docs/concepts/trace.md). Pure DataFrame -> DataFrame.

Tracing is per client and lossy (each client's dispatcher sends its contexts in batches, and drops them when
its queue is full or it dies first), so a rule concludes from the absence of a trace only for a group whose
clients traced in that window (`covered`).

- `answered` puts each transaction's traced check answers beside its lifecycle row; the discard rule and
  CHECK_ANSWER_LOST (`transforms.anomalies`) read them.
- `attempts` pairs each consumption's SubBefore and SubAfter (by request id and key); `consumption_findings`
  turns them into DUPLICATE_CONSUMPTION, CONSUME_FAILED and the contradictions with the deliveries.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.landing import ROCKSDB_HALF_TOPIC
from transforms.frames import detail_json, union_all
from transforms.lifecycle import MAX_CHECKS, Rules

UNKNOW, COMMIT, ROLLBACK = "UNKNOW", "COMMIT_MESSAGE", "ROLLBACK_MESSAGE"
# Findings from the consumption trace: recomputed whole by every run, after the deliveries they are compared with.
CONSUMPTION_TYPES = ("DUPLICATE_CONSUMPTION", "CONSUME_FAILED", "TRACE_CONTRADICTION")
ANSWER_COLUMNS = ("traced", "answers_unknown", "answers_commit", "answers_rollback", "decided_at", "decision",
                  "decided_answers", "group_alive")  # fmt: skip


def broker_time() -> Column:
    """When a context happened on the broker's clock: its client time moved by how far the client's clock is
    from the broker's, which the trace message itself shows (stored minus born, plus the network's delay).
    Client clocks can be hours off; the rules compare trace times with store times only this way."""
    return F.col("timestamp") + F.col("store_timestamp") - F.col("born_timestamp")


def answers(trace: DataFrame) -> DataFrame:
    """Every check answer traced (EndTransaction with fromTransactionCheck), at its broker time `at`."""
    return trace.where((F.col("trace_type") == "EndTransaction") & F.col("from_check")).select(
        "uniq_key", F.col("group_name").alias("producer_group"), broker_time().alias("at"), "transaction_state"
    )


def producer_trace(trace: DataFrame) -> DataFrame:
    """What producer groups traced (sends and end requests), by group and broker time: their coverage."""
    return trace.where(F.col("trace_type").isin("Pub", "EndTransaction")).select(
        F.col("group_name").alias("producer_group"), "uniq_key", broker_time().alias("at")
    )


def answered(trace: DataFrame | None, rules: Rules) -> Callable[[DataFrame], DataFrame]:
    """Lifecycle rows with their traced check answers (ANSWER_COLUMNS), times on the broker's clock:
    - `traced` (of a discard after the maximum checks): the producer group traced the half's send, or anything
      between its first copy and its discard: its clients trace, so a missing answer is missing, not untraced;
    - `answers_*`: check answers by state; `decided_at`, `decision`: the first COMMIT answer; `decided_answers`:
      the COMMIT answers traced at that instant (a broker that restarts behind its check progress checks a copy
      and the copy that an earlier check of it wrote in one pass, and both are answered at once);
    - `group_alive`: the group traced something else between the transaction's last check copy and its discard,
      when the broker made its last check: a producer that was at work then and sent no answer at all got no
      check-back. (A group that idles then, or that stopped before, counts as gone.)
    With no trace (None), every row is untraced."""

    def transform(life: DataFrame) -> DataFrame:
        if trace is None:
            none = [F.lit(0).alias(c) for c in ANSWER_COLUMNS[1:4]]
            decided = [F.lit(None).cast("bigint").alias("decided_at"), F.lit(None).cast("string").alias("decision"),
                       F.lit(0).alias("decided_answers")]  # fmt: skip
            return life.select("*", F.lit(False).alias("traced"), *none, *decided, F.lit(False).alias("group_alive"))
        check, sent = answers(trace), producer_trace(trace)
        keys = life.select("uniq_key", "producer_group", "first_copy_ts", "last_copy_ts", "discard_ts", "reason")
        counts = (
            check.join(keys.select("uniq_key", "producer_group"), on=["uniq_key", "producer_group"], how="left_semi")
            .groupBy("uniq_key", "producer_group")
            .agg(
                F.count_if(F.col("transaction_state") == UNKNOW).alias("answers_unknown"),
                F.count_if(F.col("transaction_state") == COMMIT).alias("answers_commit"),
                F.count_if(F.col("transaction_state") == ROLLBACK).alias("answers_rollback"),
                F.min_by(F.struct("at", "transaction_state"),
                         F.when(F.col("transaction_state") == COMMIT, F.col("at"))).alias("_decided"),
                F.collect_list(F.when(F.col("transaction_state") == COMMIT, F.col("at"))).alias("_commits_at"),
            )
        )  # fmt: skip
        # Coverage is needed of discards alone, which are few: their windows cut into minutes, joined with what
        # the group traced in those minutes (an equi-join), then compared exactly.
        discards = keys.where(F.col("reason") == MAX_CHECKS).select(
            "uniq_key", "producer_group", "first_copy_ts", "last_copy_ts",
            F.coalesce("discard_ts", F.col("last_copy_ts") + rules.check_interval_ms).alias("_until"),
        )  # fmt: skip
        minutes = discards.withColumn("_minute", F.explode(F.sequence(_minute("first_copy_ts"), _minute("_until"))))
        inside = (
            sent.withColumn("_minute", _minute("at")).alias("s")
            .join(minutes.alias("w"), on=["producer_group", "_minute"])
            .where(F.col("s.at").between(F.col("w.first_copy_ts"), F.col("w._until")))
            .groupBy("w.uniq_key", "producer_group")
            .agg(F.max((F.col("s.uniq_key") != F.col("w.uniq_key"))
                       & (F.col("s.at") >= F.col("w.last_copy_ts"))).alias("group_alive"))
        )  # fmt: skip
        own = sent.join(discards.select("uniq_key", "producer_group"), on=["uniq_key", "producer_group"],
                        how="left_semi").select("uniq_key", "producer_group").distinct()  # fmt: skip
        seen = inside.join(own.withColumn("_own", F.lit(True)), on=["uniq_key", "producer_group"], how="full").select(
            "uniq_key", "producer_group", F.lit(True).alias("traced"), "group_alive"
        )
        out = life.join(counts, on=["uniq_key", "producer_group"], how="left").join(
            seen, on=["uniq_key", "producer_group"], how="left"
        )
        at = F.col("_decided.at")
        return out.select(
            *life.columns,
            F.coalesce("traced", F.lit(False)).alias("traced"),
            *(F.coalesce(c, F.lit(0)).alias(c) for c in ("answers_unknown", "answers_commit", "answers_rollback")),
            at.alias("decided_at"),
            F.when(at.isNotNull(), F.col("_decided.transaction_state")).alias("decision"),
            F.when(at.isNotNull(), F.size(F.filter("_commits_at", lambda t: t == at)))
            .otherwise(0)
            .alias("decided_answers"),
            F.coalesce("group_alive", F.lit(False)).alias("group_alive"),
        )

    return transform


def _minute(ts: str) -> Column:
    return F.floor(F.col(ts) / 60_000)


def discard_answers() -> Column:
    """The `answers` of a discard of a traced group: its checks answered UNKNOW, COMMIT or ROLLBACK, and not."""
    answered_n = F.col("answers_unknown") + F.col("answers_commit") + F.col("answers_rollback")
    return F.when(
        F.col("traced"),
        F.struct(
            F.col("answers_unknown").alias("unknown"), F.col("answers_commit").alias("commit"),
            F.col("answers_rollback").alias("rollback"),
            F.greatest(F.col("check_times") - answered_n, F.lit(0)).alias("unanswered"),
        ),
    )  # fmt: skip


def discard_cause() -> Column:
    """Why a traced group's transaction was discarded: a decisive answer lost on the way (CHECK_ANSWER_LOST),
    the application answering UNKNOW, no answer while the group was alive (no check-back reached it), or no
    answer and no sign of the group (its producers were gone)."""
    return (
        F.when(~F.col("traced"), F.lit(None))
        .when(F.col("answers_commit") + F.col("answers_rollback") > 0, "ANSWER_LOST")
        .when(F.col("answers_unknown") > 0, "ANSWERED_UNKNOWN")
        .when(F.col("group_alive"), "CHECKS_WITHOUT_CALLBACK")
        .otherwise("UNANSWERED")
    )


def answer_lost(rules: Rules) -> Column:
    """The first COMMIT answer to a check, traced, never reached the broker: the broker checked the transaction
    again, no op lists the check copy it answered, and fewer commits were stored within the op grace after it
    than COMMIT answers were traced then (a broker that dies between the commit and its op loses the op, not
    the answer). The copy answered is the last one stored before it; when n answers share its instant, the
    first of the last n. A ROLLBACK that arrives leaves only its op, which a broker crash loses as well: it is
    not judged. It depends on events alone: an op that comes late clears it, as it should."""
    at, n = F.col("decided_at"), F.col("decided_answers")
    checked = F.filter("check_copies", lambda c: c["ts"] <= at)
    # Never index 0, which fails even in try_element_at: compiled code may evaluate it for rows no decision holds.
    answered = F.try_element_at(checked, -F.greatest(F.least(n, F.size(checked)), F.lit(1)))
    committed = F.size(F.filter("commit_ts", lambda t: (t >= at) & (t <= at + rules.op_grace_ms)))
    return (
        at.isNotNull()
        & answered.isNotNull()
        & ~F.array_contains("resolved_copies", answered["queue_offset"])
        & (committed < n)
        & (F.col("last_copy_ts") > at)
    )


def answer_without_check() -> Column:
    """A check answer traced for a transaction we saw no check of: a finding about our reading of the store (a
    RIP-82 broker keeps its check counts out of the store, so its transactions are not judged)."""
    answered_n = F.col("answers_unknown") + F.col("answers_commit") + F.col("answers_rollback")
    classic = F.coalesce(F.col("half_topic") != ROCKSDB_HALF_TOPIC, F.lit(True))
    return (answered_n > 0) & (F.col("check_times") == 0) & classic


def attempts(trace: DataFrame) -> DataFrame:
    """One row per consumption attempt: its group, message (key and KEYS), instance (the trace sender), start, retry
    count and, once its SubAfter is traced, success and cost. A SubAfter without its SubBefore (lost) still
    counts, with its own time and group where it gives them."""
    before = trace.where(F.col("trace_type") == "SubBefore").select(
        "request_id", "uniq_key", F.col("group_name").alias("_group"), F.col("timestamp").alias("started_at"),
        "retry_times", F.col("born_host").alias("_host"), F.col("keys").alias("_keys"),
    )  # fmt: skip
    after = trace.where(F.col("trace_type") == "SubAfter").select(
        "request_id", "uniq_key", F.col("group_name").alias("_after_group"), F.col("timestamp").alias("_after_ts"),
        "success", "cost_ms", F.col("born_host").alias("_after_host"), F.col("keys").alias("_after_keys"),
    )  # fmt: skip
    both = before.join(after, on=["request_id", "uniq_key"], how="full")
    return both.select(
        F.coalesce("_group", "_after_group").alias("consumer_group"), "uniq_key",
        F.coalesce("_keys", "_after_keys").alias("keys"), "request_id",
        F.coalesce("_host", "_after_host").alias("instance"),
        F.coalesce("started_at", "_after_ts").alias("started_at"), "retry_times", "success", "cost_ms",
    ).where(F.col("consumer_group").isNotNull())  # fmt: skip


# A consumed message is named by its UNIQ_KEY and its KEYS: the messages of one batch are stored with the batch's
# UNIQ_KEY after their own (MessageExtEncoder appends the batch's properties), so a consumer, and its trace, sees
# one key for all of them.
MESSAGE_ID = ["uniq_key", "_keys"]
LOCATION = ["broker_name", "topic", "queue_id", "queue_offset"]


def _named(df: DataFrame) -> DataFrame:
    return df.withColumn("_keys", F.coalesce("keys", F.lit("")))


def consumption_findings(tried: DataFrame, real: DataFrame, deliveries: DataFrame, explaining: DataFrame,
                         as_of: int) -> DataFrame:  # fmt: skip
    """DUPLICATE_CONSUMPTION (a message consumed successfully more than once in one group, each attempt named,
    linked to the hand-offs and regressions whose window holds it, and to its delivery's estimate),
    CONSUME_FAILED (attempts that failed, beside the group's retry copies of it) and TRACE_CONTRADICTION
    CONSUMED_BUT_UNDELIVERED (consumed, where the deliveries say a filter refused it).
    `explaining`: the OFFSET_REGRESSION and REDELIVERY_AT_HANDOFF rows of the anomalies."""
    attempt = F.struct("instance", "started_at", "success", "cost_ms", "retry_times", "request_id")
    per_message = (
        _named(tried)
        .groupBy("consumer_group", *MESSAGE_ID)
        .agg(
            F.first("keys").alias("keys"),
            F.count_if(F.col("success")).alias("consumed"),
            F.count_if(~F.col("success")).alias("failed"),
            F.sort_array(F.collect_list(attempt)).alias("attempts"),
            F.min(F.when(F.col("success"), F.col("started_at"))).alias("first_consumed"),
            F.max("started_at").alias("last_attempt"),
        )
    )
    notable = per_message.where((F.col("consumed") > 1) | (F.col("failed") > 0))
    # Where each message is stored (its first copy, by queue position), and what the deliveries say of it.
    stored = _named(real.join(F.broadcast(notable.select("uniq_key").distinct()), on="uniq_key", how="left_semi"))
    placed = stored.groupBy(*MESSAGE_ID).agg(F.min(F.struct(*LOCATION)).alias("_at"), F.count("*").alias("stored"))
    delivered = deliveries.select("consumer_group", *LOCATION, "status", "retries", "duplicates_expected")
    rows = (
        notable.join(placed, on=MESSAGE_ID, how="left")
        .select("*", *(F.col(f"_at.{c}").alias(c) for c in LOCATION))
        .join(delivered, on=["consumer_group", *LOCATION], how="left")
    )
    windows = explaining.select(
        "consumer_group", "broker_name", "topic", "queue_id", F.col("anomaly_id").alias("_id"),
        F.col("anomaly_type").alias("_type"),
        F.get_json_object("detail", "$.from_offset").cast("long").alias("_from"),
        F.get_json_object("detail", "$.to_offset").cast("long").alias("_to"),
    )  # fmt: skip
    inside = F.col("queue_offset").between(F.least("_from", "_to"), F.greatest("_from", "_to") - 1)
    explained = (
        rows.where(F.col("consumed") > 1)
        .join(windows, on=["consumer_group", "broker_name", "topic", "queue_id"])
        .where(inside)
        .groupBy("consumer_group", *MESSAGE_ID)
        .agg(F.sort_array(F.collect_set(F.struct(F.col("_type").alias("type"), F.col("_id").alias("anomaly_id"))))
             .alias("explained_by"))
    )  # fmt: skip
    rows = rows.join(explained, on=["consumer_group", *MESSAGE_ID], how="left")
    duplicate = F.struct(
        "consumed", "keys", F.filter("attempts", lambda a: a["success"]).alias("attempts"),
        F.coalesce("explained_by", F.array().cast("array<struct<type:string,anomaly_id:string>>")).alias(
            "explained_by"),
        F.coalesce(F.col("duplicates_expected") > 0, F.lit(False)).alias("predicted"), "stored",
    )  # fmt: skip
    failed = F.struct("failed", "consumed", "keys", F.filter("attempts", lambda a: ~a["success"]).alias("attempts"),
                      F.col("retries").alias("retry_copies"), "status")  # fmt: skip
    found = union_all([
        _rows(rows.where(F.col("consumed") > 1), "DUPLICATE_CONSUMPTION", None, "last_attempt", duplicate, as_of),
        _rows(rows.where(F.col("failed") > 0), "CONSUME_FAILED", None, "last_attempt", failed, as_of),
    ])  # fmt: skip
    # A refused message that a hand-off or a regression delivered again (`duplicates_expected`) may well have
    # been consumed then: the status says what the first pass did, and the trace what the second did.
    refused = deliveries.where((F.col("status") == "UNDELIVERED") & (F.col("duplicates_expected") == 0))
    named = _named(real.join(F.broadcast(refused.select(*LOCATION)), on=LOCATION, how="left_semi")).select(
        *LOCATION, *MESSAGE_ID, "keys"
    )
    consumed = per_message.where(F.col("consumed") > 0).select("consumer_group", *MESSAGE_ID, "consumed",
                                                                "first_consumed")  # fmt: skip
    lost = (
        refused.select("consumer_group", *LOCATION, "status").join(named, on=LOCATION)
        .join(consumed, on=["consumer_group", *MESSAGE_ID])
    )  # fmt: skip
    contradiction = F.struct("consumed", "status", "first_consumed", "queue_offset")
    return union_all([found, _rows(lost, "TRACE_CONTRADICTION", "CONSUMED_BUT_UNDELIVERED", "first_consumed",
                                   contradiction, as_of)])  # fmt: skip


def _rows(df: DataFrame, kind: str, reason: str | None, event_ts: str, detail: Column, as_of: int) -> DataFrame:
    key = F.concat_ws("|", F.lit(kind), "consumer_group", F.coalesce("broker_name", F.lit("")), "uniq_key", "_keys",
                      F.lit(reason or ""))  # fmt: skip
    return df.select(
        F.sha2(key, 256).alias("anomaly_id"), F.lit(kind).alias("anomaly_type"),
        F.lit(reason).cast("string").alias("reason"), F.coalesce("broker_name", F.lit("")).alias("broker_name"),
        "uniq_key", "consumer_group", F.col("topic").cast("string"), F.col("queue_id").cast("int"),
        F.col(event_ts).cast("bigint").alias("event_ts"), F.lit(as_of).alias("as_of"),
        detail_json(detail).alias("detail"),
    )  # fmt: skip
