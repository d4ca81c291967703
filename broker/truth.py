"""Ground truth: DESIGN §2's state and anomaly rules applied to what the model knows happened.

The model records each transaction's facts as it runs (never re-reading its output); `classify`
turns them into the state and the anomalies the pipeline must find, as of a data time.

Anomaly keys (what `score` matches on): transaction anomalies by (type, broker_name, uniq_key, reason);
OFFSET_REGRESSION by (broker_name, consumer_group, topic, queue_id, commit_timestamp, seq).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.profiles import BrokerSettings

COMMITTED, ROLLED_BACK, DISCARDED, PENDING = "COMMITTED", "ROLLED_BACK", "DISCARDED", "PENDING"
MAX_CHECKS, EXPIRED = "MAX_CHECKS", "EXPIRED"


@dataclass(frozen=True)
class Thresholds:
    stuck_after_ms: int = 60_000
    op_grace_ms: int = 10_000
    stranded_after_ms: int = 60_000
    route_delay_ms: int = 60_000
    idle_window_ms: int = 60_000
    idle_min_messages: int = 100


class Facts(Protocol):
    """What `classify` reads of a transaction (the model's Txn has these attributes too)."""

    born_ts: int
    last_copy_ts: int
    max_check_times: int
    max_copy_offset: int
    op_offsets: set[int]
    resolved_ts: int | None
    commit_ts: list[int]
    discard_ts: int | None


@dataclass
class TxnFacts:
    """What happened to one transaction, in the terms of the landing streams."""

    broker_name: str
    uniq_key: str
    born_ts: int
    last_copy_ts: int
    max_check_times: int = 0  # 0: only the original (no TRANSACTION_CHECK_TIMES)
    max_copy_offset: int = 0  # the half queue offset of its newest copy
    op_offsets: set[int] = field(default_factory=set)  # the half offsets of its copies that ops list
    resolved_ts: int | None = None  # first op stored that lists one of its copies
    commit_ts: list[int] = field(default_factory=list)  # store times of its final messages
    discard_ts: int | None = None  # first record in TRANS_CHECK_MAX_TIME_TOPIC


@dataclass(frozen=True)
class Anomaly:
    anomaly_type: str
    reason: str | None
    event_ts: int
    detail: dict[str, Any]


def classify(
    facts: Facts, as_of: int, broker: BrokerSettings, thresholds: Thresholds
) -> tuple[str, str | None, list[Anomaly]]:
    """(state, discard reason, anomalies) of one transaction as of `as_of` (DESIGN §2)."""
    anomalies: list[Anomaly] = []
    if (
        facts.resolved_ts is not None
        and facts.max_check_times > 0
        and facts.max_copy_offset not in facts.op_offsets
        and not (facts.discard_ts is not None and facts.last_copy_ts <= min([*facts.commit_ts, facts.resolved_ts]))
    ):
        # Resolved, but its newest copy is a check copy no op lists: the broker keeps checking it (unless it
        # has discarded the transaction, and no copy came after its first final message or its op).
        detail = {"discarded": facts.discard_ts is not None, "committed_twice": len(facts.commit_ts) > 1}
        anomalies.append(Anomaly("RECHECKED_AFTER_RESOLUTION", None, facts.resolved_ts, detail))
    if facts.commit_ts:
        first = min(facts.commit_ts)
        if len(facts.commit_ts) > 1:
            anomalies.append(
                Anomaly("DUPLICATE_COMMIT", None, sorted(facts.commit_ts)[1], {"commit_count": len(facts.commit_ts)})
            )
        if facts.resolved_ts is None and as_of - first > thresholds.op_grace_ms:
            anomalies.append(Anomaly("ORPHANED_COMMIT", "NO_OP", first, {}))
        if facts.discard_ts is not None:
            late = [t for t in facts.commit_ts if t > facts.discard_ts]
            if late:
                anomalies.append(
                    Anomaly("ORPHANED_COMMIT", "AFTER_DISCARD", min(late), {"discard_ts": facts.discard_ts})
                )
        return COMMITTED, None, anomalies
    if facts.resolved_ts is not None:
        return ROLLED_BACK, None, anomalies
    reason = discard_reason(facts, as_of, broker)
    if reason is not None:
        kind = "DISCARDED_AFTER_MAX_CHECKS" if reason == MAX_CHECKS else "DISCARDED_EXPIRED"
        event_ts = facts.discard_ts if facts.discard_ts is not None else facts.last_copy_ts
        anomalies.append(Anomaly(kind, reason, event_ts, {"check_times": facts.max_check_times}))
        return DISCARDED, reason, anomalies
    if as_of - facts.born_ts >= thresholds.stuck_after_ms:
        still_checked = as_of - facts.last_copy_ts <= 2 * broker.check_interval_ms + broker.transaction_timeout_ms
        anomalies.append(
            Anomaly(
                "STUCK_HALF",
                None,
                facts.born_ts,
                {"age_ms": as_of - facts.born_ts, "broker_still_checking": still_checked},
            )
        )
    return PENDING, None, anomalies


def discard_reason(facts: Facts, as_of: int, broker: BrokerSettings) -> str | None:
    """Why an unresolved, uncommitted transaction counts as discarded, or None.

    With evidence the copies tell the reason: the broker discards at check_max checks (needDiscard),
    otherwise only for age (needSkip, reference §1.6).
    """
    maxed = facts.max_check_times >= broker.check_max
    if facts.discard_ts is not None:
        return MAX_CHECKS if maxed else EXPIRED
    if maxed and as_of - facts.last_copy_ts > broker.check_interval_ms + broker.transaction_timeout_ms:
        return MAX_CHECKS
    if as_of - facts.born_ts > broker.file_reserved_hours * 3_600_000:
        return EXPIRED
    return None
