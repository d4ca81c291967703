"""The consumer-group rules of DESIGN §2: SUBSCRIPTION_CONFLICT, STRANDED_QUEUE, REDELIVERY_AT_HANDOFF,
OFFSET_JUMP, UNDELIVERED and DEAD_LETTERED. Pure DataFrame -> DataFrame.

The first three read the `consumer` snapshots (each group's members, their subscriptions and held
queues with in-memory offsets, and each broker's subscription table), the group's committed offsets
and the stored messages, all "as of" a snapshot: a commit or message counts when its time is at or
before the snapshot's. A group's snapshots are consecutive when no other snapshot of that group lies
between them. A queue's committed offset defaults to its first stored offset (a young queue starts
there, reference §3.3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce
from typing import NamedTuple

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from transforms.anomalies import detail_json

GROUP_TYPES = ("SUBSCRIPTION_CONFLICT", "STRANDED_QUEUE", "REDELIVERY_AT_HANDOFF", "OFFSET_JUMP", "UNDELIVERED",
               "DEAD_LETTERED")  # fmt: skip
QUEUE = ["broker_name", "topic", "queue_id"]
SNAP = ["consumer_group", "snapshot_ts"]


def _anomaly(kind: str, key: Sequence[Column | str], event_ts: str, detail: Column, as_of: int,
             topic: bool = True, uniq_key: bool = False) -> list[Column]:  # fmt: skip
    """The anomalies table's columns; the id is a SHA-256 of the type and `key`."""
    return [
        F.sha2(F.concat_ws("|", F.lit(kind), *[F.coalesce((F.col(k) if isinstance(k, str) else k).cast("string"),
                                                            F.lit("")) for k in key]), 256).alias("anomaly_id"),
        F.lit(kind).alias("anomaly_type"), F.lit(None).cast("string").alias("reason"), F.col("broker_name"),
        (F.col("uniq_key") if uniq_key else F.lit(None)).cast("string").alias("uniq_key"), F.col("consumer_group"),
        (F.col("topic") if topic else F.lit(None)).cast("string").alias("topic"),
        (F.col("queue_id") if topic else F.lit(None)).cast("int").alias("queue_id"),
        F.col(event_ts).cast("bigint").alias("event_ts"), F.lit(as_of).alias("as_of"),
        detail_json(detail).alias("detail"),
    ]  # fmt: skip


def subscription_text() -> Column:
    """A subscription row as "topic expression", e.g. "TopicA *" (the expression may be absent)."""
    return F.concat_ws(" ", "topic", F.coalesce("expression", F.lit("")))


def snapshots(consumer_df: DataFrame) -> DataFrame:
    """(consumer_group, snapshot_ts, k, prev_ts, next_ts, latest): every snapshot of every group, numbered in
    order, with the one before and after it."""
    order = Window.partitionBy("consumer_group").orderBy("snapshot_ts")
    return consumer_df.select(*SNAP).distinct().select(
        *SNAP, F.row_number().over(order).alias("k"), F.lag("snapshot_ts").over(order).alias("prev_ts"),
        F.lead("snapshot_ts").over(order).alias("next_ts"),
        F.max("snapshot_ts").over(Window.partitionBy("consumer_group")).alias("latest"),
    )  # fmt: skip


def members(consumer_df: DataFrame) -> DataFrame:
    """(consumer_group, snapshot_ts, client_id, subscriptions, topics): each member's own subscriptions."""
    subs = consumer_df.where((F.col("kind") == "subscription") & F.col("client_id").isNotNull())
    return subs.groupBy(*SNAP, "client_id").agg(
        F.sort_array(F.collect_set(subscription_text())).alias("subscriptions"),
        F.collect_set("topic").alias("topics"),
    )


def conflicts(consumer_df: DataFrame) -> DataFrame:
    """(consumer_group, snapshot_ts, conflict): whether the members' subscriptions differ."""
    return members(consumer_df).groupBy(*SNAP).agg((F.countDistinct("subscriptions") > 1).alias("conflict"))


def holders(consumer_df: DataFrame) -> DataFrame:
    """(consumer_group, snapshot_ts, queue, client_id, offset): the queues members hold, counted only where
    the member subscribes to the queue's topic (one that does not never pulls it)."""
    queues = consumer_df.where(F.col("kind") == "queue").select(*SNAP, *QUEUE, "client_id", "offset")
    subs = members(consumer_df).select(*SNAP, "client_id", F.explode("topics").alias("topic"))
    return queues.join(subs, on=[*SNAP, "client_id", "topic"], how="left_semi")


def islands(df: DataFrame, partition: list[str]) -> DataFrame:
    """Rows numbered by their group snapshot `k`: runs of consecutive snapshots share an `island`."""
    order = Window.partitionBy(*partition).orderBy("k")
    return df.withColumn("island", F.col("k") - F.row_number().over(order))


def subscription_conflicts(consumer_df: DataFrame, as_of: int) -> DataFrame:
    """SUBSCRIPTION_CONFLICT per run of consecutive snapshots in which a group's members subscribe
    differently, reported once per broker that kept a table for the group meanwhile; the event is the
    first such snapshot. Detail: each member's subscriptions and the broker's table at the run's last
    snapshot, since, until, and whether it is still going on."""
    snaps = snapshots(consumer_df)
    runs = islands(conflicts(consumer_df).where("conflict").join(snaps, on=SNAP), ["consumer_group"])
    runs = runs.groupBy("consumer_group", "island").agg(
        F.min("snapshot_ts").alias("since"), F.max("snapshot_ts").alias("until"), F.max("latest").alias("latest")
    )
    in_run = (F.col("snapshot_ts") >= F.col("since")) & (F.col("snapshot_ts") <= F.col("until"))
    tables = consumer_df.where((F.col("kind") == "subscription") & F.col("client_id").isNull())
    kept = (
        tables.join(runs, on="consumer_group").where(in_run)
        .withColumn("_last", F.max("snapshot_ts").over(Window.partitionBy("consumer_group", "since", "broker_name")))
        .where(F.col("snapshot_ts") == F.col("_last"))
        .groupBy("consumer_group", "since", "until", "latest", "broker_name")
        .agg(F.sort_array(F.collect_set(subscription_text())).alias("table"))
    )  # fmt: skip
    last_members = (
        members(consumer_df).withColumnRenamed("snapshot_ts", "until")
        .groupBy("consumer_group", "until")
        .agg(F.sort_array(F.collect_list(F.struct("client_id", "subscriptions"))).alias("members"))
    )  # fmt: skip
    found = kept.join(last_members, on=["consumer_group", "until"])
    detail = F.struct("members", F.col("table").alias("broker_table"), "since", "until",
                      (F.col("until") == F.col("latest")).alias("ongoing"))  # fmt: skip
    return found.select(*_anomaly("SUBSCRIPTION_CONFLICT", ["broker_name", "consumer_group", "since"], "since",
                                  detail, as_of, topic=False))  # fmt: skip


def _as_of(probes: DataFrame, events: DataFrame, keys: list[str], value: str, order: list[str]) -> DataFrame:
    """Each probe row (`keys`, `t`, ...) gets `value` from the latest event (`keys`, `t`, `order`..., `value`) at
    or before its `t`, or null. Events sort before probes at the same time, so they count."""
    both = probes.withColumn("_probe", F.lit(1)).unionByName(
        events.select(*keys, "t", *order, value).withColumn("_probe", F.lit(0)), allowMissingColumns=True
    )
    w = (Window.partitionBy(*keys).orderBy("t", "_probe", *order)
         .rowsBetween(Window.unboundedPreceding, Window.currentRow))  # fmt: skip
    return both.withColumn(value, F.last(value, ignorenulls=True).over(w)).where("_probe = 1").drop("_probe", *order)


def probed(real_df: DataFrame, probes: DataFrame, on: Sequence[str] = QUEUE) -> DataFrame:
    """The messages of the queues (or other keys) `probes` asks about, before anything aggregates or orders them:
    probes are few (snapshots, findings), messages many, and when there are no probes Spark drops the scan once
    the broadcast keys turn out empty."""
    return real_df.join(F.broadcast(probes.select(*on).distinct()), on=list(on), how="left_semi")


def queue_state(probes: DataFrame, offset_commits_df: DataFrame, real_df: DataFrame) -> DataFrame:
    """Probes (consumer_group, snapshot_ts, queue, ...) with `stored` (messages stored by then: the end
    offset), `committed` (the group's committed offset by then, else the queue's first stored offset)."""
    probes = probes.withColumn("t", F.col("snapshot_ts"))
    real_df = probed(real_df, probes)
    ends = real_df.groupBy(*QUEUE, F.col("store_timestamp").alias("t")).agg((F.max("queue_offset") + 1).alias("stored"))
    firsts = real_df.groupBy(*QUEUE).agg(F.min("queue_offset").alias("first"))
    commits = offset_commits_df.select(
        *QUEUE, "consumer_group", F.col("commit_timestamp").alias("t"), "seq", F.col("offset").alias("committed")
    )
    with_end = _as_of(probes, ends, QUEUE, "stored", [])
    with_commit = _as_of(with_end, commits, [*QUEUE, "consumer_group"], "committed", ["seq"])
    filled = {"committed": F.coalesce("committed", "first", F.lit(0)), "stored": F.coalesce("stored", F.lit(0))}
    return with_commit.join(firsts, on=QUEUE, how="left").withColumns(filled).drop("first", "t")


def stranded_queues(consumer_df: DataFrame, offset_commits_df: DataFrame, real_df: DataFrame, as_of: int,
                    stranded_after_ms: int) -> DataFrame:  # fmt: skip
    """STRANDED_QUEUE: a queue of a topic some member subscribes to, with messages beyond the group's committed
    offset, that no subscribing member holds, in consecutive snapshots spanning at least
    `stranded_after_ms`; the event is the first. Detail: lag (at the last), cause (SUBSCRIPTION_CONFLICT if
    the members disagreed when it began, else ALLOCATION_GAP: their client lists or allocations differ),
    since, until, ongoing."""
    snaps = snapshots(consumer_df)
    topics = members(consumer_df).select(*SNAP, F.explode("topics").alias("topic")).distinct()
    queues = probed(real_df, topics, ["topic"]).select(*QUEUE).distinct()
    candidates = topics.join(queues, on="topic").join(holders(consumer_df), on=[*SNAP, *QUEUE], how="left_anti")
    state = queue_state(candidates, offset_commits_df, real_df)
    stranded = state.where(F.col("stored") > F.col("committed")).join(snaps, on=SNAP)
    runs = islands(stranded, ["consumer_group", *QUEUE])
    last = Window.partitionBy("consumer_group", *QUEUE, "island").orderBy(F.desc("snapshot_ts"))
    episodes = (
        runs.withColumn("since", F.min("snapshot_ts").over(Window.partitionBy("consumer_group", *QUEUE, "island")))
        .withColumn("_n", F.row_number().over(last)).where(F.col("_n") == 1)
        .withColumnRenamed("snapshot_ts", "until")
        .where(F.col("until") - F.col("since") >= stranded_after_ms)
    )  # fmt: skip
    cause = conflicts(consumer_df).withColumnRenamed("snapshot_ts", "since")
    found = episodes.join(cause, on=["consumer_group", "since"], how="left")
    detail = F.struct(
        (F.col("stored") - F.col("committed")).alias("lag"), "committed", "stored",
        F.when(F.coalesce("conflict", F.lit(False)), "SUBSCRIPTION_CONFLICT")
        .otherwise("ALLOCATION_GAP")
        .alias("cause"),
        "since", "until", (F.col("until") == F.col("latest")).alias("ongoing"),
    )  # fmt: skip
    return found.select(*_anomaly("STRANDED_QUEUE", [*QUEUE, "consumer_group", "since"], "since", detail, as_of))


def redeliveries(consumer_df: DataFrame, offset_commits_df: DataFrame, real_df: DataFrame, as_of: int) -> DataFrame:
    """REDELIVERY_AT_HANDOFF: a member held a queue at one snapshot and not at the group's next, while its
    in-memory offset was ahead of the group's committed offset at that snapshot. Whoever takes the queue
    starts from a committed offset, so the messages in between are delivered again; the event is the
    snapshot that shows the change. Detail: old and new holders, the window [from_offset, to_offset) and
    duplicates_estimate, its size. The old holder may have consumed (or persisted) more after it was last
    seen, so the estimate is as good as the snapshot interval is short."""
    held = holders(consumer_df)
    snaps = snapshots(consumer_df).where(F.col("next_ts").isNotNull())
    old = held.join(snaps.select(*SNAP, "next_ts"), on=SNAP)
    now_held = held.select("consumer_group", F.col("snapshot_ts").alias("next_ts"), *QUEUE, "client_id")
    lost = old.join(now_held, on=["consumer_group", "next_ts", *QUEUE, "client_id"], how="left_anti")
    state = queue_state(lost, offset_commits_df, real_df).where(F.col("offset") > F.col("committed"))
    new_holders = now_held.groupBy("consumer_group", "next_ts", *QUEUE).agg(
        F.sort_array(F.collect_list("client_id")).alias("new_holders")
    )
    present = consumer_df.where(F.col("client_id").isNotNull()).select(
        "consumer_group", F.col("snapshot_ts").alias("next_ts"), "client_id", F.lit(True).alias("_present")
    ).distinct()  # fmt: skip
    found = state.join(new_holders, on=["consumer_group", "next_ts", *QUEUE], how="left").join(
        present, on=["consumer_group", "next_ts", "client_id"], how="left"
    )
    detail = F.struct(
        F.col("client_id").alias("old_holder"), F.coalesce("new_holders", F.array().cast("array<string>")).alias(
            "new_holders"), F.col("snapshot_ts").alias("last_seen"),
        F.col("committed").alias("from_offset"), F.col("offset").alias("to_offset"),
        (F.col("offset") - F.col("committed")).alias("duplicates_estimate"),
        F.col("_present").isNull().alias("old_holder_gone"),
    )  # fmt: skip
    key = [*QUEUE, "consumer_group", "next_ts", "client_id"]
    return found.select(*_anomaly("REDELIVERY_AT_HANDOFF", key, "next_ts", detail, as_of))


def _jumps(offset_commits_df: DataFrame) -> DataFrame:
    """Commits that move a queue's offset forward from no member right after one from a member."""
    return offset_commits_df.where(
        (F.col("offset") > F.col("prev_offset")) & F.col("client_id").isNull() & F.col("prev_client_id").isNotNull()
    )


def offset_jumps(offset_commits_df: DataFrame, as_of: int) -> DataFrame:
    """OFFSET_JUMP: a commit that moves a queue's offset forward and comes from no member (no client id)
    right after one that did: an admin reset or a broker correction; the messages in between were never
    consumed by this group. Offsets from consumerOffset.json snapshots name no client, so this needs
    commits with their client ids. Detail: from, to, skipped."""
    jumps = _jumps(offset_commits_df)
    detail = F.struct(
        F.col("prev_offset").alias("from_offset"), F.col("offset").alias("to_offset"),
        (F.col("offset") - F.col("prev_offset")).alias("skipped"), F.col("prev_client_id").alias("client_before"),
        "seq",
    )  # fmt: skip
    key = [*QUEUE, "consumer_group", "commit_timestamp", "seq"]
    return jumps.select(*_anomaly("OFFSET_JUMP", key, "commit_timestamp", detail, as_of))


def _tags(expression: Column) -> Column:
    return F.transform(F.split(F.coalesce(expression, F.lit("*")), r"\|\|"), lambda t: F.trim(t))


def takes_all(expression: Column) -> Column:
    """Whether a tag expression lets every message through: `*`, or none."""
    return F.array_contains(_tags(expression), "*")


def tag_matches(expression: Column, tag: Column) -> Column:
    """RocketMQ's tag filter: `*` (or no expression) takes every message, `A || B` those tagged A or B; a
    message without a tag only `*` (FilterAPI.buildSubscriptionData, PullAPIWrapper.processPullResult)."""
    return takes_all(expression) | F.coalesce(F.array_contains(_tags(expression), tag), F.lit(False))


def filters(consumer_df: DataFrame) -> DataFrame:
    """(consumer_group, snapshot_ts, queue, holder, member_expression, broker_expression, wanted): the two
    filters a pull of each held queue passes at a snapshot (the broker's table for the topic, then the
    holder's own expression) and every member's expression for the topic (`wanted`). A queue whose topic
    the table lacks has no row: the broker refuses its pulls, so its offset cannot pass anything."""
    subs = consumer_df.where(F.col("kind") == "subscription")
    own = subs.where(F.col("client_id").isNotNull()).select(*SNAP, "client_id", "topic", "expression")
    wanted = own.groupBy(*SNAP, "topic").agg(F.sort_array(F.collect_set(F.coalesce("expression", F.lit("*"))))
                                             .alias("wanted"))  # fmt: skip
    table = subs.where(F.col("client_id").isNull()).select(*SNAP, "broker_name", "topic",
                                                           F.col("expression").alias("broker_expression"))  # fmt: skip
    return (
        holders(consumer_df).join(own, on=[*SNAP, "client_id", "topic"])
        .join(table, on=[*SNAP, "broker_name", "topic"]).join(wanted, on=[*SNAP, "topic"])
        .select(*SNAP, *QUEUE, F.col("client_id").alias("holder"), F.col("expression").alias("member_expression"),
                "broker_expression", "wanted")
    )  # fmt: skip


class Refusals(NamedTuple):
    """What the tag filters refused: `windows` (two consecutive snapshots of a group and a queue a filter could
    refuse on, with the candidate filters and whether they agree, `exact`; and `k` 0, the time before the group's
    first snapshot) and `per_message`, each message a window's committed offset passed that some member wanted and
    some filter refused, `_every` when every filter the window may have had refuses it, `_exact` when nothing
    unseen could have applied to it. UNDELIVERED and the deliveries table both read them."""

    windows: DataFrame
    per_message: DataFrame

    def none(self) -> Refusals:
        """The same columns and no row: Spark plans every query that reads them as empty, and runs no job."""
        return Refusals(self.windows.limit(0), self.per_message.limit(0))


def refusals(consumer_df: DataFrame, offset_commits_df: DataFrame, real_df: DataFrame,
             keep: Callable[[DataFrame], DataFrame] = lambda df: df) -> Refusals:  # fmt: skip
    """The refusals of tag filters between consecutive snapshots (see `Refusals`). `keep` (a checkpoint, say) is
    applied to the windows, to window 0 and the commits it is cut from, and to the messages refused: both outputs
    read the windows and window 0, which are then computed once.

    The candidates of a window are the filters its two snapshots show and those of the snapshot before: a
    member commits what it passed up to one persist interval (5 s) later, so a message the committed offset
    passed in the window may have been pulled before it began. A snapshot that shows no filter for the queue
    (its broker did not answer, nobody held it) leaves the window incomplete: what applied then is unknown, so
    no message of the window counts as refused by every candidate.

    Before a group's first snapshot nothing shows what applied. What the committed offset passed by then, from
    the queue's first message, is window 0: from the group's first commit on the queue to the first snapshot,
    whose filters are its only candidates; it is never complete, so its messages count in `at_most` alone. The
    group's first window has no snapshot before it either: a message of it stored before the first snapshot
    may have been pulled under filters nobody saw, unless the committed offset did not move between its
    store and the snapshot (a pull that passes a message commits it with the next one); such a message
    counts in `at_most` alone too."""
    candidates = filters(consumer_df)
    can_refuse = ~(takes_all(F.col("member_expression")) & takes_all(F.col("broker_expression")))
    every = snapshots(consumer_df)
    snaps = every.where(F.col("next_ts").isNotNull())
    config = F.struct("holder", "member_expression", "broker_expression", "wanted")
    at = candidates.select(*SNAP, *QUEUE, config.alias("config"), can_refuse.alias("can_refuse"))
    window = ["consumer_group", "snapshot_ts", "prev_ts", "k", "latest"]
    sides = [
        snaps.join(at.withColumnRenamed("snapshot_ts", ts), on=["consumer_group", ts]).select(
            *window, *QUEUE, "config", "can_refuse", F.lit(side).alias("side"))
        for side, ts in enumerate(("prev_ts", "snapshot_ts", "next_ts"))
    ]  # fmt: skip
    windows = (
        reduce(DataFrame.unionByName, sides)
        .groupBy(*window, *QUEUE)
        .agg(F.collect_set("config").alias("configs"), F.max("can_refuse").alias("can_refuse"),
             F.countDistinct("side").alias("sides"))
        .where("can_refuse")
        .withColumn("complete", F.col("sides") == F.when(F.col("prev_ts").isNull(), 2).otherwise(3))
        .withColumn("exact", F.col("complete") & (F.size("configs") == 1))
        .drop("prev_ts", "sides")
        .join(snaps.select(*SNAP, "next_ts"), on=SNAP)
        .transform(keep)
    )  # fmt: skip
    start = queue_state(windows, offset_commits_df, real_df).select(*SNAP, *QUEUE, F.col("committed").alias("c0"))
    end = queue_state(windows.select("consumer_group", F.col("next_ts").alias("snapshot_ts"), *QUEUE).distinct(),
                      offset_commits_df, real_df).select("consumer_group", F.col("snapshot_ts").alias("next_ts"),
                                                         *QUEUE, F.col("committed").alias("c1"))  # fmt: skip
    passed = (
        windows.join(start, on=[*SNAP, *QUEUE])
        .join(end, on=["consumer_group", "next_ts", *QUEUE])
        .where(F.col("c1") > F.col("c0"))
    )
    before, moved = _before_first(every, at, offset_commits_df, real_df, keep)
    messages = real_df.select(*QUEUE, "queue_offset", "tags", "store_timestamp")
    in_window = (F.col("queue_offset") >= F.col("c0")) & (F.col("queue_offset") < F.col("c1"))
    judged = F.transform("configs", lambda c: F.struct(
        F.exists(c["wanted"], lambda e: tag_matches(e, F.col("tags"))).alias("wanted"),
        tag_matches(c["broker_expression"], F.col("tags")).alias("broker"),
        tag_matches(c["member_expression"], F.col("tags")).alias("member")))  # fmt: skip
    lost = F.filter("_judged", lambda j: j["wanted"] & ~(j["broker"] & j["member"]))
    # What an OFFSET_JUMP moved the offset over was skipped by an admin, not refused by a filter.
    keys = [*QUEUE, "consumer_group"]
    skips = _jumps(offset_commits_df).select(
        *(F.col(c).alias(f"_{c}") for c in keys), F.col("commit_timestamp").alias("_at"),
        F.col("prev_offset").alias("_from"), F.col("offset").alias("_to"))  # fmt: skip
    skipped = reduce(lambda a, b: a & b, [F.col(c) == F.col(f"_{c}") for c in keys]) & (
        (F.col("_at") > F.col("snapshot_ts")) & (F.col("_at") <= F.col("next_ts"))
        & (F.col("queue_offset") >= F.col("_from")) & (F.col("queue_offset") < F.col("_to")))  # fmt: skip
    # A message of a group's first window pulled, perhaps, before the first snapshot showed any filter.
    unseen = (F.col("k") == 1) & (F.col("store_timestamp") < F.col("snapshot_ts")) & F.coalesce(
        F.col("_moved") > F.col("store_timestamp"), F.lit(False))  # fmt: skip
    per_message = (
        F.broadcast(passed.unionByName(before)).join(messages, on=QUEUE).where(in_window)
        .join(F.broadcast(skips), on=skipped, how="left_anti")
        .join(F.broadcast(moved), on=[*SNAP, *QUEUE], how="left")
        .withColumn("_judged", judged)
        .withColumn("_lost", F.size(lost))
        .where(F.col("_lost") > 0)
        .withColumn("_exact", F.col("exact") & ~unseen)
        .withColumn("_every", F.col("complete") & ~unseen & (F.col("_lost") == F.size("_judged")))
        .withColumn("_refused_by", F.transform(lost, lambda j: F.when(~j["broker"], "broker").otherwise("member")))
        .drop("_moved", "store_timestamp")
        .transform(keep)
    )  # fmt: skip
    return Refusals(windows.unionByName(before.drop("c0", "c1")), per_message)


def _before_first(every: DataFrame, at: DataFrame, offset_commits_df: DataFrame, real_df: DataFrame,
                  keep: Callable[[DataFrame], DataFrame]) -> tuple[DataFrame, DataFrame]:  # fmt: skip
    """Window 0 of each group and queue a first-snapshot filter could refuse on (`refusals`), with what its
    committed offset passed, [c0, c1): `snapshot_ts` is the group's first commit on the queue, `next_ts` the
    first snapshot. And `_moved` per (consumer_group, snapshot_ts, queue) of a first snapshot: when the committed
    offset last moved at or before it."""
    first = every.where(F.col("prev_ts").isNull()).select("consumer_group", F.col("snapshot_ts").alias("next_ts"),
                                                          "latest")  # fmt: skip
    configs = (
        at.where("can_refuse").withColumnRenamed("snapshot_ts", "next_ts")
        .join(first, on=["consumer_group", "next_ts"])
        .groupBy("consumer_group", "next_ts", "latest", *QUEUE).agg(F.collect_set("config").alias("configs"))
    )  # fmt: skip
    firsts = probed(real_df, configs).groupBy(*QUEUE).agg(F.min("queue_offset").alias("c0"))
    commits = offset_commits_df.join(F.broadcast(first.select("consumer_group", "next_ts")), on="consumer_group")
    upto = commits.where(F.col("commit_timestamp") <= F.col("next_ts")).join(firsts, on=QUEUE, how="left")
    # Of the commits up to the first snapshot: the first, the offset as of the last, and when it last moved (the
    # first commit moves it from the queue's first offset).
    last = Window.partitionBy("consumer_group", *QUEUE).orderBy(F.desc("commit_timestamp"), F.desc_nulls_last("seq"))
    moves = F.col("offset") != F.coalesce("prev_offset", "c0", F.lit(0))
    state = (
        upto.withColumn("_n", F.row_number().over(last))
        .groupBy("consumer_group", "next_ts", *QUEUE, "c0")
        .agg(F.min("commit_timestamp").alias("snapshot_ts"),
             F.max(F.when(F.col("_n") == 1, F.col("offset"))).alias("c1"),
             F.max(F.when(moves, F.col("commit_timestamp"))).alias("_moved"))
        .transform(keep)
    )  # fmt: skip
    before = (
        configs.join(state, on=["consumer_group", "next_ts", *QUEUE])
        .where(F.col("c1") > F.col("c0"))
        .select("consumer_group", "snapshot_ts", F.lit(0).alias("k"), "latest", *QUEUE, "configs",
                F.lit(True).alias("can_refuse"), F.lit(False).alias("complete"), F.lit(False).alias("exact"),
                "next_ts", "c0", "c1")
        .transform(keep)
    )  # fmt: skip
    moved = state.select("consumer_group", F.col("next_ts").alias("snapshot_ts"), *QUEUE, "_moved")
    return before, moved


def refused_messages(refused: Refusals) -> DataFrame:
    """(consumer_group, queue, queue_offset, certain): the messages UNDELIVERED counts in `at_most`, those a filter
    that may have applied refused; `certain` where every one did, the ones it counts in `messages`."""
    return refused.per_message.groupBy("consumer_group", *QUEUE, "queue_offset").agg(F.max("_every").alias("certain"))


def undelivered(refused: Refusals, as_of: int) -> DataFrame:
    """UNDELIVERED: between two consecutive snapshots of a group, the messages of a queue that the committed
    offset passed, that some member's expression wants, and that the broker's table or the holder's own
    expression refused (cause TAG_FILTER). One finding per queue and run of consecutive snapshots in which a
    filter of the queue could refuse a message, if one did; the event is the first snapshot before a loss.

    The filters that applied in between are the ones both snapshots show; `exact` says they agree. When
    they differ (a hand-off, a new table) `messages` counts what every candidate refuses and `at_most`
    what any refuses: a window whose candidates disagree on every message counts as a loss of up to
    `at_most` (with `messages` 0), since which filter applied when cannot be told from the snapshots.
    Before a group's first snapshot nothing shows the filters (`refusals`, window 0): what the committed offset
    passed by then and a first-snapshot filter refuses counts in `at_most` and `before_first_snapshot`, and a
    run that holds it is never exact and begins at the group's first commit on the queue.
    Detail: messages, at_most, before_first_snapshot, exact, first and last offset, refused_by (broker,
    member), the filters (holder and both expressions), since, until, ongoing."""
    windows, per_message = refused
    per_window = (
        per_message.groupBy("consumer_group", "snapshot_ts", "next_ts", "k", "latest", *QUEUE)
        .agg(
            F.sum(F.col("_every").cast("int")).alias("messages"),
            F.count(F.lit(1)).alias("at_most"),
            F.count(F.when(F.col("k") == 0, 1)).alias("before_first_snapshot"),
            F.min(F.when(F.col("_every"), F.col("queue_offset"))).alias("first_offset"),
            F.max(F.when(F.col("_every"), F.col("queue_offset"))).alias("last_offset"),
            F.array_distinct(F.flatten(F.collect_list("_refused_by"))).alias("refused_by"),
            F.first("configs").alias("configs"),
            F.min(F.col("_exact").cast("int")).cast("boolean").alias("exact"),
        )
        .where(F.col("at_most") > 0)
    )
    runs = islands(windows.select("consumer_group", *QUEUE, "k"), ["consumer_group", *QUEUE])
    lossy = per_window.join(runs, on=["consumer_group", *QUEUE, "k"])
    found = lossy.groupBy("consumer_group", *QUEUE, "island").agg(
        F.min("snapshot_ts").alias("since"), F.max("next_ts").alias("until"), F.max("latest").alias("latest"),
        F.sum("messages").alias("messages"), F.sum("at_most").alias("at_most"),
        F.sum("before_first_snapshot").alias("before_first_snapshot"),
        F.min(F.col("exact").cast("int")).cast("boolean").alias("exact"),
        F.min("first_offset").alias("first_offset"), F.max("last_offset").alias("last_offset"),
        F.sort_array(F.array_distinct(F.flatten(F.collect_list("refused_by")))).alias("refused_by"),
        F.sort_array(F.array_distinct(F.flatten(F.collect_list(F.transform("configs", lambda c: c.dropFields(
            "wanted")))))).alias("filters"),
    )  # fmt: skip
    ongoing = (F.col("until") == F.col("latest")).alias("ongoing")
    detail = F.struct("messages", "at_most", "before_first_snapshot", "exact", "first_offset", "last_offset",
                      F.lit("TAG_FILTER").alias("cause"), "refused_by", "filters", "since", "until",
                      ongoing)  # fmt: skip
    return found.select(*_anomaly("UNDELIVERED", [*QUEUE, "consumer_group", "since"], "since", detail, as_of))


def dead_letters(copy_df: DataFrame, real_df: DataFrame, as_of: int) -> DataFrame:
    """DEAD_LETTERED: one per copy in a group's `%DLQ%<group>` stored by `as_of`, a message the group's consumers
    failed until the broker parked it; the event is the copy's store time. Its topic and queue are the
    original's (RETRY_TOPIC, and the first real message of that topic with its UNIQ_KEY). Detail: the DLQ
    position, reconsume_times, the original's queue offset and broker, transaction_id and transactional
    (a transactional message's copy keeps its flags, and is never a commit)."""
    dead = copy_df.where((F.col("kind") == "dead_letter") & (F.col("store_timestamp") <= as_of)).select(
        "broker_name", F.col("topic").alias("dlq_topic"), F.col("queue_id").alias("dlq_queue_id"),
        F.col("queue_offset").alias("dlq_queue_offset"), "store_timestamp", "consumer_group",
        F.col("origin_topic").alias("topic"), "uniq_key", "reconsume_times", "origin_message_id",
        F.col("transaction_id").alias("copy_transaction_id"), "transactional")  # fmt: skip
    first = Window.partitionBy("topic", "uniq_key").orderBy("store_timestamp", "origin_broker", "queue_id")
    originals = (
        probed(real_df.where(F.col("uniq_key").isNotNull()), dead, ["topic", "uniq_key"])
        .select("topic", "uniq_key", "queue_id", F.col("queue_offset").alias("origin_queue_offset"),
                F.col("broker_name").alias("origin_broker"), "transaction_id", "store_timestamp")
        .withColumn("_n", F.row_number().over(first)).where("_n = 1").drop("_n", "store_timestamp")
    )  # fmt: skip
    found = dead.join(originals, on=["topic", "uniq_key"], how="left")
    detail = F.struct("dlq_topic", "dlq_queue_id", "dlq_queue_offset", "reconsume_times", "origin_broker",
                      "origin_queue_offset", F.coalesce("transaction_id", "copy_transaction_id").alias(
                          "transaction_id"), "transactional", "origin_message_id")  # fmt: skip
    key = ["broker_name", "dlq_topic", "dlq_queue_id", "dlq_queue_offset"]
    return found.select(*_anomaly("DEAD_LETTERED", key, "store_timestamp", detail, as_of, uniq_key=True))


def group_anomalies(consumer_df: DataFrame, offset_commits_df: DataFrame, real_df: DataFrame, copy_df: DataFrame,
                    refused: Refusals, as_of: int, stranded_after_ms: int,
                    snapshots_seen: bool = True) -> DataFrame:  # fmt: skip
    """Every consumer-group finding, recomputed whole on each run (snapshots and copies are small). Without a
    snapshot (`snapshots_seen` False: a warehouse that collects no consumer groups) the four rules that read
    them find nothing and are left out: planning and running them on empty frames took seconds of a cycle."""
    found = [offset_jumps(offset_commits_df, as_of), dead_letters(copy_df, real_df, as_of)]
    if snapshots_seen:
        found += [
            subscription_conflicts(consumer_df, as_of),
            stranded_queues(consumer_df, offset_commits_df, real_df, as_of, stranded_after_ms),
            redeliveries(consumer_df, offset_commits_df, real_df, as_of),
            undelivered(refused, as_of),
        ]
    return reduce(DataFrame.unionByName, found)
