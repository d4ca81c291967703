"""Consume failures: what a group's listener fails is sent back, tried again after a delay, and parked in the
group's dead-letter queue once it failed `max_reconsume` + 1 times (the broker's side of it:
AbstractSendMessageProcessor.consumerSendMsgBack).

A message is poison for a group when a hash of the group and its UNIQ_KEY falls under the profile's ratio, so
every delivery of it fails the same way and no draw of the simulation's random streams is spent on it. Each
time the group consumes a poison message it is sent back: the broker stores a copy in `%RETRY%<group>` after
the delay of level 3 + its reconsume times (messageDelayLevel), the group consumes the copy once it is stored
and fails it again, and the copy that fails with `max_reconsume` reconsume times goes to `%DLQ%<group>` (one
queue) at once. Meanwhile the send-back waits in SCHEDULE_TOPIC_XXXX, queue level - 1, stored when it was
sent back (HookUtils.transformDelayLevelMessage; the schedule service copies it to the retry topic when the
delay is over). A copy keeps the original's born time, properties and flags, a transactional one's
included; it is never a business message.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.topology import DISCARD_TOPIC
from schemas.landing import DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC

# messageDelayLevel's default, levels 1..18; a send-back takes level 3 + the message's reconsume times.
DELAY_LEVELS_MS = tuple(s * 1000 for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200,
                                           1800, 3600, 7200))  # fmt: skip
MAX_RECONSUME = 3  # the model's groups set maxReconsumeTimes 3 (16 by default: hours of delays)


@dataclass(frozen=True)
class Original:
    """What a copy keeps of the message a group failed."""

    topic: str
    queue_id: int
    uniq_key: str
    born_ts: int
    transactional: bool
    transaction_id: str | None
    tags: str | None
    keys: str | None
    message_id: str  # the offset message id of the original (broker address and commit-log offset)


class SendBack:
    """The retry and dead-letter copies of one simulation. `store(broker, size)` gives a commit-log offset, or
    None while the broker is down (the client then tries the send-back again a second later)."""

    def __init__(self, ratio: float, at: Callable[[int, Callable[[Any], object], Any], None],
                 store: Callable[[str, int], int | None], emit: Callable[[tuple[Any, ...], int], None],
                 truth: Callable[[dict[str, Any]], None],
                 attempt: Callable[[str, str, int], None]) -> None:  # fmt: skip
        self.cut = int(ratio * 2**32)
        self.at, self.store, self.emit, self.truth, self.attempt = at, store, emit, truth, attempt
        self.next_offset: dict[tuple[str, str, int], int] = {}
        self.originals: dict[tuple[str, str, int], list[Original]] = {}  # by (topic, broker, queue), in offset order

    def poison(self, group: str, uniq_key: str) -> bool:
        return zlib.crc32(f"{group}|{uniq_key}".encode()) < self.cut

    def stored(self, rec: tuple[Any, ...]) -> None:
        """A `real` record was stored: kept (what a copy of it would keep) while some messages are poison."""
        if self.cut and rec[1] != DISCARD_TOPIC:  # REAL field order
            self.originals.setdefault((rec[1], rec[0], rec[2]), []).append(
                Original(rec[1], rec[2], rec[7], rec[6], rec[9], rec[12], rec[13], rec[14], f"{rec[4]:032X}")
            )

    def consumed(self, now: int, group: str, mq: tuple[str, str, int], start: int, end: int,
                 refused: set[int]) -> None:  # fmt: skip
        """The group consumed offsets [start, end) of a queue (some maybe again), but for those a filter
        `refused`: poison ones are sent back."""
        for offset, original in enumerate(self.originals.get(mq, [])[start:end] if self.cut else (), start):
            if offset not in refused and self.poison(group, original.uniq_key):
                self._failed((now, group, mq[1], original, 0))

    def _failed(self, arg: tuple[int, str, str, Original, int]) -> None:
        now, group, broker, original, times = arg
        if times >= MAX_RECONSUME:
            self._copy((now, group, broker, original, times + 1))
        else:
            self._schedule((now, group, broker, original, times + 1))

    def _schedule(self, arg: tuple[int, str, str, Original, int]) -> None:
        """The send-back of a message failed `times` - 1 times before, waiting for the delay of its level."""
        now, group, broker, original, times = arg
        level = 3 + times - 1  # level 3 + the reconsume times it was consumed with; levels count from 1
        if self._store_copy(now, broker, SCHEDULE_TOPIC, level - 1, group, "scheduled", original, times) is None:
            self.at(now + 1000, self._schedule, (now + 1000, group, broker, original, times))
            return
        later = now + DELAY_LEVELS_MS[level - 1]
        self.at(later, self._copy, (later, group, broker, original, times))

    def _copy(self, arg: tuple[int, str, str, Original, int]) -> None:
        now, group, broker, original, times = arg
        dead = times > MAX_RECONSUME
        topic = (DLQ_PREFIX if dead else RETRY_PREFIX) + group
        offset = self._store_copy(now, broker, topic, 0, group, "dead_letter" if dead else "retry", original, times)
        if offset is None:
            self.at(now + 1000, self._copy, (now + 1000, group, broker, original, times))
            return
        o = original
        if dead:
            self.truth({"anomaly_type": "DEAD_LETTERED", "reason": None, "broker_name": broker,
                        "consumer_group": group, "topic": o.topic, "queue_id": o.queue_id, "event_ts": now,
                        "uniq_key": o.uniq_key, "detail": {"dlq_queue_offset": offset, "reconsume_times": times,
                                                           "transaction_id": o.transaction_id}})  # fmt: skip
        else:
            self.attempt(group, original.uniq_key, times)  # consumed as soon as it is stored, and failed
            self._failed((now, group, broker, original, times))

    def _store_copy(self, now: int, broker: str, topic: str, queue_id: int, group: str, kind: str, o: Original,
                    times: int) -> int | None:  # fmt: skip
        """Store and emit one copy; its queue offset, or None while the broker is down."""
        phys = self.store(broker, 300)
        if phys is None:
            return None
        offset = self.next_offset.get((broker, topic, queue_id), 0)
        self.next_offset[(broker, topic, queue_id)] = offset + 1
        # COPY field order (schemas/landing.py); retry and DLQ topics have one queue here, the schedule topic
        # one per delay level.
        self.emit((broker, topic, queue_id, offset, phys, now, o.born_ts, group, kind, o.topic, o.message_id,
                   o.uniq_key, times, o.transactional, o.transaction_id, o.tags, o.keys), now)  # fmt: skip
        return offset
