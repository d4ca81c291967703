"""Invariants of the broker model's output, over random seeds, profiles and rates (Hypothesis)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import LANDING
from schemas.validate import problems
from tests.broker.harness import DISCARD_TOPIC, Run, reference_findings, run_model, truth_keys

runs = st.builds(
    lambda n, seed, profile, rate: run_model(n, seed, profile, txn_per_second=rate),
    n=st.integers(1, 250),
    seed=st.integers(0, 2**32),
    profile=st.sampled_from(["clean", "default", "chaos"]),
    rate=st.sampled_from([0.3, 2.0, 50.0]),  # slow runs live long enough for discards and incidents
)
examples = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@examples
@given(runs)
def test_records_follow_the_landing_schemas(run: Run) -> None:
    for stream, recs in run.records.items():
        for rec in recs:
            assert problems(LANDING[stream], rec) == [], (stream, rec)


@examples
@given(runs)
def test_queue_offsets_are_dense_per_queue(run: Run) -> None:
    queues: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for stream in ("half", "op"):
        for r in run.records[stream]:
            queues[(stream, r["broker_name"], str(r["queue_id"]))].append(r["queue_offset"])
    for r in run.records["real"]:
        queues[("real", r["broker_name"], r["topic"], str(r["queue_id"]))].append(r["queue_offset"])
    for offsets in queues.values():
        assert offsets == list(range(len(offsets)))  # dense and in store order


@examples
@given(runs)
def test_every_final_message_points_at_a_half_copy(run: Run) -> None:
    copies = {(h["broker_name"], h["commit_log_offset"]): h for h in run.records["half"]}
    for r in run.records["real"]:
        if r["topic"] == DISCARD_TOPIC or r["sys_flag"] != 8:
            continue
        half = copies[(r["broker_name"], r["prepared_transaction_offset"])]
        assert half["uniq_key"] == r["uniq_key"] and half["store_timestamp"] <= r["store_timestamp"]
        assert (half["real_topic"], half["real_queue_id"]) == (r["topic"], r["queue_id"])


@examples
@given(runs)
def test_ops_list_existing_half_offsets_and_check_times_stay_bounded(run: Run) -> None:
    stored = {(h["broker_name"], h["queue_offset"]): h["store_timestamp"] for h in run.records["half"]}
    for op in run.records["op"]:
        for token in op["body"].split(","):
            if token:
                assert stored[(op["broker_name"], int(token))] <= op["store_timestamp"]
    assert all(h.get("check_times", 0) <= 15 for h in run.records["half"])


@examples
@given(runs)
def test_truth_agrees_with_the_rules_applied_to_the_records(run: Run) -> None:
    states, found = reference_findings(run.records, run.summary.as_of)
    truth_states = {(t["broker_name"], t["uniq_key"]): (t["state"], t["reason"]) for t in run.truth_transactions}
    assert truth_states == states
    assert truth_keys(run) == found
    assert run.summary.as_of == max(
        [r["store_timestamp"] for s in ("half", "op", "real", "copy", "trace") for r in run.records.get(s, [])]
        + [o["commit_timestamp"] for o in run.records["offset"]]
    )


@examples
@given(runs)
def test_discarded_after_max_checks_means_15_copies_and_no_op_or_commit(run: Run) -> None:
    resolved = {(op["broker_name"], int(t)) for op in run.records["op"] for t in op["body"].split(",") if t}
    for a in run.truth_anomalies:
        if a["anomaly_type"] != "DISCARDED_AFTER_MAX_CHECKS":
            continue
        halves = [
            h for h in run.records["half"] if (h["broker_name"], h["uniq_key"]) == (a["broker_name"], a["uniq_key"])
        ]
        assert {h.get("check_times") for h in halves} >= set(range(1, 16))
        assert not any((h["broker_name"], h["queue_offset"]) in resolved for h in halves)
        assert not any(r.get("uniq_key") == a["uniq_key"] and r["sys_flag"] == 8 for r in run.records["real"])


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32), rate=st.sampled_from([1.0, 20.0, 200.0]))
def test_clean_profile_has_no_anomaly_and_consumers_reach_the_queue_end(n: int, seed: int, rate: float) -> None:
    run = run_model(n, seed, "clean", txn_per_second=rate)
    assert run.truth_anomalies == []
    assert {t["state"] for t in run.truth_transactions} <= {"COMMITTED", "ROLLED_BACK"}
    assert len(run.truth_transactions) == n
    queue_end: dict[tuple[str, str, int], int] = defaultdict(int)
    for r in run.records["real"]:
        queue_end[(r["broker_name"], r["topic"], r["queue_id"])] += 1
    last: dict[tuple[str, str, str, int], Any] = {}
    for o in run.records["offset"]:
        last[(o["consumer_group"], o["broker_name"], o["topic"], o["queue_id"])] = o["offset"]
    subscribed = {"cg-billing": {"orders"}, "cg-analytics": {"orders", "payments", "audit-log"},
                  "cg-audit": {"payments", "audit-log"}}  # fmt: skip
    for group, topics in subscribed.items():
        for (broker, topic, qid), end in queue_end.items():
            if topic in topics:
                assert last[(group, broker, topic, qid)] == end
