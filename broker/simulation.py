"""The discrete-event core: the scheduler that wires the model's actors (producers.py, store.py, checks.py,
consumers.py, retries.py) and writes the ground truth as transactions settle.

Deterministic by construction: virtual time only, one event queue ordered by (time, priority,
sequence), one seeded `random.Random` (and one of its own for consumer-group incidents), and every set
iterated in sorted order. Records go to a `Sink` as plain tuples in landing-schema field order (None for an
absent optional field); the ground truth is derived from the model's own state.
"""

from __future__ import annotations

import heapq
import itertools
import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.checks import CheckService
from broker.cluster import Cluster
from broker.consumers import Consumers
from broker.events import P_CONTROL, P_END, P_FLUSH, P_OP, P_PASS, P_STORE
from broker.groups import MQ
from broker.producers import Producers
from broker.profiles import BrokerSettings, Profile
from broker.retries import SendBack
from broker.state import BrokerState, Txn
from broker.store import Store
from broker.topology import BROKERS, START_MS, TOPICS
from broker.trace import Tracer
from broker.truth import Thresholds, classify
from schemas.landing import LANDING


class Sink(Protocol):
    """Where records go: landing records and truth transactions as tuples in their schema's field
    order (schemas/landing.py, schemas/truth.py), truth anomalies as dicts."""

    def record(self, stream: str, rec: tuple[Any, ...]) -> None: ...
    def truth_transaction(self, rec: tuple[Any, ...]) -> None: ...
    def truth_anomaly(self, rec: dict[str, Any]) -> None: ...


@dataclass
class Summary:
    seed: int
    profile: str
    transactions: int
    as_of: int = 0
    records: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LANDING, 0))
    states: dict[str, int] = field(default_factory=dict)
    anomalies: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)


def simulate(
    transactions: int,
    seed: int,
    profile: Profile,
    sink: Sink,
    broker: BrokerSettings | None = None,
    thresholds: Thresholds | None = None,
    progress: Callable[[int], None] | None = None,
) -> Summary:
    """Run the model for `transactions` transactions and return what it wrote."""
    if transactions < 0:
        raise ValueError(f"transactions must not be negative, got {transactions}")
    sim = Simulation(
        transactions, seed, profile, sink, broker or BrokerSettings(), thresholds or Thresholds(), progress
    )
    return sim.run()


class Simulation:
    def __init__(self, n: int, seed: int, profile: Profile, sink: Sink, settings: BrokerSettings,
                 thresholds: Thresholds, progress: Callable[[int], None] | None) -> None:  # fmt: skip
        self.n = n
        self.profile = profile
        self.sink = sink
        self.cfg = settings
        self.thresholds = thresholds
        self.progress = progress
        self.rng = random.Random(seed)
        # Consumer-group incidents draw from their own stream, so adding them leaves the other draws alone; so do
        # lost check requests.
        self.crng = random.Random(seed + 0x5EED)
        self.check_rng = random.Random(seed + 0xC4EC)
        self.summary = Summary(seed, profile.name, n)
        self.now = START_MS
        self.queue: list[tuple[int, int, int, Callable[[Any], object], Any]] = []
        self.seq = itertools.count()
        self.done = False
        self.sent = 0
        self.brokers = {spec.name: BrokerState(spec) for spec in BROKERS}
        self.open: dict[str, Txn] = {}  # unsettled transactions by UNIQ_KEY, in send order
        self.reserved_ms = settings.file_reserved_hours * 3_600_000
        self.topic_names = sorted(TOPICS)
        self.mq_all: dict[str, list[MQ]] = {
            t: [(t, b, q) for b in self.brokers for q in range(n_q)] for t, n_q in TOPICS.items()
        }
        for b in self.brokers.values():
            for topic, n_q in TOPICS.items():
                for q in range(n_q):
                    b.real_next[(topic, q)] = 0
                    b.real_store_ts[(topic, q)] = array("q")
                    b.real_tags[(topic, q)] = []
        self.client_n = itertools.count(1)
        self.store = Store(self)
        self.checks = CheckService(self)
        self.producers = Producers(self)
        self.consumers = Consumers(self)
        self.cluster = Cluster(self, seed)
        self.tracer = Tracer(self, seed)
        self.sendback = SendBack(
            profile.poison_ratio,
            lambda t, fn, arg: self.at(t, P_STORE, fn, arg),
            self.store.phys_if_up,
            lambda rec, ts: self.emit("copy", rec, ts),
            self.truth_anomaly,
            self.tracer.retry,
        )

    # ---- event queue ---------------------------------------------------------------------------

    def at(self, when: int, prio: int, fn: Callable[[Any], object], arg: Any = None) -> None:
        heapq.heappush(self.queue, (when, prio, next(self.seq), fn, arg))

    def run(self) -> Summary:
        self._schedule_start()
        q = self.queue
        while q and not self.done:
            when, _, _, fn, arg = heapq.heappop(q)
            self.now = when
            fn(arg)
        self._close()
        return self.summary

    def _schedule_start(self) -> None:
        cfg, p, rng, crng = self.cfg, self.profile, self.rng, self.crng
        for i, b in enumerate(self.brokers.values()):
            self.at(START_MS + cfg.check_interval_ms + i * 7, P_PASS, self.checks.check_pass, b)
            self.at(START_MS + cfg.offset_flush_interval_ms + i * 3, P_FLUSH, self.checks.flush_progress, b)
            if b.batched_ops:
                self.at(START_MS + cfg.op_batch_interval_ms, P_OP, self.store.op_tick, b)
        self.consumers.start()
        if self.n == 0:
            self.at(START_MS, P_END, self.end)
            return
        self.at(START_MS, P_STORE, self.producers.arrive)
        window = int(self.n / p.txn_per_second * 1000)
        span = (START_MS + 30_000, START_MS + max(60_000, window))
        self.cluster.start(span)

        def when() -> int:
            return rng.randint(*span)

        producers, store, consumers = self.producers, self.store, self.consumers
        instances = [pr for group in producers.groups.values() for pr in group]
        for pr in rng.sample(instances, min(p.skewed_producers, len(instances))):
            pr.skew_ms = -(self.reserved_ms + rng.randint(3_600_000, 5 * 3_600_000))
        groups, brokers = sorted(producers.groups), sorted(self.brokers)
        for _ in range(p.producer_group_offline):
            self.at(when(), P_CONTROL, producers.group_offline, rng.choice(groups))
        for _ in range(p.broker_crash):
            self.at(when(), P_CONTROL, store.crash_soon, rng.choice(brokers))
        for _ in range(p.check_outage):  # its own random stream: the other draws stay as they were
            self.at(self.check_rng.randint(*span), P_CONTROL, producers.check_outage)
        for _ in range(p.check_stall):
            self.at(when(), P_CONTROL, self.checks.stall, rng.choice(brokers))
        for _ in range(p.op_stall):
            self.at(when(), P_CONTROL, store.op_stall, rng.choice(brokers))
        consumer_groups = sorted(consumers.members)
        for _ in range(p.consumer_crash):
            self.at(when(), P_CONTROL, consumers.crash, rng.choice(consumer_groups))
        for _ in range(p.consumer_scale):
            self.at(when(), P_CONTROL, consumers.scale, rng.choice(consumer_groups))
        for _ in range(p.offset_reset):
            self.at(when(), P_CONTROL, consumers.offset_reset, rng.choice(consumer_groups))
        incidents = ((p.offset_skip, consumers.offset_skip), (p.subscription_drift, consumers.subscription_drift),
                     (p.stale_client_list, consumers.stale_client_list))  # fmt: skip
        for count, fn in incidents:
            for _ in range(count):
                self.at(crng.randint(*span), P_CONTROL, fn, crng.choice(consumer_groups))
        # A tag drift starts in the first half of the traffic, so it has messages to lose while it lasts.
        early = (START_MS + 10_000, START_MS + max(20_000, window // 2))
        for _ in range(p.tag_drift):
            self.at(crng.randint(*early), P_CONTROL, consumers.tag_drift, crng.choice(consumer_groups))

    def fault(self, txn: Txn | None, name: str) -> None:
        self.summary.faults[name] = self.summary.faults.get(name, 0) + 1
        if txn is not None:
            txn.faults.append(name)

    def emit(self, stream: str, rec: tuple[Any, ...], ts: int) -> None:
        self.sink.record(stream, rec)
        self.cluster.stored(stream, rec)
        self.summary.records[stream] += 1
        if ts > self.summary.as_of:
            self.summary.as_of = ts

    # ---- the end and the truth ------------------------------------------------------------------------

    def end(self, _: Any) -> None:
        """Graceful shutdown: consumers finish what was stored and persist every queue."""
        self.done = True
        self.consumers.finish()

    def settle(self, txn: Txn) -> None:
        """Write a transaction's truth once nothing can change it: no event of its own is pending, the
        persisted check progress is past its newest copy, and its state does not depend on as_of."""
        if (
            txn.inflight == 0
            and txn.max_copy_offset < txn.broker.flushed_progress
            and (txn.resolved_ts is not None or (txn.discard_ts is not None and not txn.commit_ts))
            and txn.uniq_key in self.open
        ):
            del self.open[txn.uniq_key]
            self._write_truth(txn, self.now)

    def _close(self) -> None:
        """Transactions still open are judged as of the largest timestamp written (DESIGN §3)."""
        as_of = self.summary.as_of
        self.consumers.watch.close()
        self.consumers.filters.close()
        for txn in list(self.open.values()):
            self._write_truth(txn, as_of)
        self.open.clear()
        self.cluster.close()
        for rec in self.tracer.truth():
            self.truth_anomaly({"broker_name": None, "topic": None, "queue_id": None, "event_ts": None} | rec)

    def _write_truth(self, txn: Txn, as_of: int) -> None:
        state, reason, anomalies = classify(txn, as_of, self.cfg, self.thresholds)
        self.summary.states[state] = self.summary.states.get(state, 0) + 1
        self.sink.truth_transaction((  # TRUTH_TRANSACTION field order (schemas/truth.py)
            txn.broker.name, txn.uniq_key, txn.group, txn.topic, txn.queue_id, txn.born_ts, state, reason,
            txn.outcome if txn.decided_at else None, len(txn.commit_ts), txn.max_check_times,
            txn.resolved_ts is not None, txn.discard_ts is not None, sorted(set(txn.faults)),
        ))  # fmt: skip
        for a in anomalies:
            detail = a.detail
            if a.anomaly_type == "DISCARDED_AFTER_MAX_CHECKS":  # what its group's trace says of its checks
                until = txn.discard_ts if txn.discard_ts is not None else txn.last_copy_ts + self.cfg.check_interval_ms
                answers, cause = self.tracer.cause(txn, txn.first_copy_ts, until)
                detail = detail | {"answers": answers, "cause": cause}
            self.truth_anomaly({
                "anomaly_type": a.anomaly_type, "reason": a.reason, "broker_name": txn.broker.name,
                "uniq_key": txn.uniq_key, "event_ts": a.event_ts, "detail": detail,
            })  # fmt: skip
        if txn.answer_lost_at is not None and txn.last_copy_ts > txn.answer_lost_at:  # and the broker checked again
            self.truth_anomaly({"anomaly_type": "CHECK_ANSWER_LOST", "reason": None, "broker_name": txn.broker.name,
                                "uniq_key": txn.uniq_key, "event_ts": txn.answer_lost_at, "detail": {}})  # fmt: skip

    def truth_anomaly(self, rec: dict[str, Any]) -> None:
        kind = rec["anomaly_type"]
        self.summary.anomalies[kind] = self.summary.anomalies.get(kind, 0) + 1
        self.sink.truth_anomaly(rec)
