"""The check service and end-transaction handling on single transactions (reference §1.4-1.7)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from broker.profiles import BrokerSettings
from broker.topology import START_MS
from tests.broker.harness import DISCARD_TOPIC, Run, run_model

QUIET: dict[str, Any] = {"plain_ratio": 0.0, "slow_consume_ratio": 0.0, "drain_ms": 900_000}


def _halves(run: Run, key: str | None = None) -> list[dict[str, Any]]:
    return [h for h in run.records["half"] if key is None or h["uniq_key"] == key]


def test_never_decided_gets_exactly_15_checks_then_discard() -> None:
    run = run_model(1, seed=1, profile="clean", never_decided=1.0, **QUIET)
    halves = _halves(run)
    original, copies = halves[0], halves[1:]
    assert "check_times" not in original and original["store_timestamp"] == START_MS
    assert [c["check_times"] for c in copies] == list(range(1, 16))
    # First check on the first pass after the 6 s timeout (30 s), then one per 30 s pass.
    stored = [c["store_timestamp"] - START_MS for c in copies]
    assert stored[0] // 1000 == 30 and all(b - a == 30_000 for a, b in itertools.pairwise(stored))
    # Discarded on the 16th encounter, to TRANS_CHECK_MAX_TIME_TOPIC, never to the real topic. Here that
    # is the same pass: nothing else blocks the walk, and needDiscard runs before the freshness test.
    [discard] = run.records["real"]
    assert discard["topic"] == DISCARD_TOPIC and discard["uniq_key"] == original["uniq_key"]
    assert discard["store_timestamp"] == copies[-1]["store_timestamp"]
    assert discard["sys_flag"] == 0 and discard["transactional"] is True
    assert run.records["op"] == []
    [truth] = run.truth_transactions
    assert (truth["state"], truth["reason"], truth["check_times"]) == ("DISCARDED", "MAX_CHECKS", 15)
    assert [a["anomaly_type"] for a in run.truth_anomalies] == ["DISCARDED_AFTER_MAX_CHECKS"]


def test_unknown_answer_is_committed_through_the_check_copy() -> None:
    run = run_model(1, seed=2, profile="clean", unknown_answer=1.0, commit_ratio=1.0, **QUIET)
    original, *copies = _halves(run)
    # Checks before the local transaction's state is known get UNKNOW; the first one after it commits.
    copy = copies[-1]
    assert len(copies) >= 1 and copy["check_times"] == len(copies)
    [commit] = [r for r in run.records["real"] if r["topic"] != DISCARD_TOPIC]
    # The check request describes the copy, so the final message and the op point at the copy.
    assert commit["prepared_transaction_offset"] == copy["commit_log_offset"] != original["commit_log_offset"]
    assert commit["sys_flag"] == 8 and commit["topic"] == original["real_topic"]
    assert commit["queue_id"] == original["real_queue_id"]
    ops = run.records["op"]
    assert [int(x) for op in ops for x in op["body"].split(",") if x] == [copy["queue_offset"]]
    assert run.truth_transactions[0]["state"] == "COMMITTED" and run.truth_anomalies == []


def test_rollback_writes_only_an_op() -> None:
    run = run_model(1, seed=3, profile="clean", commit_ratio=0.0, **QUIET)
    assert run.records["real"] == []
    [op] = run.records["op"]
    assert op["tag"] == "d"
    assert int(op["body"].rstrip(",")) == _halves(run)[0]["queue_offset"]
    assert run.truth_transactions[0]["state"] == "ROLLED_BACK"


def test_op_body_formats_per_broker_version() -> None:
    run = run_model(400, seed=4, profile="clean", **QUIET)
    bodies = {b: [op["body"] for op in run.records["op"] if op["broker_name"] == b] for b in ("broker-a", "broker-b")}
    assert all(body.endswith(",") for body in bodies["broker-a"])  # 5.1+: "17,18,20,"
    assert any(body.count(",") > 1 for body in bodies["broker-a"])  # batched
    assert all(body.isdigit() for body in bodies["broker-b"])  # <= 5.0: "17"


def test_transaction_id_only_from_5_1() -> None:
    """__transactionId__ came with RIP-50 (5.1.0): a 4.9.7 broker stored it on no half and no final message."""
    run = run_model(400, seed=4, profile="clean", **QUIET)
    stored = run.records["half"] + [r for r in run.records["real"] if r["transactional"]]
    ids = {b: {r.get("transaction_id") == r["uniq_key"] for r in stored if r["broker_name"] == b}
           for b in ("broker-a", "broker-b")}  # fmt: skip
    assert ids == {"broker-a": {True}, "broker-b": {False}}
    assert all(r.get("transaction_id") is None for r in stored if r["broker_name"] == "broker-b")


def _batched_ops(run: Run) -> list[dict[str, Any]]:
    """broker-a's ops: it plays a 5.1+ broker, which batches them."""
    return [op for op in run.records["op"] if op["broker_name"] == "broker-a"]


def _entries(op: dict[str, Any]) -> list[int]:
    return [int(token) for token in op["body"].split(",") if token]


def test_an_op_backlog_is_written_in_messages_of_the_broker_size() -> None:
    """getOpMessage stops taking entries once the body reaches transactionOpMsgMaxSize; after a stall the
    batch service writes the backlog as several such messages at once (batchSendOpMessage)."""
    size = 64
    run = run_model(4000, seed=6, profile="clean", broker=BrokerSettings(op_msg_max_size=size), op_stall=2,
                    txn_per_second=50.0, **QUIET)  # fmt: skip
    ops = _batched_ops(run)
    for op in ops:
        last = op["body"].rstrip(",").rsplit(",", 1)[-1]
        assert len(op["body"]) - len(last) - 1 < size, op  # the entry that reached the size is the last
    by_time = Counter(op["store_timestamp"] for op in ops)
    backlog_ts, written = by_time.most_common(1)[0]
    assert written >= 3  # a stall's backlog, written at once
    assert all(len(op["body"]) >= size for op in ops if op["store_timestamp"] == backlog_ts)
    entries = [e for op in ops for e in _entries(op)]
    assert len(entries) == len(set(entries))  # nothing listed twice, nothing lost on the way


def test_a_full_op_context_makes_the_end_request_write_its_own_op() -> None:
    """A MessageQueueOpContext holds a fixed number of entries; when it is full, the end request writes an
    op of its own entry and what it drains from the context (deletePrepareMessage)."""
    run = run_model(300, seed=7, profile="clean", broker=BrokerSettings(op_context_capacity=4), txn_per_second=50.0,
                    **QUIET)  # fmt: skip
    ops = _batched_ops(run)
    listed = Counter(len(_entries(op)) for op in ops)
    assert max(listed) == 5 and listed[5] > len(ops) / 2  # 50 ends a second: the context is mostly full
    entries = [e for op in ops for e in _entries(op)]
    assert len(entries) == len(set(entries))


def test_duplicate_end_commits_twice() -> None:
    run = run_model(1, seed=5, profile="clean", duplicate_end=1.0, commit_ratio=1.0, **QUIET)
    commits = [r for r in run.records["real"] if r["sys_flag"] == 8]
    assert len(commits) == 2 and len({c["queue_offset"] for c in commits}) == 2
    assert {c["prepared_transaction_offset"] for c in commits} == {_halves(run)[0]["commit_log_offset"]}
    assert [a["anomaly_type"] for a in run.truth_anomalies] == ["DUPLICATE_COMMIT"]


def test_immunity_copies_carry_the_original_offset_and_count_checks() -> None:
    for seed in range(100):  # a transaction whose window (30, 60 or 120 s) spans several passes
        run = run_model(1, seed=seed, profile="clean", immunity_ratio=1.0, never_decided=1.0, **QUIET)
        original, *copies = _halves(run)
        immunity_s = original["check_immunity_seconds"]
        if immunity_s == 120:
            break
    window = [c for c in copies if c["store_timestamp"] - original["born_timestamp"] < immunity_s * 1000]
    assert window, "a copy is re-appended on each pass inside the immunity window"
    assert all(c["prepared_queue_offset"] == original["queue_offset"] for c in copies)
    assert [c["check_times"] for c in copies] == list(range(1, len(copies) + 1))
    assert max(c["check_times"] for c in copies) == 15


def test_skewed_producer_clock_expires_an_unresolved_half() -> None:
    run = run_model(1, seed=7, profile="clean", never_decided=1.0, skewed_producers=5, **QUIET)
    [half] = _halves(run)  # no check: needSkip fires on the first pass
    [discard] = run.records["real"]
    assert discard["topic"] == DISCARD_TOPIC and half["store_timestamp"] - half["born_timestamp"] > 72 * 3_600_000
    assert [(a["anomaly_type"], a["reason"]) for a in run.truth_anomalies] == [("DISCARDED_EXPIRED", "EXPIRED")]


def test_lost_end_is_recovered_by_a_check() -> None:
    run = run_model(60, seed=8, profile="clean", lost_end=0.5, commit_ratio=1.0, **QUIET)
    commits = [r for r in run.records["real"] if r["sys_flag"] == 8]
    halves_by_offset = {h["commit_log_offset"]: h for h in _halves(run)}
    via_copy = [c for c in commits if "check_times" in halves_by_offset[c["prepared_transaction_offset"]]]
    assert via_copy, "some commits only happen after a check (the end request was lost)"
    states = {t["state"] for t in run.truth_transactions}
    assert states <= {"COMMITTED", "DISCARDED"}


def test_a_check_before_the_op_commits_again_or_leaves_the_copy_open() -> None:
    """Seen on a real 5.3.3 broker: with its op late, a committed transaction is checked. An application
    answering from its table commits it again at every check until the op comes; one answering UNKNOW
    leaves the check copy open, so the broker checks it to the end and discards it, committed as it is."""
    stalled = {"op_stall": 1, "commit_ratio": 1.0, "txn_per_second": 1.0, **QUIET}
    aware = run_model(60, seed=4, profile="clean", **stalled)
    unaware = run_model(60, seed=4, profile="clean", unaware_checker=1.0, **stalled)
    again = [t for t in aware.truth_transactions if t["commit_count"] > 1]
    assert again and all(t["commit_count"] == 1 + t["check_times"] for t in again)  # one more per check
    assert {a["anomaly_type"] for a in aware.truth_anomalies} == {"DUPLICATE_COMMIT"}
    rechecked = [a for a in unaware.truth_anomalies if a["anomaly_type"] == "RECHECKED_AFTER_RESOLUTION"]
    checked = {t["uniq_key"] for t in unaware.truth_transactions if t["check_times"] and t["state"] == "COMMITTED"}
    assert checked and {a["uniq_key"] for a in rechecked} == checked
    assert all(a["detail"] == {"discarded": True, "committed_twice": False} for a in rechecked)
    by_key = {t["uniq_key"]: t for t in unaware.truth_transactions}
    assert all(by_key[a["uniq_key"]]["check_times"] == 15 and by_key[a["uniq_key"]]["commit_count"] == 1
               for a in rechecked)  # fmt: skip
    discards = {r["uniq_key"] for r in unaware.records["real"] if r["topic"] == DISCARD_TOPIC}
    assert discards == {a["uniq_key"] for a in rechecked}
