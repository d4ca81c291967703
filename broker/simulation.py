"""The discrete-event core: producers, brokers with their check service, consumers, and faults.

Deterministic by construction: virtual time only, one event queue ordered by (time, priority,
sequence), one seeded `random.Random`, and every set iterated in sorted order. Records go to a
`Sink` as plain tuples in landing-schema field order (None for an absent optional field); the
ground truth is derived from the model's own state as transactions settle.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.groups import SNAPSHOT_MS, GroupWatch, Member
from broker.profiles import BrokerSettings, Profile
from broker.rebalance import allocate
from broker.retries import SendBack
from broker.state import BrokerState, Consumer, HalfEntry, Producer, Txn
from broker.topology import (
    BROKERS,
    CONSUMER_GROUPS,
    DISCARD_TOPIC,
    OP_TAG,
    PRODUCER_GROUPS,
    START_MS,
    SYS_FLAG_COMMIT,
    TOPICS,
    ConsumerGroupSpec,
    client_id,
    client_ip,
    uniq_key,
    uniq_key_prefix,
)
from broker.truth import Thresholds, classify
from schemas.landing import LANDING

# Event priorities at one instant: incidents, then stores, op flushes, check passes, consumers, bookkeeping,
# and last the group snapshots, so a snapshot sees everything stored or committed at its millisecond.
P_CONTROL, P_STORE, P_OP, P_PASS, P_CONSUMER, P_FLUSH, P_SNAPSHOT, P_END = range(8)
REBALANCE_INTERVAL_MS = 20_000  # rocketmq.client.rebalance.waitInterval (reference §2.3)
HEARTBEAT_MS = 30_000  # heartbeatBrokerInterval (§2.1)
PERSIST_INTERVAL_MS = 5_000  # persistConsumerOffsetInterval (§3.2)
NET_MS = 2  # one network hop
MQ = tuple[str, str, int]


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


def _transaction_id(b: BrokerState, txn: Txn) -> str | None:
    """__transactionId__ as the broker stores it: the UNIQ_KEY from 5.1.0 (RIP-50, which came with batched
    ops), nothing before (a 4.9.7 broker writes none)."""
    return txn.uniq_key if b.batched_ops else None


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
        # Consumer-group incidents draw from their own stream, so adding them leaves the other draws alone.
        self.crng = random.Random(seed + 0x5EED)
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
        self.client_n = itertools.count(1)
        self.producers: dict[str, list[Producer]] = {
            g.name: [self._new_producer(g.name) for _ in range(g.instances)] for g in PRODUCER_GROUPS
        }
        self.check_rr = dict.fromkeys(self.producers, 0)
        self._refresh_senders()
        self.consumer_specs = {g.name: g for g in CONSUMER_GROUPS}
        self.members: dict[str, list[Consumer]] = {
            g.name: [self._new_consumer(g.name) for _ in range(g.members)] for g in CONSUMER_GROUPS
        }
        # The topic set of each group's broker subscription table: the last heartbeat's (reference §2.1).
        self.sub_table = {g.name: g.topics for g in CONSUMER_GROUPS}
        self.moved: dict[tuple[str, MQ], tuple[str, int]] = {}  # a queue's last holder and its memory offset
        self.watch = GroupWatch(lambda rec, ts: self._emit("consumer", rec, ts), self._truth_anomaly,
                                thresholds.stranded_after_ms)  # fmt: skip
        self.sendback = SendBack(
            profile.poison_ratio,
            lambda t, fn, arg: self.at(t, P_STORE, fn, arg),
            self._phys_if_up,
            lambda rec, ts: self._emit("copy", rec, ts),
            self._truth_anomaly,
        )
        # Cumulative thresholds for the mutually exclusive producer-side faults of one transaction.
        p = profile
        self.fault_cuts = list(itertools.accumulate(
            [p.producer_crash, p.never_decided, p.unknown_answer, p.slow_local_txn]))  # fmt: skip

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
        cfg, p, rng = self.cfg, self.profile, self.rng
        for i, b in enumerate(self.brokers.values()):
            self.at(START_MS + cfg.check_interval_ms + i * 7, P_PASS, self._check_pass, b)
            self.at(START_MS + cfg.offset_flush_interval_ms + i * 3, P_FLUSH, self._flush_progress, b)
            if b.batched_ops:
                self.at(START_MS + cfg.op_batch_interval_ms, P_OP, self._op_tick, b)
        for group, members in self.members.items():
            self.at(START_MS, P_CONSUMER, self._rebalance_tick, group)
            for c in members:
                self.at(START_MS + rng.randrange(PERSIST_INTERVAL_MS), P_CONSUMER, self._consumer_tick, c)
                self.at(START_MS + self.crng.randrange(HEARTBEAT_MS), P_CONSUMER, self._heartbeat, c)
        self.at(START_MS + SNAPSHOT_MS, P_SNAPSHOT, self._snapshot)
        if self.n == 0:
            self.at(START_MS, P_END, self._end)
            return
        self.at(START_MS, P_STORE, self._arrive)
        window = int(self.n / p.txn_per_second * 1000)
        span = (START_MS + 30_000, START_MS + max(60_000, window))

        def when() -> int:
            return rng.randint(*span)

        instances = [pr for group in self.producers.values() for pr in group]
        for pr in rng.sample(instances, min(p.skewed_producers, len(instances))):
            pr.skew_ms = -(self.reserved_ms + rng.randint(3_600_000, 5 * 3_600_000))
        for _ in range(p.producer_group_offline):
            self.at(when(), P_CONTROL, self._group_offline, rng.choice(sorted(self.producers)))
        for _ in range(p.broker_crash):
            self.at(when(), P_CONTROL, self._crash_soon, rng.choice(sorted(self.brokers)))
        for _ in range(p.check_stall):
            self.at(when(), P_CONTROL, self._stall, rng.choice(sorted(self.brokers)))
        for _ in range(p.op_stall):
            self.at(when(), P_CONTROL, self._op_stall, rng.choice(sorted(self.brokers)))
        for _ in range(p.consumer_crash):
            self.at(when(), P_CONTROL, self._consumer_crash, rng.choice(sorted(self.members)))
        for _ in range(p.consumer_scale):
            self.at(when(), P_CONTROL, self._consumer_scale, rng.choice(sorted(self.members)))
        for _ in range(p.offset_reset):
            self.at(when(), P_CONTROL, self._offset_reset, rng.choice(sorted(self.members)))
        crng = self.crng
        for count, fn in ((p.offset_skip, self._offset_skip), (p.subscription_drift, self._subscription_drift),
                          (p.stale_client_list, self._stale_client_list)):  # fmt: skip
            for _ in range(count):
                self.at(crng.randint(*span), P_CONTROL, fn, crng.choice(sorted(self.members)))

    def _fault(self, txn: Txn | None, name: str) -> None:
        self.summary.faults[name] = self.summary.faults.get(name, 0) + 1
        if txn is not None:
            txn.faults.append(name)

    # ---- producers -------------------------------------------------------------------------------

    def _new_producer(self, group: str) -> Producer:
        n = next(self.client_n)
        ip, pid = client_ip(n), 1000 + n
        return Producer(group, client_id(ip, pid, n * 7919), uniq_key_prefix(ip, pid, self.rng.getrandbits(32)))

    def _refresh_senders(self) -> None:
        """Recompute who can send after a producer or broker went down or came back."""
        self.up_brokers = [b for b in self.brokers.values() if b.up]
        self.alive = {g: [pr for pr in prs if pr.alive] for g, prs in self.producers.items()}
        self.sending_groups = [g for g in PRODUCER_GROUPS if self.alive[g.name]]
        self.group_cuts = list(itertools.accumulate(g.weight for g in self.sending_groups))

    def _arrive(self, _: Any) -> None:
        rng, p = self.rng, self.profile
        up, groups = self.up_brokers, self.sending_groups
        if not up or not groups:  # nobody can send: the business request waits a second
            self.at(self.now + 1000, P_STORE, self._arrive)
            return
        group = groups[bisect.bisect(self.group_cuts, rng.random() * self.group_cuts[-1])]
        alive = self.alive[group.name]
        producer = alive[int(rng.random() * len(alive))]
        self._send_transaction(group.name, group.topic, producer, up[int(rng.random() * len(up))])
        if rng.random() < p.plain_ratio:
            topic = self.topic_names[int(rng.random() * len(self.topic_names))]
            b = up[int(rng.random() * len(up))]
            self._store_real(b, topic, int(rng.random() * TOPICS[topic]), None, producer)
        self.sent += 1
        if self.progress and self.sent % 50_000 == 0:
            self.progress(self.sent)
        if self.sent < self.n:
            self.at(self.now + int(rng.expovariate(p.txn_per_second) * 1000), P_STORE, self._arrive)
        else:
            self.at(self.now + p.drain_ms, P_END, self._end)

    def _send_transaction(self, group: str, topic: str, producer: Producer, b: BrokerState) -> None:
        """sendMessageInTransaction (reference §1.2): half stored, local transaction, one-way end."""
        rng, p = self.rng, self.profile
        born = self.now + producer.skew_ms
        key = uniq_key(producer.key_prefix, born, producer.counter)
        producer.counter += 1
        outcome = "COMMIT" if rng.random() < p.commit_ratio else "ROLLBACK"
        body_size = 100 + int(rng.random() * 1900)
        txn = Txn(b, key, group, topic, int(rng.random() * TOPICS[topic]), born, body_size, outcome)
        if producer.skew_ms:
            self._fault(txn, "skewed_clock")
        if p.immunity_ratio and rng.random() < p.immunity_ratio:
            txn.immunity_s = rng.choice((30, 60, 120))
            self._fault(txn, "immunity")
        if p.unaware_checker and rng.random() < p.unaware_checker:
            txn.unaware_checker = True
            self._fault(txn, "unaware_checker")
        self.open[key] = txn
        original = self._store_half(b, txn, None, None)
        exec_ms = 5 + int(rng.random() * 195)
        txn.decided_at = self.now + exec_ms
        r = rng.random()
        crash, never, unknown, slow = self.fault_cuts
        if r >= slow:  # the common case: the local transaction ends and the producer says so
            self._later(txn, self.now + exec_ms, self._local_done, (txn, producer, original))
        elif r < crash:  # the instance dies before it can end the transaction; others answer checks
            self._fault(txn, "producer_crash")
            producer.alive = False
            self._refresh_senders()
            self.at(self.now + rng.randint(3_000, 10_000), P_CONTROL, self._producer_restart, producer)
        elif r < never:  # UNKNOW now, and the state never becomes known
            self._fault(txn, "never_decided")
            txn.decided_at = None
        elif r < unknown:  # UNKNOW now (no end request); the state is known a little later
            self._fault(txn, "unknown_answer")
            txn.decided_at = self.now + exec_ms + rng.randint(1_000, 90_000)
        else:  # a slow local transaction that commits minutes later (issue #8158)
            self._fault(txn, "slow_local_txn")
            txn.outcome = "COMMIT"
            txn.decided_at = self.now + rng.randint(480_000, 720_000)
            self._later(txn, txn.decided_at, self._local_done, (txn, producer, original))

    def _later(self, txn: Txn, when: int, fn: Callable[[Any], object], arg: Any) -> None:
        txn.inflight += 1
        self.at(when, P_STORE, fn, arg)

    def _local_done(self, arg: tuple[Txn, Producer, HalfEntry]) -> None:
        txn, producer, original = arg
        txn.inflight -= 1
        if producer.alive:
            self._send_end(txn, original, txn.outcome, from_check=False)
            if self.profile.duplicate_end and self.rng.random() < self.profile.duplicate_end:
                self._fault(txn, "duplicate_end")
                self._send_end(txn, original, txn.outcome, from_check=False, delay=self.rng.randint(20, 2000))
        self._maybe_settle(txn)

    def _send_end(self, txn: Txn, entry: HalfEntry, action: str, from_check: bool, delay: int = NET_MS) -> None:
        """endTransactionOneway: no response, no retry (reference §1.2); it can be lost."""
        if self.profile.lost_end and self.rng.random() < self.profile.lost_end:
            self._fault(txn, "lost_end")
            return
        self._later(txn, self.now + delay, self._end_transaction, (txn, entry, action, from_check))

    def _producer_restart(self, producer: Producer) -> None:
        producer.alive = True
        self._refresh_senders()

    def _group_offline(self, group: str) -> None:
        for pr in self.producers[group]:
            pr.alive = False
        self._refresh_senders()
        self._fault(None, "producer_group_offline")
        self.at(self.now + self.rng.randint(480_000, 600_000), P_CONTROL, self._group_online, group)

    def _group_online(self, group: str) -> None:
        for pr in self.producers[group]:
            pr.alive = True
        self._refresh_senders()

    # ---- broker: stores ---------------------------------------------------------------------------

    def _phys(self, b: BrokerState, size: int) -> int:
        phys = b.phys
        b.phys += size
        return phys

    def _phys_if_up(self, name: str, size: int) -> int | None:
        return self._phys(self.brokers[name], size) if self.brokers[name].up else None

    def _emit(self, stream: str, rec: tuple[Any, ...], ts: int) -> None:
        self.sink.record(stream, rec)
        self.summary.records[stream] += 1
        if ts > self.summary.as_of:
            self.summary.as_of = ts

    def _store_half(self, b: BrokerState, txn: Txn, check_times: int | None, prepared: int | None) -> HalfEntry:
        """Store the original or a check copy in RMQ_SYS_TRANS_HALF_TOPIC queue 0 (reference §1.3, §1.6)."""
        offset = b.half_next
        b.half_next += 1
        entry = HalfEntry(offset, txn, self.now, check_times, prepared, self._phys(b, 300 + txn.body_size))
        b.half.append(entry)
        txn.last_copy_ts = self.now
        txn.max_copy_offset = offset
        if check_times is not None and check_times > txn.max_check_times:
            txn.max_check_times = check_times
        # HALF field order (schemas/landing.py).
        rec = (
            b.name, 0, offset, entry.phys, self.now, txn.born_ts, txn.uniq_key, _transaction_id(b, txn), txn.group,
            txn.topic, txn.queue_id, check_times, txn.immunity_s, prepared, txn.tags, txn.keys, txn.body_size,
            None,  # the classic half topic (no RIP-82 in the model)
        )  # fmt: skip
        self._emit("half", rec, self.now)
        return entry

    def _store_real(self, b: BrokerState, topic: str, queue_id: int, txn: Txn | None, producer: Producer | None,
                    prepared_phys: int | None = None) -> None:  # fmt: skip
        """A message in a business topic: a committed final message, a plain message, or a discard."""
        if topic == DISCARD_TOPIC:
            offset = b.discard_next
            b.discard_next += 1
        else:
            offset = b.real_next[(topic, queue_id)]
            b.real_next[(topic, queue_id)] = offset + 1
            b.real_store_ts[(topic, queue_id)].append(self.now)
        phys = self._phys(b, 300 + (txn.body_size if txn else 200))
        # REAL field order (schemas/landing.py).
        if txn is None:  # a plain message from a producer's ordinary send
            assert producer is not None
            key = uniq_key(producer.key_prefix, self.now + producer.skew_ms, producer.counter)
            producer.counter += 1
            rec: tuple[Any, ...] = (
                b.name, topic, queue_id, offset, phys, self.now, self.now + producer.skew_ms, key, 0, False,
                None, None, None, None, None, 200, 0,
            )  # fmt: skip
        else:
            # A discarded half keeps the half's sysFlag (NOT type), a final message gets COMMIT (§1.4, §4.6);
            # both keep TRAN_MSG=true in their stored properties [inferred §1.4].
            sys_flag = 0 if topic == DISCARD_TOPIC else SYS_FLAG_COMMIT
            rec = (
                b.name, topic, queue_id, offset, phys, self.now, txn.born_ts, txn.uniq_key, sys_flag, True,
                prepared_phys, txn.group, _transaction_id(b, txn), txn.tags, txn.keys, txn.body_size, 0,
            )  # fmt: skip
        self._emit("real", rec, self.now)
        self.sendback.stored(rec)

    def _end_transaction(self, arg: tuple[Txn, HalfEntry, str, bool]) -> None:
        """EndTransactionProcessor (reference §1.4): no idempotency check; commit = final, then op."""
        txn, entry, action, from_check = arg
        txn.inflight -= 1
        b = txn.broker
        if not b.up:
            self._fault(txn, "end_to_down_broker")
        elif (
            txn.immunity_s is not None
            and not from_check
            and self.now - txn.born_ts > max(txn.immunity_s * 1000, self.cfg.transaction_timeout_ms)
        ):
            self._fault(txn, "late_end_rejected")  # rejectCommitOrRollback: ILLEGAL_OPERATION (604)
        else:
            if action == "COMMIT":
                self._store_real(b, txn.topic, txn.queue_id, txn, None, prepared_phys=entry.phys)
                txn.commit_ts.append(self.now)
                if b.crash_pending:  # the process dies between the final write and the op write (§1.7)
                    self._fault(txn, "op_lost_in_crash")
                    self._crash(b)
                    self._maybe_settle(txn)
                    return
            if b.batched_ops and len(b.op_ctx) < self.cfg.op_context_capacity:
                b.op_ctx.append((entry.offset, txn))
                b.op_ctx_chars += len(str(entry.offset)) + 1
                txn.inflight += 1
                if b.op_ctx_chars > self.cfg.op_msg_max_size and not self._op_stalled(b):
                    self._flush_ops(b)
            elif b.batched_ops:  # the context is full: the offer times out and the request writes its own op
                self._write_op_message(b, [(entry.offset, txn)])
            else:
                self._store_op(b, [(entry.offset, txn)], str(entry.offset))
        self._maybe_settle(txn)

    def _store_op(self, b: BrokerState, items: list[tuple[int, Txn]], body: str) -> None:
        """An op message in RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0, tag "d" (reference §1.5)."""
        offset = b.op_next
        b.op_next += 1
        # OP field order (schemas/landing.py).
        rec = (b.name, 0, offset, self._phys(b, 200 + len(body)), self.now, self.now, OP_TAG, body, None)
        self._emit("op", rec, self.now)
        for half_offset, txn in items:
            txn.op_offsets.add(half_offset)
            if txn.resolved_ts is None:
                txn.resolved_ts = self.now

    def _op_tick(self, b: BrokerState) -> None:
        """TransactionalOpBatchService: flush when over size or an interval after the last op write."""
        self.at(self.now + self.cfg.op_batch_interval_ms, P_OP, self._op_tick, b)
        if (
            b.up
            and b.op_ctx
            and self.now - b.op_last_flush >= self.cfg.op_batch_interval_ms
            and not self._op_stalled(b)
        ):
            self._flush_ops(b)

    def _op_stalled(self, b: BrokerState) -> bool:
        return self.now < b.op_stalled_until

    def _op_stall(self, name: str) -> None:
        """The op batch service writes nothing for a while (a busy store, issue #9500's backlog): the check
        service then finds committed and rolled-back transactions without their op, and checks them."""
        b = self.brokers[name]
        b.op_stalled_until = self.now + self.rng.randint(30_000, 90_000)
        self._fault(None, "op_stall")

    def _flush_ops(self, b: BrokerState) -> None:
        """batchSendOpMessage: one op message per pass; while the context still holds op_msg_max_size
        characters the service passes again at once, and a smaller rest waits for the next interval."""
        self._write_op_message(b, [])
        while b.op_ctx_chars >= self.cfg.op_msg_max_size:
            self._write_op_message(b, [])

    def _write_op_message(self, b: BrokerState, own: list[tuple[int, Txn]]) -> None:
        """getOpMessage: one op message of `own` entries (a forced write's; none for the batch service) and
        entries taken from the context in order until the body reaches op_msg_max_size characters."""
        body, taken = "".join(f"{offset}," for offset, _ in own), 0
        while taken < len(b.op_ctx) and len(body) < self.cfg.op_msg_max_size:
            body += f"{b.op_ctx[taken][0]},"
            taken += 1
        if not body:
            return
        drained = b.op_ctx[:taken]
        del b.op_ctx[:taken]
        b.op_ctx_chars -= sum(len(str(offset)) + 1 for offset, _ in drained)
        b.op_last_flush = self.now
        self._store_op(b, own + drained, body)
        for _, txn in drained:
            txn.inflight -= 1
            self._maybe_settle(txn)

    # ---- broker: the check service ----------------------------------------------------------------

    def _check_pass(self, b: BrokerState) -> None:
        """One pass of TransactionalMessageServiceImpl.check over half queue 0 (reference §1.6).

        Ops are applied as they are stored, so the pass sees every op written before it (the
        removeMap after pulling all op messages). Like the broker it walks strictly in offset order
        and stops at the first message that is too young or was stored during this pass. A copy is
        resolved only by an op listing its own offset: a 5.3.3 broker ignores op offsets below its
        progress, so an immunity copy is never resolved through its prepared offset (DESIGN §2).
        """
        cfg = self.cfg
        self.at(self.now + cfg.check_interval_ms, P_PASS, self._check_pass, b)
        if not b.up or self.now < b.stalled_until:
            return
        now, i = self.now, b.progress
        while True:
            entry = b.half_entry(i)
            if entry is None:
                break
            txn = entry.txn
            prepared = entry.prepared_offset
            if entry.offset in txn.op_offsets:
                i += 1  # resolved: skipped without reading
                continue
            ct = entry.check_times
            age = now - txn.born_ts
            if (ct is not None and ct >= cfg.check_max) or age > self.reserved_ms:  # needDiscard / needSkip
                self._discard(b, entry)
                i += 1
                continue
            if entry.store_ts >= now:  # stored during this pass: next pass
                break
            next_ct = 1 if ct is None else ct + 1  # needDiscard's in-memory TRANSACTION_CHECK_TIMES
            if txn.immunity_s is not None:
                immunity = txn.immunity_s * 1000  # no max() with the timeout here
                if age < immunity:  # inside the window: re-append an immunity copy, no check
                    self._store_half(b, txn, next_ct, prepared if prepared is not None else entry.offset)
                    i += 1
                    continue
            else:
                immunity = cfg.transaction_timeout_ms
                if 0 <= age < immunity:  # too young: head-of-line stop
                    break
            if age > immunity or age <= -1:
                copy = self._store_half(b, txn, next_ct, prepared)
                self._send_check(txn, copy)
                i += 1
                continue
            break
        b.progress = i

    def _discard(self, b: BrokerState, entry: HalfEntry) -> None:
        """resolveDiscardMsg: the half goes to TRANS_CHECK_MAX_TIME_TOPIC, not to its real topic."""
        txn = entry.txn
        self._store_real(b, DISCARD_TOPIC, 0, txn, None)
        if txn.discard_ts is None:
            txn.discard_ts = self.now
        self._fault(txn, "discarded")

    def _send_check(self, txn: Txn, copy: HalfEntry) -> None:
        """checkProducerTransactionState: one-way to a live channel of the group, round-robin."""
        alive = self.alive[txn.group]
        if not alive:  # only a warning; the copy is written and the check count consumed
            self._fault(txn, "no_producer_for_check")
            return
        producer = alive[self.check_rr[txn.group] % len(alive)]
        self.check_rr[txn.group] += 1
        self._later(txn, self.now + NET_MS, self._check_answer, (txn, copy, producer))

    def _check_answer(self, arg: tuple[Txn, HalfEntry, Producer]) -> None:
        """checkLocalTransaction: the business state if known by now (an application answers from its own
        table, also for a transaction it ended already), else UNKNOW, which sends nothing."""
        txn, copy, producer = arg
        txn.inflight -= 1
        known = txn.decided_at is not None and self.now >= txn.decided_at and not txn.unaware_checker
        if producer.alive and known:
            self._send_end(txn, copy, txn.outcome, from_check=True)
        self._maybe_settle(txn)

    def _flush_progress(self, b: BrokerState) -> None:
        """Persist the half progress (consumerOffset.json, every 5 s) and settle what it passed."""
        self.at(self.now + self.cfg.offset_flush_interval_ms, P_FLUSH, self._flush_progress, b)
        if not b.up:
            return
        b.flushed_progress = b.progress
        while b.half and b.half[0].offset < b.flushed_progress:
            entry = b.half.popleft()
            b.half_base += 1
            if entry.txn.max_copy_offset == entry.offset:  # its newest copy is behind us
                b.settle_queue.append(entry.txn)
        while b.settle_queue:
            self._maybe_settle(b.settle_queue.popleft())

    def _maybe_settle(self, txn: Txn) -> None:
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

    def _crash_soon(self, name: str) -> None:
        b = self.brokers[name]
        if b.up and not b.crash_pending:
            b.crash_pending = True  # it dies right after its next final-message write
            self.at(self.now + 5_000, P_CONTROL, self._crash_if_pending, b)

    def _crash_if_pending(self, b: BrokerState) -> None:
        if b.crash_pending:
            self._crash(b)

    def _crash(self, b: BrokerState) -> None:
        """A broker process crash: the unflushed op batch is lost and the check progress goes back to
        its last persisted value (reference §1.7); the broker is down for 10 s."""
        b.crash_pending = False
        b.up = False
        self._refresh_senders()
        self._fault(None, "broker_crash")
        lost, b.op_ctx, b.op_ctx_chars = b.op_ctx, [], 0
        b.progress = b.flushed_progress
        for _, txn in lost:
            txn.inflight -= 1
            self._fault(txn, "op_lost_in_crash")
            self._maybe_settle(txn)
        self.at(self.now + 10_000, P_CONTROL, self._restart, b)

    def _restart(self, b: BrokerState) -> None:
        b.up = True
        self._refresh_senders()
        b.op_last_flush = self.now

    def _stall(self, name: str) -> None:
        b = self.brokers[name]
        b.stalled_until = self.now + self.rng.randint(120_000, 240_000)
        self._fault(None, "check_stall")

    # ---- consumers ----------------------------------------------------------------------------------

    def _new_consumer(self, group: str, topics: tuple[str, ...] | None = None) -> Consumer:
        n = next(self.client_n)
        cid = client_id(client_ip(n), 2000 + n, n * 104_729 + self.now % 1_000_000)
        return Consumer(group, cid, topics or self.consumer_specs[group].topics)

    def _heartbeat(self, c: Consumer) -> None:
        """A member's heartbeat replaces its group's subscription table by its own topics (reference §2.1)."""
        if not c.alive:
            return
        self.at(self.now + HEARTBEAT_MS, P_CONSUMER, self._heartbeat, c)
        self.sub_table[c.group] = c.topics

    def _rebalance_tick(self, group: str) -> None:
        self.at(self.now + REBALANCE_INTERVAL_MS, P_CONSUMER, self._rebalance_tick, group)
        self._rebalance(group)

    def _rebalance(self, group: str) -> None:
        """Every member recomputes its queues (reference §2.3); a moved queue's old owner persists it
        on removal, then the new owner starts from the broker's stored offset."""
        spec: ConsumerGroupSpec = self.consumer_specs[group]
        members = self.members[group]
        cids = [c.client_id for c in members]
        wanted = {c.client_id: self._allocation(spec, c, c.view or cids) for c in members}
        for c in members:
            for mq in sorted(c.assigned - wanted[c.client_id]):
                late = self.rng.random() < self.profile.stale_offset_commit
                self._commit_offset(c, mq, c.memory[mq], delay=self.rng.randint(5_000, 15_000) if late else NET_MS)
                if late:
                    self._fault(None, "stale_offset_commit")
                self.moved[(group, mq)] = (c.client_id, c.memory[mq])
                self._drop(c, mq)
        for c in members:
            for mq in sorted(wanted[c.client_id] - c.assigned):
                topic, bname, qid = mq
                stored = self.brokers[bname].offsets.get((group, topic, qid))
                start = stored[0] if stored else 0  # a young queue answers 0 (reference §3.3, §3.6)
                c.assigned.add(mq)
                c.memory[mq] = start
                if (group, mq) in self.moved:
                    old, memory = self.moved.pop((group, mq))
                    self.watch.handed_off(group, mq, old, memory - start)

    def _allocation(self, spec: ConsumerGroupSpec, c: Consumer, cids: list[str] | tuple[str, ...]) -> set[MQ]:
        """Each member allocates its own topics over the client list it has (reference §2.3)."""
        return {mq for t in c.topics for mq in allocate(spec.strategy, spec.name, c.client_id, self.mq_all[t], cids)}

    def _drop(self, c: Consumer, mq: MQ) -> None:
        c.assigned.discard(mq)
        c.memory.pop(mq, None)
        c.pins.pop(mq, None)

    def _consumer_tick(self, c: Consumer) -> None:
        if not c.alive:
            return
        self.at(self.now + PERSIST_INTERVAL_MS, P_CONSUMER, self._consumer_tick, c)
        # persistAll sends what was consumed so far, every assigned queue, changed or not (§3.2); what is
        # consumed next stays in memory until the next persist, and is lost with the member if it dies.
        for mq in sorted(c.assigned):
            self._commit_offset(c, mq, c.memory[mq])
        self._consume(c, self.now - 100, pins=True)

    def _consume(self, c: Consumer, upto_ts: int, pins: bool) -> None:
        """Advance memory offsets over what was stored by `upto_ts`; a slow message pins the committed
        offset at itself until it is done (ProcessQueue.removeMessage, reference §3.1)."""
        rng, ratio = self.rng, self.profile.slow_consume_ratio
        for mq in sorted(c.assigned):
            topic, bname, qid = mq
            b = self.brokers[bname]
            if not b.up or topic not in self.sub_table[c.group]:  # a pull fails: "subscription not exist"
                continue
            target = bisect.bisect_right(b.real_store_ts[(topic, qid)], upto_ts)
            mem = c.memory[mq]
            pin = c.pins.get(mq)
            if pin is not None and (not pins or self.now >= pin[1]):
                del c.pins[mq]
                pin = None
            if pin is not None:
                target = min(target, pin[0])
            elif pins and ratio and target > mem and rng.random() < min(1.0, (target - mem) * ratio):
                slow = mem + rng.randrange(target - mem)
                c.pins[mq] = (slow, self.now + rng.randint(10_000, 60_000))
                target = slow
            if target > mem:  # increase-only update of the memory offset (§3.2)
                c.memory[mq] = target
                self.sendback.consumed(self.now, c.group, mq, mem, target)

    def _commit_offset(self, c: Consumer | None, mq: MQ, offset: int, delay: int = NET_MS) -> None:
        client = c.client_id if c is not None else None
        self.at(self.now + delay, P_STORE, self._accept_offset, (c.group if c else "", mq, offset, client))

    def _accept_offset(self, arg: tuple[str, MQ, int, str | None]) -> None:
        group, (topic, bname, qid), offset, client = arg
        b = self.brokers[bname]
        if not b.up:
            return  # one-way update to a dead broker: lost
        self._store_offset(b, group, topic, qid, offset, client)

    def _store_offset(self, b: BrokerState, group: str, topic: str, qid: int, offset: int, client: str | None) -> None:
        """ConsumerOffsetManager.commitOffset: an unconditional overwrite (reference §3.3)."""
        b.offset_seq += 1
        rec = (b.name, group, topic, qid, offset, self.now, client, b.offset_seq)  # OFFSET field order
        self._emit("offset", rec, self.now)
        key = (group, topic, qid)
        before = b.offsets.get(key)
        if before is not None and offset > before[0] and client is None and before[1] is not None:
            self._truth_anomaly({
                "anomaly_type": "OFFSET_JUMP", "reason": None, "broker_name": b.name, "consumer_group": group,
                "topic": topic, "queue_id": qid, "commit_timestamp": self.now, "seq": b.offset_seq,
                "event_ts": self.now, "detail": {"from_offset": before[0], "to_offset": offset,
                                                 "skipped": offset - before[0], "client_before": before[1]},
            })  # fmt: skip
        if before is not None and offset < before[0]:
            real = b.real_store_ts[(topic, qid)]
            self._truth_anomaly({
                "anomaly_type": "OFFSET_REGRESSION", "reason": None, "broker_name": b.name,
                "consumer_group": group, "topic": topic, "queue_id": qid,
                "commit_timestamp": self.now, "seq": b.offset_seq, "event_ts": self.now,
                "detail": {"from_offset": before[0], "to_offset": offset, "rewind": before[0] - offset,
                           "client_before": before[1], "client_after": client,
                           "redelivery_estimate": min(before[0], len(real)) - offset},
            })  # fmt: skip
        b.offsets[key] = (offset, client)

    def _consumer_crash(self, group: str) -> None:
        """A consumer dies: progress since its last persist is lost; the others take its queues."""
        members = self.members[group]
        if len(members) < 2:
            return
        victim = members[self.rng.randrange(len(members))]
        victim.alive = False
        members.remove(victim)
        for mq in sorted(victim.assigned):  # what it had consumed dies with it
            self.moved[(group, mq)] = (victim.client_id, victim.memory[mq])
        self._fault(None, "consumer_crash")
        self._rebalance(group)
        self.at(self.now + 30_000, P_CONTROL, self._consumer_join, group)

    def _consumer_join(self, group: str, topics: tuple[str, ...] | None = None) -> Consumer:
        c = self._new_consumer(group, topics)
        self.members[group].append(c)
        self.sub_table[group] = c.topics  # its registration is a heartbeat
        self._rebalance(group)
        self.at(self.now + self.rng.randrange(PERSIST_INTERVAL_MS), P_CONSUMER, self._consumer_tick, c)
        self.at(self.now + HEARTBEAT_MS, P_CONSUMER, self._heartbeat, c)
        return c

    def _leave(self, c: Consumer) -> None:
        """A graceful shutdown: persist every held queue, then leave the group."""
        if not c.alive:
            return
        for mq in sorted(c.assigned):
            self._commit_offset(c, mq, c.memory[mq])
            self.moved[(c.group, mq)] = (c.client_id, c.memory[mq])
        c.alive = False
        self.members[c.group].remove(c)
        self._rebalance(c.group)

    def _subscription_drift(self, group: str) -> None:
        """A member deployed with other subscriptions (the classic mistake, reference §2.2): one topic fewer,
        or for a one-topic group another topic instead. It leaves again 3-6 minutes later."""
        topics = self.consumer_specs[group].topics
        others = [t for t in self.topic_names if t not in topics]
        drifted = topics[:-1] if len(topics) > 1 else (self.crng.choice(others),)
        self._fault(None, "subscription_drift")
        c = self._consumer_join(group, drifted)
        self.at(self.now + self.crng.randint(180_000, 360_000), P_CONTROL, self._leave, c)

    def _stale_client_list(self, group: str) -> None:
        """One member allocates over a client list that misses another member (it asked a broker the other
        had not reached yet), for 90-180 s: queues may be held twice or by nobody."""
        members = self.members[group]
        if len(members) < 2:
            return
        c = members[self.crng.randrange(len(members))]
        missing = self.crng.choice([m.client_id for m in members if m is not c])
        c.view = tuple(m.client_id for m in members if m.client_id != missing)
        self._fault(None, "stale_client_list")
        self._rebalance(group)
        self.at(self.now + self.crng.randint(90_000, 180_000), P_CONTROL, self._fresh_client_list, c)

    def _fresh_client_list(self, c: Consumer) -> None:
        c.view = None
        if c.alive:
            self._rebalance(c.group)

    def _offset_skip(self, group: str) -> None:
        """An admin resets one topic of a group to its end (skipping a backlog): an OFFSET_JUMP wherever
        that moves the committed offset forward."""
        topic = self.crng.choice(self.consumer_specs[group].topics)
        self._fault(None, "offset_skip")
        for mq in self.mq_all[topic]:
            _, bname, qid = mq
            b = self.brokers[bname]
            end, current = b.real_next[(topic, qid)], b.offsets.get((group, topic, qid))
            if not b.up or current is None or end <= current[0]:
                continue
            self._store_offset(b, group, topic, qid, end, None)
            for c in self.members[group]:
                if mq in c.assigned:
                    c.memory[mq] = end
                    c.pins.pop(mq, None)

    def _snapshot(self, _: Any) -> None:
        """What `txn-recon collect` reads of every group with members (the brokers that are up answer)."""
        self.at(self.now + SNAPSHOT_MS, P_SNAPSHOT, self._snapshot)
        up = [b.name for b in self.brokers.values() if b.up]
        for group in sorted(self.members):
            members = self.members[group]
            if not members or not up:
                continue
            self.watch.snapshot(
                self.now, group,
                [Member(c.client_id, c.topics, {mq: c.memory[mq] for mq in c.assigned}) for c in members],
                dict.fromkeys(up, self.sub_table[group]),
                committed=functools.partial(self._committed, group),
                end=self._stored,
                queues=lambda t: self.mq_all[t],
            )  # fmt: skip

    def _stored(self, mq: MQ) -> int:
        return self.brokers[mq[1]].real_next[(mq[0], mq[2])]

    def _committed(self, group: str, mq: MQ) -> int | None:
        stored = self.brokers[mq[1]].offsets.get((group, mq[0], mq[2]))
        return None if stored is None else stored[0]

    def _consumer_scale(self, group: str) -> None:
        """A graceful scale-in (persist everything, then leave) or scale-out."""
        members = self.members[group]
        self._fault(None, "consumer_scale")
        if len(members) > 1 and self.rng.random() < 0.5:
            self._leave(members[-1])
        else:
            self._consumer_join(group)

    def _offset_reset(self, group: str) -> None:
        """An admin resets one topic of a group back in time (reference §3.5): the broker's table is
        overwritten where the target is smaller, and the owners restart from it."""
        spec = self.consumer_specs[group]
        topic = self.rng.choice(spec.topics)
        since = self.now - self.rng.randint(60_000, 180_000)
        self._fault(None, "offset_reset")
        for mq in self.mq_all[topic]:
            _, bname, qid = mq
            b = self.brokers[bname]
            target = bisect.bisect_left(b.real_store_ts[(topic, qid)], since)
            current = b.offsets.get((group, topic, qid))
            if not b.up or current is None or target >= current[0]:
                continue
            self._store_offset(b, group, topic, qid, target, None)
            for c in self.members[group]:
                if mq in c.assigned:
                    c.memory[mq] = target  # updateOffset(increaseOnly=false)
                    c.pins.pop(mq, None)

    # ---- the end --------------------------------------------------------------------------------------

    def _end(self, _: Any) -> None:
        """Graceful shutdown: consumers finish what was stored and persist every queue."""
        self.done = True
        for group in sorted(self.members):
            for c in self.members[group]:
                self._consume(c, self.now, pins=False)
                for mq in sorted(c.assigned):
                    topic, bname, qid = mq
                    if self.brokers[bname].up:
                        self._store_offset(self.brokers[bname], group, topic, qid, c.memory[mq], c.client_id)

    def _close(self) -> None:
        """Transactions still open are judged as of the largest timestamp written (DESIGN §3)."""
        as_of = self.summary.as_of
        self.watch.close()
        for txn in list(self.open.values()):
            self._write_truth(txn, as_of)
        self.open.clear()

    def _write_truth(self, txn: Txn, as_of: int) -> None:
        state, reason, anomalies = classify(txn, as_of, self.cfg, self.thresholds)
        self.summary.states[state] = self.summary.states.get(state, 0) + 1
        self.sink.truth_transaction((  # TRUTH_TRANSACTION field order (schemas/truth.py)
            txn.broker.name, txn.uniq_key, txn.group, txn.topic, txn.queue_id, txn.born_ts, state, reason,
            txn.outcome if txn.decided_at else None, len(txn.commit_ts), txn.max_check_times,
            txn.resolved_ts is not None, txn.discard_ts is not None, sorted(set(txn.faults)),
        ))  # fmt: skip
        for a in anomalies:
            self._truth_anomaly({
                "anomaly_type": a.anomaly_type, "reason": a.reason, "broker_name": txn.broker.name,
                "uniq_key": txn.uniq_key, "event_ts": a.event_ts, "detail": a.detail,
            })  # fmt: skip

    def _truth_anomaly(self, rec: dict[str, Any]) -> None:
        kind = rec["anomaly_type"]
        self.summary.anomalies[kind] = self.summary.anomalies.get(kind, 0) + 1
        self.sink.truth_anomaly(rec)
