"""The consumer-group rules on tiny hand-written snapshots (chispa), one edge case at a time.

Snapshots are 10 s apart from T; broker b has topic t (queues 0 and 1) and topic u (queue 0).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.reconcile import refused_by_filters
from jobs.report import group_deliveries
from jobs.session import jobs_started
from schemas.landing import CONSUMER, COPY
from schemas.spark import to_struct
from transforms.anomalies import offset_commits
from transforms.consumers import (
    dead_letters,
    group_anomalies,
    offset_jumps,
    redeliveries,
    refusals,
    stranded_queues,
    subscription_conflicts,
    undelivered,
)
from transforms.deliveries import changing, counted, deliveries

pytestmark = pytest.mark.spark
T = 1_000_000
AS_OF = T + 1_000_000
OFFSET = ("broker_name string, consumer_group string, topic string, queue_id int, offset long, "
          "commit_timestamp long, client_id string, seq long")  # fmt: skip
REAL = "broker_name string, topic string, queue_id int, queue_offset long, store_timestamp long, tags string"


def sub(k: int, client: str | None, topic: str, expression: str = "*", broker: str | None = None) -> tuple[Any, ...]:
    """A subscription row at snapshot k: a member's (client) or broker's table (client None)."""
    return (T + 10_000 * k, "g", "subscription", client, topic, expression, broker, None, None)


def held(k: int, client: str, topic: str, queue_id: int, offset: int) -> tuple[Any, ...]:
    return (T + 10_000 * k, "g", "queue", client, topic, None, "b", queue_id, offset)


def frames(spark: SparkSession, snapshot: list[Any], commits: list[Any], stored: dict[tuple[str, int], int],
           tags: tuple[str | None, ...] = ("TagA", "TagB")) -> tuple[DataFrame, DataFrame, DataFrame]:  # fmt: skip
    """Snapshot rows; commits (topic, queue, offset, time, client, seq); messages 0..n-1 per queue, stored at T,
    tagged in turn with `tags` (offset o has tags[o % len(tags)])."""
    cons = spark.createDataFrame(snapshot, to_struct(CONSUMER))
    offsets = spark.createDataFrame([("b", "g", *c) for c in commits], OFFSET)
    real = spark.createDataFrame([("b", t, q, o, T, tags[o % len(tags)]) for (t, q), n in stored.items()
                                  for o in range(n)], REAL)  # fmt: skip
    return cons, offset_commits(offsets), real


def found(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((r["anomaly_type"], r["topic"], r["queue_id"], r["event_ts"], json.loads(r["detail"]))
                  for r in df.collect())  # fmt: skip


def agreeing(k: int, t_owner: str = "A") -> list[tuple[Any, ...]]:
    """Members A and B both on t; the owner holds both queues; the broker keeps t."""
    return [sub(k, "A", "t"), sub(k, "B", "t"), sub(k, None, "t", broker="b"),
            held(k, t_owner, "t", 0, 5), held(k, t_owner, "t", 1, 5)]  # fmt: skip


def test_members_that_agree_raise_nothing(spark: SparkSession) -> None:
    commits = [("t", 0, 5, T, "A", 1), ("t", 1, 5, T, "A", 2)]
    rows = [r for k in range(9) for r in agreeing(k)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 5, ("t", 1): 5})
    assert found(subscription_conflicts(cons, AS_OF)) == []
    assert found(stranded_queues(cons, commits_df, real, AS_OF, 60_000)) == []
    assert found(redeliveries(cons, commits_df, real, AS_OF)) == []
    assert found(undelivered(refusals(cons, commits_df, real), AS_OF)) == []


def test_a_conflict_is_one_finding_per_run_and_broker_with_the_table_the_broker_kept(spark: SparkSession) -> None:
    rows = agreeing(0)
    for k in (1, 2):  # B subscribes to u instead; the broker kept B's table at k=2
        rows += [sub(k, "A", "t"), sub(k, "B", "u"), sub(k, None, "t" if k == 1 else "u", broker="b")]
    rows += agreeing(3) + [sub(4, "A", "t"), sub(4, "B", "t", "TagA"), sub(4, None, "t", "TagA", broker="b")]
    cons, _, _ = frames(spark, rows, [], {})
    got = subscription_conflicts(cons, AS_OF)
    assert_df_equality(
        got.select("broker_name", "consumer_group", "event_ts", "topic", "queue_id"),
        spark.createDataFrame([("b", "g", T + 10_000), ("b", "g", T + 40_000)], "broker_name string, "
                              "consumer_group string, event_ts long").selectExpr("*", "CAST(NULL AS STRING) AS topic",
                                                                                  "CAST(NULL AS INT) AS queue_id"),
        ignore_row_order=True, ignore_nullable=True,
    )  # fmt: skip
    first = json.loads(got.where(f"event_ts = {T + 10_000}").first()["detail"])  # type: ignore[index]
    members = [{"client_id": "A", "subscriptions": ["t *"]}, {"client_id": "B", "subscriptions": ["u *"]}]
    assert first == {"members": members, "broker_table": ["u *"], "since": T + 10_000, "until": T + 20_000,
                     "ongoing": False}  # fmt: skip
    last = json.loads(got.where(f"event_ts = {T + 40_000}").first()["detail"])  # type: ignore[index]
    assert (last["broker_table"], last["ongoing"]) == (["t TagA"], True)  # same topic, other tags: a conflict too


def test_a_queue_no_subscriber_holds_is_stranded_once_it_lasts(spark: SparkSession) -> None:
    """A holds t:0 only; t:1 is allocated to B, who subscribes to u: nobody pulls it. Messages wait on t:1
    from k=0 to k=6 (60 s, the threshold); u:0, held by B, is fine; t:1 at 50 s would not be reported."""
    rows = []
    for k in range(7):
        rows += [sub(k, "A", "t"), sub(k, "B", "u"), sub(k, None, "t", broker="b"), held(k, "A", "t", 0, 3),
                 held(k, "B", "u", 0, 2), held(k, "B", "t", 1, 0)]  # B "holds" t:1 but never pulls it  # fmt: skip
    cons, commits, real = frames(spark, rows, [("t", 1, 1, T, "A", 1)], {("t", 0): 3, ("t", 1): 4, ("u", 0): 2})
    [(kind, topic, queue, since, detail)] = found(stranded_queues(cons, commits, real, AS_OF, 60_000))
    assert (kind, topic, queue, since) == ("STRANDED_QUEUE", "t", 1, T)
    assert detail == {"lag": 3, "committed": 1, "stored": 4, "cause": "SUBSCRIPTION_CONFLICT", "since": T,
                      "until": T + 60_000, "ongoing": True}  # fmt: skip
    assert found(stranded_queues(cons, commits, real, AS_OF, 60_001)) == []
    # Once A takes it over the run ends; a caught-up unheld queue (no lag) is not stranded either.
    later = rows + [sub(7, "A", "t"), held(7, "A", "t", 1, 1), sub(8, "A", "t")]
    cons, commits, real = frames(spark, later, [("t", 1, 4, T + 80_000, "A", 2)], {("t", 0): 3, ("t", 1): 4})
    [(*_, detail)] = found(stranded_queues(cons, commits, real, AS_OF, 60_000))
    assert (detail["until"], detail["ongoing"], detail["cause"]) == (T + 60_000, False, "SUBSCRIPTION_CONFLICT")


def test_a_hand_off_after_unpersisted_progress_is_a_redelivery(spark: SparkSession) -> None:
    """A holds t:0 with 8 consumed in memory but 5 committed, and t:1 fully committed; then A vanishes and B
    holds both at the next snapshot. Only t:0 is redelivered: 5, 6 and 7 (B's commit after T does not count)."""
    rows = [sub(0, "A", "t"), sub(0, "B", "t"), sub(0, None, "t", broker="b"), held(0, "A", "t", 0, 8),
            held(0, "A", "t", 1, 5), sub(1, "B", "t"), sub(1, None, "t", broker="b"), held(1, "B", "t", 0, 9),
            held(1, "B", "t", 1, 5)]  # fmt: skip
    commits = [("t", 0, 5, T - 3_000, "A", 1), ("t", 1, 5, T - 3_000, "A", 2), ("t", 0, 8, T + 5_000, "B", 3)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 10, ("t", 1): 5})
    [(kind, topic, queue, event_ts, detail)] = found(redeliveries(cons, commits_df, real, AS_OF))
    assert (kind, topic, queue, event_ts) == ("REDELIVERY_AT_HANDOFF", "t", 0, T + 10_000)
    assert detail == {"old_holder": "A", "new_holders": ["B"], "last_seen": T, "from_offset": 5, "to_offset": 8,
                      "duplicates_estimate": 3, "old_holder_gone": True}  # fmt: skip


def test_a_hand_off_exactly_at_a_persist_redelivers_nothing(spark: SparkSession) -> None:
    """The same hand-off, but A's persist at T carried its memory offset 8: nothing is delivered twice. The
    queue A keeps (t:1) is no hand-off either."""
    rows = [sub(0, "A", "t"), sub(0, "B", "t"), sub(0, None, "t", broker="b"), held(0, "A", "t", 0, 8),
            held(0, "A", "t", 1, 5), sub(1, "A", "t"), sub(1, "B", "t"), sub(1, None, "t", broker="b"),
            held(1, "B", "t", 0, 9), held(1, "A", "t", 1, 5)]  # fmt: skip
    commits = [("t", 0, 8, T, "A", 1), ("t", 1, 5, T, "A", 2)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 10, ("t", 1): 5})
    assert found(redeliveries(cons, commits_df, real, AS_OF)) == []


def test_an_offset_jump_is_a_forward_commit_from_no_member(spark: SparkSession) -> None:
    commits = [
        ("t", 0, 5, T, "A", 1), ("t", 0, 40, T + 1, None, 2),  # an admin skips 35 messages: a jump
        ("t", 0, 45, T + 2, "A", 3), ("t", 0, 10, T + 3, None, 4),  # backwards: a regression, not a jump
        ("t", 1, 5, T, None, 5), ("t", 1, 9, T + 1, None, 6),  # nobody named: a consumerOffset.json snapshot
        ("t", 1, 12, T + 2, "A", 7),  # a member's own progress
    ]  # fmt: skip
    _, commits_df, _ = frames(spark, [], commits, {})
    [(kind, topic, queue, event_ts, detail)] = found(offset_jumps(commits_df, AS_OF))
    assert (kind, topic, queue, event_ts) == ("OFFSET_JUMP", "t", 0, T + 1)
    assert detail == {"from_offset": 5, "to_offset": 40, "skipped": 35, "client_before": "A", "seq": 2}


def tagged(k: int, a_holds: tuple[int, ...], b_holds: tuple[int, ...], table: str = "TagB") -> list[tuple[Any, ...]]:
    """Member A subscribes t with TagA, B with TagB, and the broker keeps `table` for t (B's, the newest)."""
    return [sub(k, "A", "t", "TagA"), sub(k, "B", "t", "TagB"), sub(k, None, "t", table, broker="b"),
            *(held(k, "A", "t", q, 0) for q in a_holds), *(held(k, "B", "t", q, 0) for q in b_holds)]  # fmt: skip


def test_messages_a_tag_filter_refused_are_undelivered_per_queue_and_run(spark: SparkSession) -> None:
    """Six messages per queue, tagged A and B in turn, passed between snapshots 0 and 1. A's queue 0 loses all
    six (the broker passes only B, A drops B); B's queue 1 loses the three A, which A wants; nothing is
    passed between 1 and 2."""
    rows = [r for k in range(3) for r in tagged(k, (0,), (1,))]
    commits = [("t", 0, 6, T + 5_000, "A", 1), ("t", 1, 6, T + 5_000, "B", 2)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 6, ("t", 1): 6})
    [(_, _, q0, since0, d0), (_, _, q1, since1, d1)] = found(undelivered(refusals(cons, commits_df, real), AS_OF))
    both = {"exact": True, "cause": "TAG_FILTER", "since": T, "until": T + 10_000, "ongoing": False,
            "before_first_snapshot": 0}  # fmt: skip
    assert (q0, since0, q1, since1) == (0, T, 1, T)
    assert d0 == {**both, "messages": 6, "at_most": 6, "first_offset": 0, "last_offset": 5,
                  "refused_by": ["broker", "member"],
                  "filters": [{"holder": "A", "member_expression": "TagA", "broker_expression": "TagB"}]}  # fmt: skip
    assert d1 == {**both, "messages": 3, "at_most": 3, "first_offset": 0, "last_offset": 4, "refused_by": ["broker"],
                  "filters": [{"holder": "B", "member_expression": "TagB", "broker_expression": "TagB"}]}  # fmt: skip


def test_what_no_member_wants_or_every_filter_passes_is_not_undelivered(spark: SparkSession) -> None:
    """Messages tagged C or untagged, which neither A nor B wants; then a table that passes both tags to members
    that take both."""
    rows = [r for k in range(2) for r in tagged(k, (0,), (1,))]
    rows += [
        r
        for k in (2, 3)
        for r in (
            sub(k, "A", "t", "TagA || TagB"),
            sub(k, "B", "t", "TagA||TagB"),
            sub(k, None, "t", "TagB || TagA", broker="b"),
            held(k, "A", "t", 0, 0),
        )
    ]
    commits = [("t", 0, 4, T + 5_000, "A", 1), ("t", 1, 4, T + 5_000, "B", 2), ("t", 0, 8, T + 25_000, "A", 3)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 8, ("t", 1): 4}, tags=("TagC", None))
    assert found(undelivered(refusals(cons, commits_df, real), AS_OF)) == []
    _, commits_df, real = frames(spark, rows, commits, {("t", 0): 8, ("t", 1): 4})
    lost = found(undelivered(refusals(cons, commits_df, real), AS_OF))
    assert [(q, d["since"]) for _, _, q, _, d in lost] == [(0, T), (1, T)]


def test_a_hand_off_between_snapshots_makes_the_count_a_bound(spark: SparkSession) -> None:
    """Queue 0 moves from B to A between snapshots 0 and 1: whoever pulled, the three A messages were refused by
    the broker (the table keeps B); the three B messages only if A pulled them."""
    rows = tagged(0, (), (0,)) + tagged(1, (0,), ())
    cons, commits_df, real = frames(spark, rows, [("t", 0, 6, T + 5_000, "A", 1)], {("t", 0): 6})
    [(_, _, _, _, detail)] = found(undelivered(refusals(cons, commits_df, real), AS_OF))
    assert (detail["messages"], detail["at_most"], detail["exact"], detail["ongoing"]) == (3, 6, False, True)
    assert [f["holder"] for f in detail["filters"]] == ["A", "B"]


def test_a_snapshot_the_offset_did_not_move_past_keeps_the_run_whole(spark: SparkSession) -> None:
    """A holds queue 0 under the same refusing filters at four snapshots; the offset passes 2 messages, stands
    still, then passes 4: one finding of 6."""
    rows = [r for k in range(4) for r in tagged(k, (0,), ())]
    commits = [("t", 0, 2, T + 5_000, "A", 1), ("t", 0, 6, T + 25_000, "A", 2)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 6})
    [(_, _, _, since, detail)] = found(undelivered(refusals(cons, commits_df, real), AS_OF))
    assert (since, detail["messages"], detail["first_offset"], detail["last_offset"]) == (T, 6, 0, 5)
    assert (detail["until"], detail["ongoing"], detail["exact"]) == (T + 30_000, True, True)


def test_a_pull_committed_after_the_table_changed_is_a_loss_of_at_most(spark: SparkSession) -> None:
    """A holds queue 0 with `*` while the table keeps `*` at snapshot 0, and TagB at 1 and 2; A's commit of six
    messages lands between 1 and 2. It may have pulled them before the table changed (a commit reports up to a
    persist interval late), so the three A messages are lost at most: the snapshot before the window counts."""
    rows = [sub(0, "A", "t"), sub(0, None, "t", "*", broker="b"), held(0, "A", "t", 0, 0),
            *(r for k in (1, 2) for r in (sub(k, "A", "t"), sub(k, None, "t", "TagB", broker="b"),
                                          held(k, "A", "t", 0, 6)))]  # fmt: skip
    cons, commits_df, real = frames(spark, rows, [("t", 0, 6, T + 15_000, "A", 1)], {("t", 0): 6})
    [(_, _, _, since, detail)] = found(undelivered(refusals(cons, commits_df, real), AS_OF))
    assert (since, detail["messages"], detail["at_most"], detail["exact"]) == (T + 10_000, 0, 3, False)
    assert sorted(f["broker_expression"] for f in detail["filters"]) == ["*", "TagB"]


def test_what_was_passed_before_the_first_snapshot_is_a_loss_of_at_most(spark: SparkSession) -> None:
    """The group committed queue 0 to 4 before its first snapshot (k=0), which shows the refusing filters of
    `tagged`; then 2 more between snapshots 0 and 1. What applied before k=0 nobody saw: the four are possibly
    lost, never certainly, and the finding begins at the group's first commit (issue 47's real broker)."""
    rows = [r for k in range(2) for r in tagged(k, (0,), ())]
    commits = [("t", 0, 2, T - 8_000, "A", 1), ("t", 0, 4, T - 3_000, "A", 2), ("t", 0, 6, T + 5_000, "A", 3)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 6})
    real = real.withColumn("store_timestamp", real["store_timestamp"] - 10_000)
    [(_, _, _, since, detail)] = found(undelivered(refusals(cons, commits_df, real), AS_OF))
    assert (since, detail["since"], detail["until"]) == (T - 8_000, T - 8_000, T + 10_000)
    # The committed offset moved at T - 3 s, after offsets 4 and 5 were stored: pulled before k=0, perhaps.
    assert (detail["messages"], detail["at_most"], detail["before_first_snapshot"], detail["exact"]) == (0, 6, 4, False)


def test_the_first_window_is_exact_where_the_offset_stood_still_since_the_message(spark: SparkSession) -> None:
    """As above, but offsets 4 and 5 were stored after the last commit before the first snapshot: nobody pulled
    them before it, so the window is certain; the time before the first snapshot still is not."""
    rows = [r for k in range(2) for r in tagged(k, (0,), ())]
    commits = [("t", 0, 4, T - 8_000, "A", 1), ("t", 0, 6, T + 5_000, "A", 2)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 6})
    real = real.withColumn("store_timestamp", F.when(F.col("queue_offset") < 4, T - 9_000).otherwise(T - 1_000))
    refused = refusals(cons, commits_df, real)
    [(_, _, _, since, detail)] = found(undelivered(refused, AS_OF))
    assert (since, detail["messages"], detail["at_most"], detail["before_first_snapshot"]) == (T - 8_000, 2, 6, 4)
    # Reconcile keeps what both outputs read, window 0 among it, and reads the same refusals from it.
    kept = refused_by_filters(cons, commits_df, real)
    for computed, taken in zip(refused, kept, strict=True):
        assert sorted(map(repr, taken.collect())) == sorted(map(repr, computed.collect())) != []
    assert (detail["exact"], detail["first_offset"], detail["last_offset"]) == (False, 4, 5)
    # Without the time before (the group's first commit at the snapshot), the same window is exact.
    later = [("t", 0, 0, T, "A", 1), ("t", 0, 6, T + 5_000, "A", 2)]
    _, commits_df, _ = frames(spark, rows, later, {("t", 0): 6})
    [(_, _, _, since, detail)] = found(undelivered(refusals(cons, commits_df, real), AS_OF))
    assert (since, detail["messages"], detail["at_most"], detail["before_first_snapshot"], detail["exact"]) == (
        T, 6, 6, 0, True)  # fmt: skip


def test_without_a_consumer_snapshot_no_filter_refused_anything_and_finding_so_runs_no_job(
    spark: SparkSession,
) -> None:
    """No snapshot bounds a window: reconcile takes the refusals as none, with the columns of those computed
    (which come out empty too), and reading them runs no Spark job."""
    cons, commits_df, real = frames(spark, [], [("t", 0, 4, T, "A", 1)], {("t", 0): 6})
    computed, taken = refusals(cons, commits_df, real), refused_by_filters(cons, commits_df, real)
    assert (taken.windows.schema, taken.per_message.schema) == (computed.windows.schema, computed.per_message.schema)
    assert computed.windows.count() == computed.per_message.count() == 0
    before = jobs_started(spark)
    assert taken.windows.collect() == taken.per_message.collect() == []
    assert found(undelivered(taken, AS_OF)) == []
    assert jobs_started(spark) == before


def test_without_a_consumer_snapshot_the_group_rules_that_read_them_are_left_out(spark: SparkSession) -> None:
    """With no snapshot, reconcile leaves out the four rules that read them: the findings are the same as with
    every rule (an offset jump here), as are their columns."""
    commits = [("t", 0, 5, T, "A", 1), ("t", 0, 40, T + 1, None, 2), ("t", 0, 10, T + 2, "A", 3)]
    cons, commits_df, stored = frames(spark, [], commits, {("t", 0): 45})
    real = stored.withColumn("uniq_key", F.lit(None).cast("string")).withColumn("transaction_id", F.col("uniq_key"))
    copy = spark.createDataFrame([], to_struct(COPY))
    refused = refused_by_filters(cons, commits_df, real)
    every, left_out = (group_anomalies(cons, commits_df, real, copy, refused, AS_OF, 60_000, snapshots_seen=seen)
                       for seen in (True, False))  # fmt: skip
    assert left_out.schema == every.schema
    assert [kind for kind, *_ in found(left_out)] == ["OFFSET_JUMP"]
    assert found(left_out) == found(every)


def test_what_a_filter_may_have_refused_is_possibly_undelivered(spark: SparkSession) -> None:
    """Deliveries follow UNDELIVERED's bounds: what the committed offset passed before the first snapshot under a
    filter that refuses it is POSSIBLY_UNDELIVERED, what every filter refused UNDELIVERED, what none did CONSUMED."""
    rows = [r for k in range(2) for r in tagged(k, (0,), (1,))]
    commits = [("t", 0, 4, T - 8_000, "A", 1), ("t", 0, 6, T + 5_000, "A", 2), ("t", 1, 6, T + 5_000, "B", 3)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 6, ("t", 1): 6})
    real = real.selectExpr("*", "concat_ws(':', topic, queue_id, queue_offset) AS uniq_key",
                           "CAST(NULL AS STRING) AS transaction_id")  # fmt: skip
    real = real.withColumn("store_timestamp", F.when(F.col("queue_offset") < 4, T - 9_000).otherwise(T - 1_000))
    none = real.limit(0).selectExpr("broker_name", "topic", "queue_id", "queue_offset", "store_timestamp",
                                    "'g' AS consumer_group", "'retry' AS kind", "topic AS origin_topic", "uniq_key",
                                    "1 AS reconsume_times")  # fmt: skip
    findings = spark.createDataFrame([], "anomaly_type string, consumer_group string, broker_name string, "
                                         "topic string, queue_id int, detail string")  # fmt: skip
    got = deliveries(real, cons, commits_df, none, findings, refusals(cons, commits_df, real), AS_OF).collect()
    status = {(r["queue_id"], r["queue_offset"]): r["status"] for r in got}
    assert status == {**{(0, o): "POSSIBLY_UNDELIVERED" if o < 4 else "UNDELIVERED" for o in range(6)},
                      **{(1, o): "UNDELIVERED" if o % 2 == 0 else "CONSUMED" for o in range(6)}}  # fmt: skip


def test_what_an_admin_jumped_over_is_skipped_not_undelivered(spark: SparkSession) -> None:
    """A holds queue 0 under the refusing filters of `tagged`; A commits 2, then an admin moves the offset to 6
    (an OFFSET_JUMP): only the two A pulled were refused by a filter."""
    rows = [r for k in range(3) for r in tagged(k, (0,), ())]
    commits = [("t", 0, 2, T + 5_000, "A", 1), ("t", 0, 6, T + 6_000, None, 2)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 6})
    [(_, _, _, _, detail)] = found(undelivered(refusals(cons, commits_df, real), AS_OF))
    assert (detail["messages"], detail["first_offset"], detail["last_offset"]) == (2, 0, 1)


def test_a_dlq_copy_is_dead_lettered_with_its_original_queue_and_transaction(spark: SparkSession) -> None:
    """Two copies in %DLQ%g: of a committed transactional message (its commit stored twice, on queue 1) and of a
    plain one; a retry copy is no finding, nor is a DLQ copy stored after as_of."""
    real = spark.createDataFrame(
        [("b", "t", 1, 7, T, "K1", "tx-1"), ("b", "t", 1, 9, T + 5, "K1", "tx-1"), ("b", "t", 0, 3, T, "K2", None)],
        "broker_name string, topic string, queue_id int, queue_offset long, store_timestamp long, uniq_key string, "
        "transaction_id string")  # fmt: skip
    copy = spark.createDataFrame([
        ("b", "%DLQ%g", 0, 0, T + 100, "g", "dead_letter", "t", "M1", "K1", 4, True, "tx-1"),
        ("b", "%RETRY%g", 0, 5, T + 50, "g", "retry", "t", "M2", "K2", 3, False, None),
        ("b", "%DLQ%g", 0, 1, T + 200, "g", "dead_letter", "t", "M2", "K2", 4, False, None),
        ("b", "%DLQ%g", 0, 2, AS_OF + 1, "g", "dead_letter", "t", "M2", "K2", 4, False, None),
    ], "broker_name string, topic string, queue_id int, queue_offset long, store_timestamp long, "
       "consumer_group string, kind string, origin_topic string, origin_message_id string, uniq_key string, "
       "reconsume_times int, transactional boolean, transaction_id string")  # fmt: skip
    rows = sorted(dead_letters(copy, real, AS_OF).collect(), key=lambda r: r["event_ts"])
    assert [(r["anomaly_type"], r["consumer_group"], r["topic"], r["queue_id"], r["uniq_key"], r["event_ts"])
            for r in rows] == [("DEAD_LETTERED", "g", "t", 1, "K1", T + 100), ("DEAD_LETTERED", "g", "t", 0, "K2",
                                                                            T + 200)]  # fmt: skip
    first, second = (json.loads(r["detail"]) for r in rows)
    assert first == {"dlq_topic": "%DLQ%g", "dlq_queue_id": 0, "dlq_queue_offset": 0, "reconsume_times": 4,
                     "origin_broker": "b", "origin_queue_offset": 7, "transaction_id": "tx-1", "transactional": True,
                     "origin_message_id": "M1"}  # fmt: skip
    assert (second["origin_queue_offset"], second["transactional"], second.get("transaction_id")) == (3, False, None)


def test_a_run_takes_up_the_messages_an_offset_passed_since_the_new_ones_and_changed_windows(
    spark: SparkSession,
) -> None:
    """Groups g and h commit on t (queues 0 to 2, offsets 0..5 stored) and want it, having no snapshot. Since the
    last run g moved from 2 to 4 on t:0, h stayed at 3 on t:1, no group commits on t:2, and g committed up to 2
    on u:0 for the first time; t:1 got message 6. Of h's regressions on t:1, [0, 2) was found then and now,
    [4, 5) only then and [2, 3) only now. Only the messages passed since, the new one and those of a window
    found or lost since can change: what is still pending, all of t:2 and t:1's [0, 2) stay as they were."""
    commit = "consumer_group string, topic string, queue_id int, offset long, commit_timestamp long"
    then = [("g", "t", 0, 2, T), ("h", "t", 1, 3, T)]
    now = [*then, ("g", "t", 0, 4, T + 5_000), ("g", "u", 0, 2, T + 5_000)]
    commits_then, commits_now = (
        offset_commits(spark.createDataFrame(rows, commit).selectExpr("'b' AS broker_name", "*",
                                                                       "'c' AS client_id", "CAST(NULL AS LONG) AS seq"))
        for rows in (then, now)
    )  # fmt: skip
    cons, _, real = frames(spark, [], [], {("t", 0): 6, ("t", 1): 7, ("t", 2): 6, ("u", 0): 3})
    real = real.selectExpr("*", "concat_ws(':', topic, queue_id, queue_offset) AS uniq_key")
    new = real.where("topic = 't' AND queue_id = 1 AND queue_offset = 6")
    stored = spark.createDataFrame([], "consumer_group string, broker_name string, topic string, queue_id int, "
                                       "queue_offset long, status string, duplicates_expected int")  # fmt: skip
    copies = spark.createDataFrame([], "store_timestamp long, origin_topic string, uniq_key string")
    found_then, found_now = (
        spark.createDataFrame(
            [("OFFSET_REGRESSION", "h", "b", "t", 1, json.dumps({"from_offset": high, "to_offset": low}))
             for low, high in windows],
            "anomaly_type string, consumer_group string, broker_name string, topic string, queue_id int, "
            "detail string",
        )
        for windows in (((0, 2), (4, 5)), ((0, 2), (2, 3)))
    )  # fmt: skip
    taken = changing(real, new, cons, commits_then, commits_now, stored, copies, found_then, found_now,
                     refusals(cons, commits_now, real), AS_OF)  # fmt: skip
    assert sorted((r["topic"], r["queue_id"], r["queue_offset"]) for r in taken.collect()) == [
        ("t", 0, 2),
        ("t", 0, 3),
        ("t", 1, 2),
        ("t", 1, 4),
        ("t", 1, 6),
        ("u", 0, 0),
        ("u", 0, 1),
    ]


def test_deliveries_say_what_became_of_every_wanted_message_in_every_group(spark: SparkSession) -> None:
    """Group g: A holds t:0 and B t:1 as in the tag test above, with t:1 committed up to 4 only; message t:1:1
    failed until the DLQ after two retries; an offset regression rewound t:1 from 4 to 2. Group h was never
    snapshot but commits t:0 up to 3, so it wants all of t."""
    rows = [r for k in range(3) for r in tagged(k, (0,), (1,))]
    commits = [("t", 0, 6, T + 5_000, "A", 1), ("t", 1, 4, T + 5_000, "B", 2)]
    cons, commits_df, real = frames(spark, rows, commits, {("t", 0): 6, ("t", 1): 6})
    real = real.selectExpr("*", "concat_ws(':', topic, queue_id, queue_offset) AS uniq_key",
                           "CAST(NULL AS STRING) AS transaction_id")  # fmt: skip
    h = offset_commits(spark.createDataFrame([("b", "h", "t", 0, 3, T, "C", 1)], OFFSET))
    copy = spark.createDataFrame([
        ("b", "%RETRY%g", 0, 0, T + 50, "g", "retry", "t", "t:1:1", 1),
        ("b", "%RETRY%g", 0, 1, T + 60, "g", "retry", "t", "t:1:1", 2),
        ("b", "%DLQ%g", 0, 0, T + 70, "g", "dead_letter", "t", "t:1:1", 3),
    ], "broker_name string, topic string, queue_id int, queue_offset long, store_timestamp long, "
       "consumer_group string, kind string, origin_topic string, uniq_key string, reconsume_times int")  # fmt: skip
    rewind = spark.createDataFrame([("OFFSET_REGRESSION", "g", "b", "t", 1, json.dumps({"from_offset": 4,
                                                                                        "to_offset": 2}))],
                                   "anomaly_type string, consumer_group string, broker_name string, topic string, "
                                   "queue_id int, detail string")  # fmt: skip
    every = commits_df.unionByName(h)
    got = deliveries(real, cons, every, copy, rewind, refusals(cons, every, real), AS_OF)
    table = {(r["consumer_group"], r["queue_id"], r["queue_offset"]): r for r in got.collect()}
    status = {k: r["status"] for k, r in table.items()}
    assert {k[2]: v for k, v in status.items() if k[:2] == ("g", 0)} == dict.fromkeys(range(6), "UNDELIVERED")
    assert {k[2]: v for k, v in status.items() if k[:2] == ("g", 1)} == {
        0: "UNDELIVERED",
        1: "DEAD_LETTERED",
        2: "UNDELIVERED",
        3: "CONSUMED",
        4: "PENDING",
        5: "PENDING",
    }
    assert {k[1:]: v for k, v in status.items() if k[0] == "h"} == {
        **{(0, o): "CONSUMED" if o < 3 else "PENDING" for o in range(6)},
        **{(1, o): "PENDING" for o in range(6)},
    }
    assert [(k, r["retries"]) for k, r in table.items() if r["retries"]] == [(("g", 1, 1), 2)]
    assert sorted(k for k, r in table.items() if r["duplicates_expected"]) == [("g", 1, 2), ("g", 1, 3)]
    # What the dashboard and the metrics show per group: the oldest pending message's age at AS_OF, not stored.
    shown = {
        r["consumer_group"]: (r["pending"], r["oldest_pending_ms"]) for r in group_deliveries(counted(got), got, AS_OF)
    }
    assert shown == {"g": (2, AS_OF - T), "h": (9, AS_OF - T)}
    # Nothing a group does not want: with only TagA wanted, g's rows are the A messages.
    only_a = [r for k in range(3) for r in (sub(k, "A", "t", "TagA"), sub(k, None, "t", "TagA", broker="b"),
                                            held(k, "A", "t", 0, 0), held(k, "A", "t", 1, 0))]  # fmt: skip
    cons_a = spark.createDataFrame(only_a, to_struct(CONSUMER))
    none = copy.limit(0), rewind.limit(0), refusals(cons_a, commits_df, real)
    rows_a = deliveries(real, cons_a, commits_df, *none, AS_OF).collect()
    assert sorted((r["queue_id"], r["queue_offset"], r["status"]) for r in rows_a) == [
        (q, o, "CONSUMED" if o < (6 if q == 0 else 4) else "PENDING") for q in (0, 1) for o in (0, 2, 4)
    ]
