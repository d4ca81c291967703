"""Consumer groups as `txn-recon collect` sees them: a snapshot of every group every SNAPSHOT_MS, and the
truth of the group findings (DESIGN §2) derived from the model's own state at those instants.

A snapshot lists each member's subscriptions and the queues it holds with its in-memory offset, and
the subscription table each broker keeps. The truth follows the state, not the records: which members
subscribed to what, who held which queue, what the brokers had committed and stored. Hand-offs also
carry the duplicates the model actually delivered, so an estimate can be compared with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

MQ = tuple[str, str, int]  # (topic, broker_name, queue_id)
SNAPSHOT_MS = 10_000


@dataclass
class Member:
    client_id: str
    topics: tuple[str, ...]
    expression: str  # its tag expression, for each of its topics
    memory: dict[MQ, int]  # held queues and in-memory offsets


@dataclass
class _Episode:
    since: int
    last: int
    detail: dict[str, Any] = field(default_factory=dict)
    brokers: set[str] = field(default_factory=set)


@dataclass
class _Seen:
    ts: int
    holders: dict[MQ, dict[str, int]]  # queue -> client -> in-memory offset
    committed: dict[MQ, int]


class GroupWatch:
    def __init__(self, emit: Callable[[tuple[Any, ...], int], None], truth: Callable[[dict[str, Any]], None],
                 stranded_after_ms: int) -> None:  # fmt: skip
        self.emit, self.truth, self.stranded_after_ms = emit, truth, stranded_after_ms
        self.seen: dict[str, _Seen] = {}
        self.conflicts: dict[str, _Episode] = {}
        self.stranded: dict[tuple[str, MQ], _Episode] = {}
        self.actual: dict[tuple[str, MQ, str], int] = {}  # duplicates delivered after a hand-off, by old holder

    def handed_off(self, group: str, mq: MQ, old_holder: str, duplicates: int) -> None:
        """The model moved a queue: the new holder started `duplicates` messages behind the old one."""
        key = (group, mq, old_holder)
        self.actual[key] = self.actual.get(key, 0) + max(duplicates, 0)

    def snapshot(self, now: int, group: str, members: list[Member], tables: dict[str, dict[str, str]],
                 committed: Callable[[MQ], int | None], end: Callable[[MQ], int],
                 queues: Callable[[str], Iterable[MQ]]) -> None:  # fmt: skip
        """Emit one group's snapshot and advance its truth. `tables`: broker name -> topic -> kept expression."""
        for m in sorted(members, key=lambda m: m.client_id):
            for topic in m.topics:
                self.emit((now, group, "subscription", m.client_id, topic, m.expression, None, None, None), now)
            for mq in sorted(m.memory):
                self.emit((now, group, "queue", m.client_id, mq[0], None, mq[1], mq[2], m.memory[mq]), now)
        for broker, table in sorted(tables.items()):
            for topic, expression in table.items():
                self.emit((now, group, "subscription", None, topic, expression, broker, None, None), now)
        holders: dict[MQ, dict[str, int]] = {}
        for m in members:
            for mq, offset in m.memory.items():
                if mq[0] in m.topics:
                    holders.setdefault(mq, {})[m.client_id] = offset
        subscribed = sorted({t for m in members for t in m.topics})
        watched = [mq for t in subscribed for mq in queues(t)]
        now_committed = {mq: c for mq in watched if (c := committed(mq)) is not None}
        conflict = len({(m.topics, m.expression) for m in members}) > 1
        self._conflict(now, group, conflict, members, tables)
        self._stranded(now, group, watched, holders, now_committed, end, conflict)
        self._handoffs(now, group, holders, {m.client_id for m in members})
        self.seen[group] = _Seen(now, holders, now_committed)

    def close(self) -> None:
        """The run ended: episodes still open are judged as they stand."""
        for group in sorted(self.conflicts):
            self._end_conflict(group)
        for key in sorted(self.stranded):
            self._end_stranded(key)

    # ---- the rules, on the model's state ---------------------------------------------------------

    def _conflict(self, now: int, group: str, conflict: bool, members: list[Member],
                  tables: dict[str, dict[str, str]]) -> None:  # fmt: skip
        if not conflict:
            if group in self.conflicts:
                self._end_conflict(group)
            return
        ep = self.conflicts.setdefault(group, _Episode(now, now))
        ep.last = now
        ep.brokers |= set(tables)
        ep.detail = {"members": {m.client_id: list(m.topics) for m in members},
                     "broker_tables": {b: list(t) for b, t in tables.items()}}  # fmt: skip

    def _end_conflict(self, group: str) -> None:
        ep = self.conflicts.pop(group)
        for broker in sorted(ep.brokers):
            self.truth({"anomaly_type": "SUBSCRIPTION_CONFLICT", "reason": None, "broker_name": broker,
                        "consumer_group": group, "topic": None, "queue_id": None, "event_ts": ep.since,
                        "detail": {**ep.detail, "since": ep.since, "until": ep.last}})  # fmt: skip

    def _stranded(self, now: int, group: str, watched: list[MQ], holders: dict[MQ, dict[str, int]],
                  committed: dict[MQ, int], end: Callable[[MQ], int], conflict: bool) -> None:  # fmt: skip
        for mq in watched:
            lag = end(mq) - committed.get(mq, 0)
            key = (group, mq)
            if mq in holders or lag <= 0:
                if key in self.stranded:
                    self._end_stranded(key)
                continue
            ep = self.stranded.get(key)
            if ep is None:
                cause = "SUBSCRIPTION_CONFLICT" if conflict else "ALLOCATION_GAP"
                ep = self.stranded[key] = _Episode(now, now, {"cause": cause})
            ep.last = now
            ep.detail["lag"] = lag
        subscribed = set(watched)
        for key in [k for k in self.stranded if k[0] == group and k[1] not in subscribed]:
            self._end_stranded(key)  # no member subscribes to its topic any more

    def _end_stranded(self, key: tuple[str, MQ]) -> None:
        ep = self.stranded.pop(key)
        if ep.last - ep.since < self.stranded_after_ms:
            return
        group, (topic, broker, queue_id) = key
        self.truth({"anomaly_type": "STRANDED_QUEUE", "reason": None, "broker_name": broker, "consumer_group": group,
                    "topic": topic, "queue_id": queue_id, "event_ts": ep.since,
                    "detail": {**ep.detail, "since": ep.since, "until": ep.last}})  # fmt: skip

    def _handoffs(self, now: int, group: str, holders: dict[MQ, dict[str, int]], present: set[str]) -> None:
        before = self.seen.get(group)
        moved = {k for k in self.actual if k[0] == group}
        if before is not None:
            for mq, old in sorted(before.holders.items()):
                for client, memory in sorted(old.items()):
                    if client in holders.get(mq, {}):
                        continue
                    committed = before.committed.get(mq, 0)
                    if memory > committed:
                        self.truth({
                            "anomaly_type": "REDELIVERY_AT_HANDOFF", "reason": None, "broker_name": mq[1],
                            "consumer_group": group, "topic": mq[0], "queue_id": mq[2], "event_ts": now,
                            "detail": {"old_holder": client, "new_holders": sorted(holders.get(mq, {})),
                                       "from_offset": committed, "to_offset": memory,
                                       "duplicates_estimate": memory - committed,
                                       "old_holder_gone": client not in present,
                                       "actual_duplicates": self.actual.get((group, mq, client), 0)},
                        })  # fmt: skip
        for k in moved:
            del self.actual[k]
