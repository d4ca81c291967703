"""The reconcile transforms on tiny hand-written frames (chispa), one edge case at a time."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from jobs.reconcile import snapshots_up_to
from jobs.session import jobs_started
from schemas.landing import HALF_TOPIC, OP_TOPIC, ROCKSDB_HALF_TOPIC, ROCKSDB_OP_TOPIC
from transforms.anomalies import (
    Finding,
    all_anomalies,
    discard,
    duplicate_commit,
    findings,
    offset_commits,
    offset_regressions,
    orphaned_commit,
    rechecked_after_resolution,
    stuck_half,
)
from transforms.frames import (
    Asking,
    cached_frames,
    folds_empty,
    gathered,
    kept_with_ranges,
    kept_with_size,
    ranges,
    to_pandas_together,
    within,
)
from transforms.lifecycle import Rules, facts, lifecycle, listed_copies, resolutions, resolved_offsets
from transforms.scope import touched_transactions
from transforms.trace import answered

pytestmark = pytest.mark.spark
RULES = Rules()

HALF = ("broker_name string, queue_id int, queue_offset long, commit_log_offset long, store_timestamp long, "
        "born_timestamp long, uniq_key string, producer_group string, real_topic string, real_queue_id int, "
        "check_times int, prepared_queue_offset long, topic string")  # fmt: skip
OP = "broker_name string, queue_id int, queue_offset long, store_timestamp long, body string, topic string"
REAL = ("broker_name string, topic string, queue_id int, queue_offset long, store_timestamp long, uniq_key string, "
        "sys_flag int, transactional boolean, prepared_transaction_offset long, producer_group string")  # fmt: skip
OFFSET = ("broker_name string, consumer_group string, topic string, queue_id int, offset long, "
          "commit_timestamp long, client_id string, seq long")  # fmt: skip


def half(uniq: str, offset: int, store: int, *, checks: int | None = None, prepared: int | None = None,
         born: int = 1_000, phys: int | None = None, broker: str = "b",
         topic: str = HALF_TOPIC) -> tuple[Any, ...]:  # fmt: skip
    return (broker, 0, offset, phys if phys is not None else offset * 100, store, born, uniq, "pg", "orders", 1,
            checks, prepared, topic)  # fmt: skip


def op_rows(spark: SparkSession, rows: list[Any]) -> DataFrame:
    """Ops as (broker, queue, offset, store, body[, topic]); the classic op topic unless given."""
    return spark.createDataFrame([r if len(r) == 6 else (*r, OP_TOPIC) for r in rows], OP)


def commit(uniq: str, qo: int, store: int, prepared: int | None, *, topic: str = "orders") -> tuple[Any, ...]:
    return ("b", topic, 1, qo, store, uniq, 8, True, prepared, "pg")


def build(spark: SparkSession, halves: list[Any], ops: list[Any], reals: list[Any], as_of: int) -> DataFrame:
    h, o, r = spark.createDataFrame(halves, HALF), op_rows(spark, ops), spark.createDataFrame(reals, REAL)
    return facts(h, resolutions(h, resolved_offsets(o)), r).transform(lifecycle(as_of, RULES))


def states(df: DataFrame) -> dict[str, tuple[Any, ...]]:
    return {r["uniq_key"]: (r["state"], r["reason"]) for r in df.collect()}


def test_op_bodies_both_formats(spark: SparkSession) -> None:
    ops = op_rows(spark, [("b", 0, 0, 100, "17,18,20,"), ("b", 0, 1, 50, "18"), ("c", 0, 0, 70, "17"),
                          ("b", 1, 2, 60, "17,"), ("b", 0, 0, 80, "17", ROCKSDB_OP_TOPIC)])  # fmt: skip
    c, r = HALF_TOPIC, ROCKSDB_HALF_TOPIC
    expected = spark.createDataFrame(
        [("b", c, 0, 17, 100), ("b", c, 0, 18, 50), ("b", c, 0, 20, 100), ("c", c, 0, 17, 70), ("b", c, 1, 17, 60),
         ("b", r, 0, 17, 80)],
        "broker_name string, half_topic string, queue_id int, half_offset long, resolved_ts long",
    )  # fmt: skip
    assert_df_equality(resolved_offsets(ops), expected, ignore_row_order=True, ignore_nullable=True)


def test_resolution_through_own_offset_only_and_out_of_order_op(spark: SparkSession) -> None:
    halves = spark.createDataFrame([
        half("A", 0, 20), half("A", 5, 30_000, checks=1),  # resolved through a later check copy
        half("I", 2, 21), half("I", 7, 30_001, checks=1, prepared=2),  # an immunity copy of offset 2
        half("P", 9, 500),  # its op was stored before it (ingest order does not matter)
        half("N", 10, 600),  # never resolved
    ], HALF)  # fmt: skip
    ops = op_rows(spark, [("b", 0, 0, 30_010, "5,2,"), ("b", 0, 1, 400, "9")])
    life = facts(halves, resolutions(halves, resolved_offsets(ops)), spark.createDataFrame([], REAL))
    rows = {r["uniq_key"]: r for r in life.transform(lifecycle(40_000, RULES)).collect()}
    got = {k: (r["resolved_ts"], r["last_check_resolved"], r["unresolved_checks"]) for k, r in rows.items()}
    # The op lists I's original, not its immunity copy: a real broker leaves that copy open (DESIGN §2).
    assert got == {"A": (30_010, True, 0), "I": (30_010, False, 1), "P": (400, None, 0), "N": (None, None, 0)}
    by_copy = sorted(tuple(r) for r in resolutions(halves, resolved_offsets(ops)).collect())
    assert by_copy == [("b", "A", 5, 30_010), ("b", "I", 2, 30_010), ("b", "P", 9, 400)]


def test_lifecycle_states(spark: SparkSession) -> None:
    halves = [
        half("A", 0, 1_000),
        half("A", 3, 31_000, checks=1, phys=300),  # committed through the copy
        half("R", 1, 1_001),  # rolled back
        half("D", 2, 1_002),
        half("D", 4, 31_000, checks=1),  # discarded with evidence after 1 check: EXPIRED
        half("E", 5, 1_005, born=1_005 - 73 * 3_600_000),  # no evidence, too old: EXPIRED
        half("S", 6, 60_000),  # pending
    ]
    ops = [("b", 0, 0, 31_050, "3,1,")]
    reals = [commit("A", 0, 31_040, 300), commit("O", 1, 40_000, None),  # O: a commit with no half
             ("b", "TRANS_CHECK_MAX_TIME_TOPIC", 0, 0, 61_000, "D", 0, True, None, "pg")]  # fmt: skip
    life = build(spark, halves, ops, reals, as_of=100_000)
    assert states(life) == {
        "A": ("COMMITTED", None), "R": ("ROLLED_BACK", None), "D": ("DISCARDED", "EXPIRED"),
        "E": ("DISCARDED", "EXPIRED"), "S": ("PENDING", None), "O": ("COMMITTED", None),
    }  # fmt: skip
    a = life.where("uniq_key = 'A'").collect()[0]
    assert (a["copies"], a["check_times"], a["resolved_ts"], a["commit_count"], a["first_commit_ts"]) == (
        2, 1, 31_050, 1, 31_040)  # fmt: skip
    o = life.where("uniq_key = 'O'").collect()[0]
    assert (o["copies"], o["first_copy_ts"], o["real_topic"], o["producer_group"]) == (0, None, "orders", "pg")


def found(life: DataFrame, rule: list[Finding], as_of: int) -> list[Any]:
    """The anomaly rows one rule's findings give on a lifecycle (of producers that do not trace)."""
    return life.transform(answered(None, RULES)).transform(findings(*rule, as_of=as_of)).collect()


@pytest.mark.parametrize(
    ("after_last_copy", "expected"), [(36_000, ("PENDING", None)), (36_001, ("DISCARDED", "MAX_CHECKS"))]
)
def test_exactly_check_max_checks_before_and_after_the_discard_window(
    spark: SparkSession, after_last_copy: int, expected: tuple[str, str | None]
) -> None:
    copies = [half("M", 0, 1_000)] + [half("M", k, 1_000 + 30_000 * k, checks=k) for k in range(1, 16)]
    last = 1_000 + 30_000 * 15
    life = build(spark, copies, [], [], as_of=last + after_last_copy)
    assert states(life) == {"M": expected}
    kinds = [r["anomaly_type"] for r in found(life, discard(), last + after_last_copy)]
    assert kinds == (["DISCARDED_AFTER_MAX_CHECKS"] if expected[0] == "DISCARDED" else [])
    stuck = found(life, stuck_half(last + after_last_copy, RULES), last + after_last_copy)
    assert len(stuck) == (1 if expected[0] == "PENDING" else 0)


def test_a_rip_82_broker(spark: SparkSession) -> None:
    """RIP-82 halves are resolved by the ops of their own op topic only (a classic half at the same offset
    is not), and one nobody resolves is discarded by the clock: the broker deletes it at its check_max + 1-th
    check, timeout + check_max intervals after it was stored, and leaves no message. Past the rules' slack
    it is DISCARDED, and a commit after that time is an orphan."""
    halves = [half("C", 0, 1_000, topic=ROCKSDB_HALF_TOPIC), half("K", 0, 1_000),
              half("D", 1, 1_000, topic=ROCKSDB_HALF_TOPIC), half("L", 2, 1_000, topic=ROCKSDB_HALF_TOPIC)]  # fmt: skip
    ops = [("b", 0, 0, 2_000, "0", ROCKSDB_OP_TOPIC)]
    deleted = 1_000 + RULES.transaction_timeout_ms + RULES.check_max * RULES.check_interval_ms
    slack = RULES.check_interval_ms + RULES.transaction_timeout_ms
    reals = [commit("C", 0, 1_900, 0), commit("L", 1, deleted + 5_000, 200)]
    before = build(spark, halves, ops, reals, as_of=deleted + slack)
    assert states(before) == {"C": ("COMMITTED", None), "K": ("PENDING", None), "D": ("PENDING", None),
                              "L": ("COMMITTED", None)}  # fmt: skip
    as_of = deleted + slack + 1
    after = build(spark, halves, ops, reals, as_of)
    assert states(after)["D"] == ("DISCARDED", "MAX_CHECKS")
    rows = {r["uniq_key"]: r for r in after.collect()}
    assert {k: (r["discard_ts"], r["resolved_ts"], r["half_topic"]) for k, r in rows.items()} == {
        "C": (None, 2_000, ROCKSDB_HALF_TOPIC), "K": (None, None, HALF_TOPIC), "D": (deleted, None, ROCKSDB_HALF_TOPIC),
        "L": (deleted, None, ROCKSDB_HALF_TOPIC)}  # fmt: skip
    found = all_anomalies(after, spark.createDataFrame([], OFFSET).transform(offset_commits),
                          spark.createDataFrame([], REAL), as_of, RULES)  # fmt: skip
    got = {(r["anomaly_type"], r["uniq_key"], r["reason"]): r for r in found.collect()}
    assert set(got) == {("DISCARDED_AFTER_MAX_CHECKS", "D", "MAX_CHECKS"), ("STUCK_HALF", "K", None),
                        ("ORPHANED_COMMIT", "L", "AFTER_DISCARD"), ("ORPHANED_COMMIT", "L", "NO_OP")}  # fmt: skip
    assert json.loads(got[("DISCARDED_AFTER_MAX_CHECKS", "D", "MAX_CHECKS")]["detail"])["has_evidence"] is False


def test_commit_anomalies(spark: SparkSession) -> None:
    halves = [
        half("DUP", 0, 1_000),  # two commits for one UNIQ_KEY
        half("NOOP", 1, 1_000),  # committed, never resolved
        half("LATE", 2, 1_000, checks=15),  # discarded, then committed
        half("MIS", 3, 1_000),  # the commit's prepared offset matches no copy
        half("YOUNG", 4, 1_000),  # committed 10 s before as_of, op not there yet: not NO_OP
    ]
    ops = [("b", 0, 0, 2_000, "0,0,3,")]
    as_of = 100_000
    reals = [commit("DUP", 0, 1_500, 0), commit("DUP", 1, 1_600, 0), commit("NOOP", 2, 1_700, 100),
             ("b", "TRANS_CHECK_MAX_TIME_TOPIC", 0, 0, 5_000, "LATE", 0, True, None, "pg"),
             commit("LATE", 3, 6_000, 200), commit("MIS", 4, 1_800, 999), commit("GHOST", 5, 1_900, 12),
             commit("YOUNG", 6, as_of - 10_000, 400)]  # fmt: skip
    life = build(spark, halves, ops, reals, as_of)
    found = all_anomalies(life, spark.createDataFrame([], OFFSET).transform(offset_commits),
                          spark.createDataFrame([], REAL), as_of, RULES)  # fmt: skip
    got = {(r["anomaly_type"], r["uniq_key"], r["reason"]): r for r in found.collect()}
    assert set(got) == {
        ("DUPLICATE_COMMIT", "DUP", None), ("ORPHANED_COMMIT", "NOOP", "NO_OP"),
        ("ORPHANED_COMMIT", "LATE", "AFTER_DISCARD"), ("ORPHANED_COMMIT", "LATE", "NO_OP"),
        ("ORPHANED_COMMIT", "MIS", "OFFSET_MISMATCH"), ("ORPHANED_COMMIT", "GHOST", "NO_HALF"),
    }  # fmt: skip
    assert got[("DUPLICATE_COMMIT", "DUP", None)]["event_ts"] == 1_600
    assert got[("ORPHANED_COMMIT", "LATE", "AFTER_DISCARD")]["event_ts"] == 6_000
    assert json.loads(got[("ORPHANED_COMMIT", "MIS", "OFFSET_MISMATCH")]["detail"])["prepared_offsets"] == [999]
    assert len({r["anomaly_id"] for r in got.values()}) == len(got)


def test_offset_regressions_order_equal_recommit_and_redelivery(spark: SparkSession) -> None:
    commits_ = spark.createDataFrame([
        ("b", "g", "t", 0, 100, 1_000, "c1", 1),
        ("b", "g", "t", 0, 40, 2_000, "c2", 2),  # 100 -> 40: a regression
        ("b", "g", "t", 0, 120, 3_000, "c2", 3),
        ("b", "g", "t", 0, 120, 4_000, "c2", 4),  # equal offset again: not a regression
        ("b", "g", "t", 0, 10, 5_000, None, 6),  # same millisecond, later by seq: 130 -> 10
        ("b", "g", "t", 0, 130, 5_000, "c2", 5),
        ("b", "g", "t", 1, 5, 1_000, "c1", None),  # another queue; null seq and client are fine
    ], OFFSET)  # fmt: skip
    silver = commits_.transform(offset_commits)
    flags = [(r["offset"], r["prev_offset"], r["is_regression"])
             for r in silver.where("queue_id = 0").orderBy("commit_timestamp", "seq").collect()]  # fmt: skip
    assert flags == [(100, None, False), (40, 100, True), (120, 40, False), (120, 120, False), (130, 120, False),
                     (10, 130, True)]  # fmt: skip
    reals = spark.createDataFrame([("b", "t", 0, q, 1, None, 0, False, None, None) for q in range(150)], REAL)
    found = silver.transform(offset_regressions(reals, 9_000)).collect()
    details = sorted((r["event_ts"], json.loads(r["detail"])) for r in found)
    assert [(ts, d["from_offset"], d["to_offset"], d["redelivery_estimate"], d["client_before"], d["client_after"],
             d["seq"]) for ts, d in details] == [
        (2_000, 100, 40, 60, "c1", "c2", 2), (5_000, 130, 10, 120, "c2", None, 6)]  # fmt: skip


def test_results_do_not_depend_on_partitions_or_input_order(spark: SparkSession) -> None:
    halves = [half(f"T{i}", i, 1_000 + i, checks=(i % 3) or None) for i in range(40)]
    ops = [("b", 0, i, 2_000 + i, f"{i}," if i % 2 else str(i)) for i in range(0, 40, 3)]
    reals = [commit(f"T{i}", i, 1_500 + i, i * 100) for i in range(0, 40, 4)]
    results = []
    for partitions, order in (("1", 1), ("7", -1)):
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
        try:
            life = build(spark, halves[::order], ops[::order], reals[::order], as_of=200_000).repartition(3)
            results.append(
                sorted(tuple(r) for r in life.drop("copy_offsets", "commit_ts", "prepared_offsets").collect())
            )
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert results[0] == results[1]


def test_duplicate_and_stuck_details(spark: SparkSession) -> None:
    life = build(spark, [half("S", 0, 1_000)], [], [commit("X", 0, 10, None), commit("X", 1, 20, None)], 70_000)
    [stuck] = found(life, stuck_half(70_000, RULES), 70_000)
    assert json.loads(stuck["detail"]) == {"age_ms": 69_000, "broker_still_checking": False, "copies": 1,
                                           "check_times": 0, "producer_group": "pg"}  # fmt: skip
    [dup] = found(life, duplicate_commit(), 70_000)
    assert (dup["uniq_key"], dup["event_ts"], json.loads(dup["detail"])["commit_count"]) == ("X", 20, 2)
    assert [r["reason"] for r in found(life, orphaned_commit(70_000, RULES), 70_000)] == ["NO_HALF"]


def test_rechecked_after_resolution(spark: SparkSession) -> None:
    halves = [
        half("C", 0, 1_000),
        half("C", 5, 3_000, checks=1),  # committed; its op came after the check copy
        half("R", 1, 1_000),
        half("R", 6, 3_000, checks=1),  # rolled back the same way
        half("T", 2, 1_000),
        half("T", 7, 3_000, checks=1),  # checked too early, answered: committed twice
        half("E", 3, 1_000),
        half("E", 8, 3_000, checks=1),
        half("E", 9, 5_000, checks=2),  # last copy resolved
        half("U", 4, 1_000),
        half("U", 10, 3_000, checks=1),  # never resolved: pending, not rechecked
        half("D", 11, 1_000),
        half("D", 12, 3_000, checks=15),  # discarded, then committed 100 s later through its original half
        half("S", 13, 1_000),
        half("S", 14, 3_000, checks=3),  # committed before this check, discarded before its op came
        half("W", 15, 1_000),
        half("W", 16, 3_000, checks=3),  # committed after its last check and before the discard
    ]
    ops = [("b", 0, 0, 4_500, "0,1,2,3,"), ("b", 0, 1, 9_000, "7,9,"), ("b", 0, 2, 104_500, "11,"),
           ("b", 0, 3, 7_000, "13,15,")]  # fmt: skip

    def discard(uniq: str, qo: int, at: int) -> tuple[Any, ...]:
        return ("b", "TRANS_CHECK_MAX_TIME_TOPIC", 0, qo, at, uniq, 0, True, None, "pg")

    reals = [commit("C", 0, 1_100, 0), commit("T", 1, 1_100, 200), commit("T", 2, 3_100, 700), discard("C", 0, 8_000),
             discard("D", 1, 4_000), commit("D", 3, 104_000, 1_100), commit("S", 4, 2_000, 1_300),
             discard("S", 2, 5_000), commit("W", 5, 3_500, 1_500), discard("W", 3, 4_000)]  # fmt: skip
    as_of = 110_000
    life = build(spark, halves, ops, reals, as_of)
    got = {r["uniq_key"]: (r["event_ts"], json.loads(r["detail"]))
           for r in found(life, rechecked_after_resolution(), as_of)}  # fmt: skip
    assert got == {
        "C": (4_500, {"state": "COMMITTED", "unresolved_checks": 1, "check_times": 1, "op_lag_ms": 3_400,
                      "discarded": True, "committed_twice": False}),
        "R": (4_500, {"state": "ROLLED_BACK", "unresolved_checks": 1, "check_times": 1, "op_lag_ms": None,
                      "discarded": False, "committed_twice": False}),
        "S": (7_000, {"state": "COMMITTED", "unresolved_checks": 1, "check_times": 3, "op_lag_ms": 5_000,
                      "discarded": True, "committed_twice": False}),
    }  # fmt: skip
    # C and S were checked after their commit and discarded (C after its op, S before its lagging op); W's
    # last check and D's came before their commit, and the discard ended the checks. D's commit came after
    # the discard: it is a late commit alone.
    late = [(r["uniq_key"], r["reason"]) for r in found(life, orphaned_commit(as_of, RULES), as_of)]
    assert late == [("D", "AFTER_DISCARD")]


def test_an_op_that_lists_a_copy_later_brings_its_final_transaction_back(spark: SparkSession) -> None:
    """An incremental run recomputes the transactions with new events, the open ones, and those a new op lists a
    copy of: a committed transaction whose check copy an op lists only later has no new event of its own, and
    its row changes all the same (its last check is now resolved)."""
    halves = [
        half("C", 0, 1_000),
        half("C", 5, 3_000, checks=1),  # committed; its check copy listed later
        half("R", 1, 1_000),  # rolled back: final
        half("P", 2, 1_000),  # never resolved: open
    ]
    ops, reals = [("b", 0, 0, 1_500, "0,1,")], [commit("C", 0, 1_100, 0)]
    later = [("b", 0, 1, 4_500, "5,")]
    before, after = build(spark, halves, ops, reals, 5_000), build(spark, halves, ops + later, reals, 5_000)
    assert {r["uniq_key"]: r["last_check_resolved"] for r in before.collect()}["C"] is False
    assert {r["uniq_key"]: r["last_check_resolved"] for r in after.collect()}["C"] is True
    h = spark.createDataFrame(halves, HALF)
    keys = touched_transactions(h.limit(0), listed_copies(op_rows(spark, later)), spark.createDataFrame([], REAL), h,
                                before)  # fmt: skip
    assert sorted(r["uniq_key"] for r in keys.collect()) == ["C", "P"]


def test_within_the_ranges_of_some_keys_a_join_on_them_keeps_the_same_rows(spark: SparkSession) -> None:
    """`within` bounds a table by the ranges of a few keys before a join on them: the join keeps the same rows,
    the bound alone drops the rows outside every range, and keys with no value keep nothing."""
    table = spark.createDataFrame(
        [("b", q, o, f"v{q}{o}") for q in range(3) for o in range(50)] + [("a", 0, 7, "other broker"),
                                                                            (None, 1, 20, "no broker")],
        "broker_name string, queue_id int, queue_offset long, v string",
    )  # fmt: skip
    keys = spark.createDataFrame([("b", 1, 20), ("b", 2, 25), ("b", 1, 30), ("c", 9, 999)],
                                 "broker_name string, queue_id int, queue_offset long")  # fmt: skip
    key = ["broker_name", "queue_id", "queue_offset"]
    bounds = ranges(keys, key)
    assert bounds == {"broker_name": ("b", "c"), "queue_id": (1, 9), "queue_offset": (20, 999)}
    kept, observed = kept_with_ranges(keys, key)  # the same bounds, observed while the keys are kept
    assert observed == bounds and sorted(kept.collect()) == sorted(keys.collect())
    kept, observed, size = kept_with_size(keys, key)  # and their number, in the same pass
    assert (observed, size) == (bounds, 4) and sorted(kept.collect()) == sorted(keys.collect())
    bounded = within(table, bounds)
    assert_df_equality(bounded.join(keys, on=key, how="left_semi"), table.join(keys, on=key, how="left_semi"),
                       ignore_row_order=True)  # fmt: skip
    assert sorted(bounded.select(*key).collect()) == sorted(
        r for r in table.select(*key).collect() if r[0] == "b" and r[1] >= 1 and r[2] >= 20
    )
    nothing = ranges(keys.where("queue_offset < 0"), key)
    assert nothing == dict.fromkeys(key, (None, None)) == kept_with_ranges(keys.where("queue_offset < 0"), key)[1]
    assert within(table, nothing).count() == 0


def test_cached_frames_are_filled_by_the_jobs_that_read_them_and_let_go_on_leaving(spark: SparkSession) -> None:
    """`cached_frames` caches a frame without a Spark job of its own (a checkpoint runs one), every read after the
    first finds it cached, and leaving lets every frame it cached go, a failure too."""
    counts = spark.range(1000).select((F.col("id") % 7).alias("k")).groupBy("k").count()
    expected = sorted(counts.collect())
    before = jobs_started(spark)
    with cached_frames() as cache:
        cached = cache(counts)
        assert jobs_started(spark) == before and cached.is_cached
        assert sorted(cached.collect()) == expected == sorted(cached.where("k >= 0").collect())
        assert "InMemoryRelation" in cached.where("k >= 0")._jdf.queryExecution().optimizedPlan().toString()
    assert not cached.is_cached
    with pytest.raises(RuntimeError), cached_frames() as cache:
        again = cache(counts)
        raise RuntimeError("a failure while cached")
    assert not again.is_cached
    assert "InMemoryRelation" not in counts.where("k >= 0")._jdf.queryExecution().optimizedPlan().toString()


def test_snapshots_that_are_none_stay_the_empty_relation_and_run_no_job(spark: SparkSession) -> None:
    """`folds_empty` tells a frame Spark plans as no rows; `snapshots_up_to` keeps such snapshots as they are
    (checkpointed, every plan reading them broadcast them) and checkpoints any others."""
    stored = spark.createDataFrame([("g", 5), ("g", 50)], "consumer_group string, snapshot_ts long")
    assert folds_empty(stored.limit(0)) and folds_empty(stored.where(F.lit(False)))
    assert not folds_empty(stored) and not folds_empty(stored.where("snapshot_ts > 100"))  # no rows, unplanned
    none = snapshots_up_to({"consumer": stored.limit(0)}, 10)
    before = jobs_started(spark)
    assert none.join(F.broadcast(none.groupBy("consumer_group").count()), "consumer_group").collect() == []
    assert folds_empty(none) and jobs_started(spark) == before
    some = snapshots_up_to({"consumer": stored}, 10)
    assert not folds_empty(some) and [tuple(r) for r in some.collect()] == [("g", 5)]
    assert "LogicalRDD" in some._jdf.queryExecution().optimizedPlan().toString()  # checkpointed


def test_queries_asked_together_are_answered_by_one_spark_job_a_round(spark: SparkSession) -> None:
    """Computations that ask their queries a round at a time get the rows `collect` gives (a nested row as a
    dict), every round in one job, and return what they return."""
    df = spark.createDataFrame([(i, f"k{i % 3}", float(i) / 4, None) for i in range(30)],
                               "n long, k string, x double, gone string").persist()  # fmt: skip
    by_key = df.groupBy("k").agg(F.count(F.lit(1)).alias("rows"), F.max("x"), F.percentile_approx("x", [0.5, 0.9]))
    firsts = df.orderBy("n").limit(3).select("n", "gone", F.struct("k", "x").alias("s"), F.col("n").alias("n"))
    queries = [by_key, firsts, df.where("n < 0"), df.agg(F.min("n"), F.max("n"))]
    wanted = [q.collect() for q in queries]

    def twice() -> Asking[list[list[Row]]]:  # a second round asking what the first found
        first = yield queries
        [[(low, high)]] = first[3:]
        [again] = yield [df.where(F.col("n").between(low, high)).agg(F.count(F.lit(1)))]
        return [*first, again]

    def nothing() -> Asking[str]:  # asks nothing
        return "done"
        yield []

    before = jobs_started(spark)
    found, done = gathered(twice(), nothing())
    assert jobs_started(spark) == before + 2
    assert done == "done"
    assert sorted(found[0]) == sorted(wanted[0]) and found[0][0].asDict().keys() == wanted[0][0].asDict().keys()
    assert [(n, gone, s, n2) for n, gone, s, n2 in found[1]] == [(r[0], None, r[2].asDict(), r[3]) for r in wanted[1]]
    assert found[2] == wanted[2] == [] and found[3] == wanted[3]
    assert [tuple(r) for r in found[4]] == [(30,)]


def test_frames_fetched_together_are_those_to_pandas_gives_in_one_spark_job(spark: SparkSession) -> None:
    """Several queries fetched as pandas frames in one job: each the frame `toPandas` gives of its first `limit`
    rows, whatever its column types (nulls in a number, a timestamp, a struct, an array), an empty one
    included, and names repeated within a query or across queries."""
    import datetime as dt

    import pandas as pd

    df = spark.createDataFrame(
        [(i, None if i % 4 else i * 10, f"k{i % 3}", dt.datetime(2026, 1, 1, 0, 0, i), [i, i + 1], i % 2 == 0)
         for i in range(12)],
        "n long, maybe int, k string, at timestamp, pair array<long>, even boolean",
    ).persist()  # fmt: skip
    queries = [
        df.select("n", "maybe", "at", F.struct("k", "at").alias("s"), "pair", F.col("n").alias("n")),
        df.where("n < 0"),
        df.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.max("at").alias("at")).orderBy("k"),
        df.select("even", "k"),
    ]
    wanted = [q.limit(5).toPandas() for q in queries]
    before = jobs_started(spark)
    found = to_pandas_together(queries, 5)
    assert jobs_started(spark) == before + 1
    assert [len(f) for f in found] == [5, 0, 3, 5]

    def ordered(frame: pd.DataFrame) -> pd.DataFrame:  # by the first column (names repeat)
        return frame.iloc[frame.iloc[:, 0].astype(str).argsort(kind="stable")].reset_index(drop=True)

    for got, want in zip(found, wanted, strict=True):
        pd.testing.assert_frame_equal(ordered(got), ordered(want))
