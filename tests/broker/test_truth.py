"""The truth rules (broker.truth.classify) on literal facts, at the edges of each window."""

from __future__ import annotations

from typing import Any

from broker.profiles import BrokerSettings
from broker.truth import Anomaly, Thresholds, TxnFacts, classify

CFG, THR = BrokerSettings(), Thresholds()
T0 = 1_000_000


def _classify(as_of: int, **facts: Any) -> tuple[str, str | None, list[Anomaly]]:
    base = {"broker_name": "b", "uniq_key": "u", "born_ts": T0, "last_copy_ts": T0}
    return classify(TxnFacts(**{**base, **facts}), as_of, CFG, THR)


def test_pending_turns_stuck_at_exactly_stuck_after() -> None:
    assert _classify(T0 + 59_999) == ("PENDING", None, [])
    state, _, [a] = _classify(T0 + 60_000)
    assert state == "PENDING" and a.anomaly_type == "STUCK_HALF" and a.detail["broker_still_checking"] is True
    _, _, [a] = _classify(T0 + 66_001 + 60_000)
    assert a.detail["broker_still_checking"] is False  # last copy older than 2 intervals + timeout


def test_max_checks_without_evidence_only_after_the_discard_window() -> None:
    last = T0 + 450_000
    window = CFG.check_interval_ms + CFG.transaction_timeout_ms
    state, _, _ = _classify(last + window, last_copy_ts=last, max_check_times=15)
    assert state == "PENDING"
    state, reason, [a] = _classify(last + window + 1, last_copy_ts=last, max_check_times=15)
    assert (state, reason, a.anomaly_type) == ("DISCARDED", "MAX_CHECKS", "DISCARDED_AFTER_MAX_CHECKS")
    state, _, _ = _classify(last + window + 1, last_copy_ts=last, max_check_times=14)
    assert state == "PENDING"


def test_evidence_reason_follows_the_check_count() -> None:
    assert _classify(T0 + 1, discard_ts=T0 + 1, max_check_times=15)[:2] == ("DISCARDED", "MAX_CHECKS")
    assert _classify(T0 + 1, discard_ts=T0 + 1, max_check_times=0)[:2] == ("DISCARDED", "EXPIRED")


def test_expired_by_age() -> None:
    reserved = CFG.file_reserved_hours * 3_600_000
    assert _classify(T0 + reserved)[0] == "PENDING"
    assert _classify(T0 + reserved + 1)[:2] == ("DISCARDED", "EXPIRED")


def test_commits() -> None:
    # Resolved single commit: nothing to report.
    assert _classify(T0 + 10**6, commit_ts=[T0 + 100], resolved_ts=T0 + 200) == ("COMMITTED", None, [])
    # Unresolved commit: NO_OP only once op_grace_ms has passed.
    assert _classify(T0 + 100 + 10_000, commit_ts=[T0 + 100])[2] == []
    [a] = _classify(T0 + 100 + 10_001, commit_ts=[T0 + 100])[2]
    assert (a.anomaly_type, a.reason) == ("ORPHANED_COMMIT", "NO_OP")
    # Two commits, the second after a discard.
    _, _, found = _classify(T0 + 10**6, commit_ts=[T0 + 500, T0 + 100], resolved_ts=T0 + 200, discard_ts=T0 + 300)
    assert sorted((a.anomaly_type, a.reason, a.event_ts) for a in found) == [
        ("DUPLICATE_COMMIT", None, T0 + 500),
        ("ORPHANED_COMMIT", "AFTER_DISCARD", T0 + 500),
    ]


def test_resolved_without_commit_is_rolled_back_even_if_maxed() -> None:
    rolled_back = {"resolved_ts": T0 + 5, "max_check_times": 15, "max_copy_offset": 15, "op_offsets": {15}}
    assert _classify(T0 + 10**7, **rolled_back) == ("ROLLED_BACK", None, [])


def test_rechecked_when_the_newest_check_copy_stays_open() -> None:
    # Committed through the original (offset 0); the check copy at 7 came before the op and no op lists it.
    _, _, [a] = _classify(T0 + 10**6, commit_ts=[T0 + 100], resolved_ts=T0 + 4_000, max_check_times=1,
                          max_copy_offset=7, last_copy_ts=T0 + 3_000, op_offsets={0},
                          discard_ts=T0 + 90_000)  # fmt: skip
    assert (a.anomaly_type, a.event_ts, a.detail) == (
        "RECHECKED_AFTER_RESOLUTION",
        T0 + 4_000,
        {"discarded": True, "committed_twice": False},
    )
    # An earlier open copy is harmless when the newest one is resolved; no check copy at all, too.
    found = _classify(T0 + 10**6, commit_ts=[T0 + 100, T0 + 9_000], resolved_ts=T0 + 4_000, max_check_times=2,
                      max_copy_offset=9, op_offsets={0, 9})[2]  # fmt: skip
    assert [a.anomaly_type for a in found] == ["DUPLICATE_COMMIT"]
    assert _classify(T0 + 10**6, commit_ts=[T0 + 100], resolved_ts=T0 + 200, op_offsets={0})[2] == []


def test_rechecked_only_when_a_check_could_follow_the_resolution() -> None:
    """The newest copy is a check copy no op lists. Of a discarded transaction, it counts as re-checked after
    the resolution only if it came after the first final message or op: the discard ended the checks."""
    copies = {"max_check_times": 3, "max_copy_offset": 9, "op_offsets": {0}, "last_copy_ts": T0 + 3_000}

    def kinds(commit: int, discard: int, op: int) -> list[tuple[str, str | None]]:
        found = _classify(T0 + 10**6, **copies, commit_ts=[T0 + commit], discard_ts=T0 + discard, resolved_ts=T0 + op)
        return sorted((a.anomaly_type, a.reason) for a in found[2])

    assert kinds(commit=100_000, discard=3_500, op=100_500) == [("ORPHANED_COMMIT", "AFTER_DISCARD")]  # late
    assert kinds(commit=100, discard=5_000, op=7_000) == [("RECHECKED_AFTER_RESOLUTION", None)]  # op lagged
    assert kinds(commit=100, discard=5_000, op=4_000) == [("RECHECKED_AFTER_RESOLUTION", None)]
    assert kinds(commit=3_200, discard=3_500, op=7_000) == []  # committed after the last check
