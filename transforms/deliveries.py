"""The deliveries table (DESIGN §2, "Every committed message, in every group that subscribes to it"): one row
per stored business message and consumer group that wants it, with what became of it in that group.

A group wants a message when, at its latest snapshot, some member subscribes the message's topic with an
expression its tag matches (RocketMQ's tag rule, `consumers.tag_matches`). A group that commits offsets on
a topic but was never snapshot (offsets read from a store alone) is taken to want all of it.

Status, first that holds:
- DEAD_LETTERED: the group's consumers failed it until the broker parked a copy in `%DLQ%<group>`.
- UNDELIVERED: the committed offset passed it while every filter that applied refused it (UNDELIVERED
  `messages`).
- POSSIBLY_UNDELIVERED: the committed offset passed it while some filter that may have applied refused it
  and the snapshots cannot tell which applied (UNDELIVERED `at_most`, beyond `messages`): a hand-off or a new
  table in the window, or a pass before the group's first snapshot.
- CONSUMED: the group's committed offset is past it (after `retries` send-backs, if any).
- PENDING: not passed yet. Its age at `as_of` (the reconcile run's, in `reconcile_runs`) is not stored: every
  run would rewrite every pending row for it.
So for every group: stored and wanted = consumed + dead-lettered + undelivered + possibly undelivered + pending.

`duplicates_expected` counts the windows that deliver it to the group again: hand-offs whose new holder
restarts below it (REDELIVERY_AT_HANDOFF) and committed offsets that went back past it (OFFSET_REGRESSION).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from transforms.consumers import QUEUE, Refusals, refused_messages, tag_matches
from transforms.frames import union_all

MESSAGE = [*QUEUE, "queue_offset"]
LOST = ("UNDELIVERED", "POSSIBLY_UNDELIVERED")  # the statuses of messages a tag filter refused, or may have
# The findings that deliver messages again, and where their window [low, high) is in their detail.
REDELIVERING = {
    "REDELIVERY_AT_HANDOFF": ("from_offset", "to_offset"),
    "OFFSET_REGRESSION": ("to_offset", "from_offset"),
}


def wanted(consumer_df: DataFrame, offset_commits_df: DataFrame) -> DataFrame:
    """(consumer_group, topic, expressions): what each group's members subscribe per topic at its latest
    snapshot; null expressions for a group with committed offsets on the topic and no snapshot."""
    latest = consumer_df.groupBy("consumer_group").agg(F.max("snapshot_ts").alias("snapshot_ts"))
    own = consumer_df.where((F.col("kind") == "subscription") & F.col("client_id").isNotNull())
    subscribed = (
        own.join(latest, on=["consumer_group", "snapshot_ts"], how="left_semi")
        .groupBy("consumer_group", "topic")
        .agg(F.sort_array(F.collect_set(F.coalesce("expression", F.lit("*")))).alias("expressions"))
    )  # fmt: skip
    unseen = (
        offset_commits_df.select("consumer_group", "topic").distinct()
        .join(latest, on="consumer_group", how="left_anti")
        .withColumn("expressions", F.lit(None).cast("array<string>"))
    )  # fmt: skip
    return subscribed.unionByName(unseen)


def committed_offsets(offset_commits_df: DataFrame) -> DataFrame:
    """(consumer_group, queue, committed): each group's last committed offset per queue."""
    last = Window.partitionBy("consumer_group", *QUEUE).orderBy(F.desc("commit_timestamp"), F.desc_nulls_last("seq"))
    return (
        offset_commits_df.withColumn("_n", F.row_number().over(last)).where("_n = 1")
        .select("consumer_group", *QUEUE, F.col("offset").alias("committed"))
    )  # fmt: skip


def redelivery_windows(findings_df: DataFrame) -> DataFrame:
    """(consumer_group, queue, low, high): the offsets each redelivering finding delivers again."""
    parts = [
        findings_df.where(F.col("anomaly_type") == kind).select(
            "consumer_group", *QUEUE,
            F.get_json_object("detail", f"$.{low}").cast("long").alias("low"),
            F.get_json_object("detail", f"$.{high}").cast("long").alias("high"),
        )
        for kind, (low, high) in REDELIVERING.items()
    ]  # fmt: skip
    return parts[0].unionByName(parts[1]).where(F.col("low") < F.col("high"))


def deliveries(real_df: DataFrame, consumer_df: DataFrame, offset_commits_df: DataFrame, copy_df: DataFrame,
               findings_df: DataFrame, refused: Refusals, as_of: int) -> DataFrame:  # fmt: skip
    """The deliveries table as of `as_of` from the stored messages, the group snapshots, the committed offsets,
    the consumer copies, the group findings and the tag filters' refusals, each up to `as_of`."""
    by_topic = wanted(consumer_df, offset_commits_df)
    messages = real_df.select(*MESSAGE, "uniq_key", "transaction_id", "tags", "store_timestamp")
    wants = F.col("expressions").isNull() | F.exists("expressions", lambda e: tag_matches(e, F.col("tags")))
    rows = messages.join(F.broadcast(by_topic), on="topic").where(wants).drop("expressions")

    copies = copy_df.where(F.col("store_timestamp") <= as_of).select(
        "consumer_group", F.col("origin_topic").alias("topic"), "uniq_key", "kind", "reconsume_times"
    )
    fates = copies.groupBy("consumer_group", "topic", "uniq_key").agg(
        F.countDistinct(F.when(F.col("kind") == "retry", F.col("reconsume_times"))).alias("retries"),
        F.max((F.col("kind") == "dead_letter").cast("int")).cast("boolean").alias("dead"),
    )
    lost = refused_messages(refused)
    windows = redelivery_windows(findings_df)
    again = (
        F.broadcast(windows).join(messages.select(*MESSAGE), on=QUEUE)
        .where((F.col("queue_offset") >= F.col("low")) & (F.col("queue_offset") < F.col("high")))
        .groupBy("consumer_group", *MESSAGE).agg(F.count(F.lit(1)).alias("duplicates_expected"))
    )  # fmt: skip

    joined = (
        rows.join(committed_offsets(offset_commits_df), on=["consumer_group", *QUEUE], how="left")
        .join(fates, on=["consumer_group", "topic", "uniq_key"], how="left")
        .join(lost, on=["consumer_group", *MESSAGE], how="left")
        .join(again, on=["consumer_group", *MESSAGE], how="left")
    )
    status = (
        F.when(F.coalesce("dead", F.lit(False)), "DEAD_LETTERED")
        .when(F.coalesce("certain", F.lit(False)), "UNDELIVERED")
        .when(F.col("certain").isNotNull(), "POSSIBLY_UNDELIVERED")
        .when(F.col("queue_offset") < F.coalesce("committed", F.lit(-1)), "CONSUMED")
        .otherwise("PENDING")
    )
    return joined.withColumn("status", status).select(
        "consumer_group", *MESSAGE, "uniq_key", "transaction_id", "tags", "store_timestamp", "status",
        F.coalesce("retries", F.lit(0)).cast("int").alias("retries"),
        F.coalesce("duplicates_expected", F.lit(0)).cast("int").alias("duplicates_expected"),
    )  # fmt: skip


def changing(real_df: DataFrame, new_real_df: DataFrame, consumer_df: DataFrame, then_commits_df: DataFrame,
             commits_df: DataFrame, stored_df: DataFrame, copy_df: DataFrame, then_findings_df: DataFrame,
             findings_df: DataFrame, refused: Refusals, as_of: int) -> DataFrame:  # fmt: skip
    """The stored messages (rows of `real_df`) whose deliveries rows can differ from `stored_df`'s, the rows
    an earlier run wrote when the offsets committed were `then_commits_df` and the findings `then_findings_df`,
    provided the groups want what they wanted then (`wanted`). Everything else in a row is the message's own
    or follows from these:
    - where the committed offset of a group that wants the topic moved, the messages between where it was and
      where it is (below it, for its first commit there): passed since, or passed again after it went back.
      A group whose offset stayed leaves its rows as they were, pending or passed;
    - in each queue, every message from the first one new since;
    - the messages of a redelivery window found since, or found then and not now: the others' counts stand;
    - the messages a copy or a tag filter's refusal names now, or that `stored_df` holds as (possibly)
      undelivered."""
    key = ["consumer_group", *QUEUE]
    wants = wanted(consumer_df, commits_df).select("consumer_group", "topic")
    then, now = (committed_offsets(c).withColumnRenamed("committed", n) for c, n in
                 ((then_commits_df, "then"), (commits_df, "now")))  # fmt: skip
    # Spans [low, high) of offsets per queue (no high: to the end), one scan of the messages finds them all.
    either = F.col("then").isNull() | F.col("now").isNull()
    moved = (
        then.join(now, on=key, how="full").join(F.broadcast(wants), on=["consumer_group", "topic"], how="left_semi")
        .where(either | (F.col("then") != F.col("now")))
        .select(*QUEUE, F.when(either, F.lit(-1)).otherwise(F.least("then", "now")).cast("long").alias("low"),
                F.greatest("then", "now").cast("long").alias("high"))
    )  # fmt: skip
    new = new_real_df.groupBy(*QUEUE).agg(F.min("queue_offset").alias("low"), F.lit(None).cast("long").alias("high"))
    # A window found more (or fewer) times now than then: each one delivers its messages once more.
    signed = union_all([redelivery_windows(df).withColumn("_n", F.lit(n))
                        for df, n in ((findings_df, 1), (then_findings_df, -1))])  # fmt: skip
    windows = (
        signed.groupBy("consumer_group", *QUEUE, "low", "high").agg(F.sum("_n").alias("_n"))
        .where(F.col("_n") != 0).select(*QUEUE, "low", "high")
    )  # fmt: skip
    spans = union_all([moved, new, windows]).distinct()
    copies = (
        copy_df.where(F.col("store_timestamp") <= as_of)
        .select(F.col("origin_topic").alias("topic"), "uniq_key").distinct().withColumn("_copied", F.lit(True))
    )  # fmt: skip
    named = union_all([
        refused_messages(refused).select(*MESSAGE),
        stored_df.where(F.col("status").isin(*LOST)).select(*MESSAGE),
    ]).distinct().withColumn("_named", F.lit(True))  # fmt: skip
    offset = F.col("m.queue_offset")
    within_span = [F.col(f"m.{c}") == F.col(f"s.{c}") for c in QUEUE] + [
        offset >= F.col("s.low"), F.col("s.high").isNull() | (offset < F.col("s.high"))
    ]  # fmt: skip
    return (
        real_df.alias("m").join(F.broadcast(spans).alias("s"), on=within_span, how="left")  # once per span it is in
        .select("m.*", F.col("s.low").isNotNull().alias("_spanned"))
        .join(F.broadcast(copies), on=["topic", "uniq_key"], how="left")
        .join(F.broadcast(named), on=MESSAGE, how="left")
        .where(F.col("_spanned") | F.col("_copied").isNotNull() | F.col("_named").isNotNull())
        .select(*real_df.columns)
        .dropDuplicates(MESSAGE)
    )  # fmt: skip


def counted(deliveries_df: DataFrame, sign: Column | None = None) -> DataFrame:
    """The `delivery_counts` rows of deliveries rows: per group, status and second of store time, how many and
    their retries and duplicates expected. With `sign` (+1 or -1 per row), the signed sums of change rows:
    what to add to the counts (rows whose sums are all zero left out)."""
    n = F.lit(1) if sign is None else sign
    sums = (
        deliveries_df.groupBy("consumer_group", "status", (F.col("store_timestamp") - F.col("store_timestamp") % 1000)
                              .alias("second_ts"))
        .agg(F.sum(n).alias("messages"), F.sum(n * F.col("retries")).alias("retries"),
             F.sum(n * F.col("duplicates_expected")).alias("duplicates_expected"))
    )  # fmt: skip
    if sign is None:
        return sums
    return sums.where((F.col("messages") != 0) | (F.col("retries") != 0) | (F.col("duplicates_expected") != 0))


def change_sign() -> Column:
    """+1 for a row a change feed adds (insert, update_postimage), -1 for one it takes away."""
    return F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)
