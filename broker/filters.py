"""Tag filters: what a pull of a queue lets through, the messages they refused, and the truth of UNDELIVERED.

A pull is filtered twice (reference §2.2): by the broker with the expression its subscription table keeps for
the topic, then by the client with its own. A refused message is skipped and the offset still advances, so a
message some member of the group wants is lost to the group when either filter refuses it. The model records
every such refusal as it happens (`refused`).

UNDELIVERED is judged on what snapshots can show (DESIGN §2): the truth follows the rule's windows, pairs of
consecutive snapshots of a group in which a filter of the queue, as the model's state had it at either snapshot or
at the one before (a commit reports passes up to a persist interval late), could refuse, in runs; a run is a finding
from the first window in which a filter seen refused a wanted message the committed offset passed. Window 0 is the
time before the group's first snapshot, from its first commit on the queue, judged by the first snapshot's filters
(what the committed offset passed by then, from the queue's first message, which nothing else shows). The finding
carries `refused_offsets` and their count `messages_refused`: the wanted messages of its windows that a filter
really refused, for the score to hold against the finding's bounds and the deliveries table against each message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MQ = tuple[str, str, int]  # (topic, broker_name, queue_id)
ALL = "*"


def tag_matches(expression: str, tag: str | None) -> bool:
    """RocketMQ's tag filter: `*` takes every message, `A || B` those tagged A or B (FilterAPI)."""
    tags = {t.strip() for t in expression.split("||")}
    return ALL in tags or (tag is not None and tag in tags)


@dataclass(frozen=True)
class Filter:
    """The two filters a pull of one queue passes at a snapshot, and every member's expression for its topic."""

    holder: str
    member: str
    broker: str
    wanted: tuple[str, ...]

    def can_refuse(self) -> bool:
        return not (tag_matches(self.member, None) and tag_matches(self.broker, None))

    def loses(self, tag: str | None) -> bool:
        wanted = any(tag_matches(e, tag) for e in self.wanted)
        return wanted and not (tag_matches(self.broker, tag) and tag_matches(self.member, tag))


@dataclass
class _Seen:
    k: int
    ts: int
    filters: dict[MQ, frozenset[Filter]]
    committed: dict[MQ, int]
    earlier: dict[MQ, frozenset[Filter]]  # the filters of the snapshot before


@dataclass
class _Run:
    k: int  # the last window's number
    since: int | None = None
    until: int = 0
    refused: int = 0  # per window, as the rule counts: an offset passed in two windows counts twice
    offsets: set[int] = field(default_factory=set)


class FilterWatch:
    def __init__(self, truth: Callable[[dict[str, Any]], None]) -> None:
        self.truth = truth
        self.refused: dict[tuple[str, MQ], set[int]] = {}  # (group, queue) -> offsets a filter refused
        self.skipped: dict[tuple[str, MQ], list[tuple[int, int, int]]] = {}  # admin jumps: when, from, to
        self.first_commit: dict[tuple[str, MQ], int] = {}  # when the group first committed the queue
        self.seen: dict[str, _Seen] = {}
        self.runs: dict[tuple[str, MQ], _Run] = {}

    def refuse(self, group: str, mq: MQ, offset: int) -> None:
        self.refused.setdefault((group, mq), set()).add(offset)

    def commit(self, group: str, mq: MQ, now: int) -> None:
        self.first_commit.setdefault((group, mq), now)

    def skip(self, group: str, mq: MQ, now: int, start: int, end: int) -> None:
        """An admin moved the committed offset from `start` to `end` (an OFFSET_JUMP): skipped, not refused."""
        self.skipped.setdefault((group, mq), []).append((now, start, end))

    def snapshot(self, now: int, group: str, filters: dict[MQ, frozenset[Filter]], committed: dict[MQ, int],
                 tags: Callable[[MQ], Sequence[str | None]]) -> None:  # fmt: skip
        """One snapshot of a group: the filters of each held queue (none where the broker was down or its table
        lacks the topic) and the committed offsets (absent: the queue's first offset, 0)."""
        before = self.seen.get(group)
        k = before.k + 1 if before else 1
        if before is None:  # window 0: what the committed offsets passed before anything showed the filters
            for mq in sorted(mq for mq, configs in filters.items() if any(f.can_refuse() for f in configs)):
                if committed.get(mq, 0) > 0:
                    since = self.first_commit[(group, mq)]
                    self._window(group, mq, _Seen(0, since, {}, {}, {}), now, 0, filters[mq], committed[mq], tags(mq))
        else:
            for mq in sorted(set(before.earlier) | set(before.filters) | set(filters)):
                configs = (
                    before.earlier.get(mq, frozenset())
                    | before.filters.get(mq, frozenset())
                    | filters.get(mq, frozenset())
                )
                if not any(f.can_refuse() for f in configs):
                    continue
                self._window(group, mq, before, now, k - 1, configs, committed.get(mq, 0), tags(mq))
        self.seen[group] = _Seen(k, now, filters, committed, before.filters if before else {})
        for key in [key for key, run in self.runs.items() if key[0] == group and run.k < k - 1]:
            self._end(key)  # the run's queue had no window that could refuse since

    def _window(self, group: str, mq: MQ, before: _Seen, now: int, k: int, configs: frozenset[Filter], c1: int,
                tags: Sequence[str | None]) -> None:  # fmt: skip
        key = (group, mq)
        run = self.runs.get(key)
        if run is not None and run.k != k - 1:
            self._end(key)
            run = None
        if run is None:
            run = self.runs[key] = _Run(k)
        run.k = k
        c0 = before.committed.get(mq, 0)
        if c1 <= c0:
            return
        jumps = [(a, b) for t, a, b in self.skipped.get(key, []) if before.ts < t <= now]
        passed = [o for o in range(c0, c1) if not any(a <= o < b for a, b in jumps)]
        if not any(f.loses(tags[o]) for o in passed for f in configs):
            return
        if run.since is None:
            run.since = before.ts
        run.until = now
        refused = self.refused.get(key, set()).intersection(passed)
        run.refused += len(refused)
        run.offsets |= refused

    def _end(self, key: tuple[str, MQ]) -> None:
        run = self.runs.pop(key)
        if run.since is None:
            return
        group, (topic, broker, queue_id) = key
        self.truth({"anomaly_type": "UNDELIVERED", "reason": None, "broker_name": broker, "consumer_group": group,
                    "topic": topic, "queue_id": queue_id, "event_ts": run.since,
                    "detail": {"since": run.since, "until": run.until, "messages_refused": run.refused,
                               "refused_offsets": sorted(run.offsets), "cause": "TAG_FILTER"}})  # fmt: skip

    def close(self) -> None:
        for key in sorted(self.runs):
            self._end(key)
