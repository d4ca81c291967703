"""The producers: business requests arrive, each sends a transaction (half, local transaction, one-way end,
reference §1.2), answers the broker's checks, and crashes or goes offline as the profile says."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.events import NET_MS, P_CONTROL, P_END, P_STORE
from broker.state import BrokerState, HalfEntry, Producer, Txn
from broker.topology import PRODUCER_GROUPS, TOPICS, client_id, client_ip, uniq_key, uniq_key_prefix

if TYPE_CHECKING:
    from broker.simulation import Simulation


class Producers:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.groups: dict[str, list[Producer]] = {
            g.name: [self._new(g.name) for _ in range(g.instances)] for g in PRODUCER_GROUPS
        }
        self.check_rr = dict.fromkeys(self.groups, 0)
        self.checks_lost_until = 0  # until then no check request reaches a producer (`check_outage`)
        # Cumulative thresholds for the mutually exclusive producer-side faults of one transaction.
        p = sim.profile
        self.fault_cuts = list(itertools.accumulate(
            [p.producer_crash, p.never_decided, p.unknown_answer, p.slow_local_txn]))  # fmt: skip
        self.refresh()

    def _new(self, group: str) -> Producer:
        n = next(self.sim.client_n)
        ip, pid = client_ip(n), 1000 + n
        return Producer(group, client_id(ip, pid, n * 7919), uniq_key_prefix(ip, pid, self.sim.rng.getrandbits(32)))

    def refresh(self) -> None:
        """Recompute who can send after a producer or broker went down or came back."""
        self.up_brokers = [b for b in self.sim.brokers.values() if b.up]
        self.alive = {g: [pr for pr in prs if pr.alive] for g, prs in self.groups.items()}
        self.sending_groups = [g for g in PRODUCER_GROUPS if self.alive[g.name]]
        self.group_cuts = list(itertools.accumulate(g.weight for g in self.sending_groups))

    def arrive(self, _: Any) -> None:
        sim = self.sim
        rng, p = sim.rng, sim.profile
        up, groups = self.up_brokers, self.sending_groups
        if not up or not groups:  # nobody can send: the business request waits a second
            sim.at(sim.now + 1000, P_STORE, self.arrive)
            return
        group = groups[bisect.bisect(self.group_cuts, rng.random() * self.group_cuts[-1])]
        alive = self.alive[group.name]
        producer = alive[int(rng.random() * len(alive))]
        self._send_transaction(group.name, group.topic, producer, up[int(rng.random() * len(up))])
        if rng.random() < p.plain_ratio:
            topic = sim.topic_names[int(rng.random() * len(sim.topic_names))]
            pick, queue = rng.random(), rng.random()
            # The route lists only the brokers whose queues of the topic take writes (broker/cluster.py).
            routed = [b for b in up if sim.cluster.writable(b.name, topic)]
            if routed:
                sim.store.store_real(routed[int(pick * len(routed))], topic, int(queue * TOPICS[topic]), None, producer)
        sim.sent += 1
        if sim.progress and sim.sent % 50_000 == 0:
            sim.progress(sim.sent)
        if sim.sent < sim.n:
            sim.at(sim.now + int(rng.expovariate(p.txn_per_second) * 1000), P_STORE, self.arrive)
        else:
            sim.at(sim.now + p.drain_ms, P_END, sim.end)

    def _send_transaction(self, group: str, topic: str, producer: Producer, b: BrokerState) -> None:
        """sendMessageInTransaction (reference §1.2): half stored, local transaction, one-way end."""
        sim = self.sim
        rng, p = sim.rng, sim.profile
        born = sim.now + producer.skew_ms
        key = uniq_key(producer.key_prefix, born, producer.counter)
        producer.counter += 1
        outcome = "COMMIT" if rng.random() < p.commit_ratio else "ROLLBACK"
        body_size = 100 + int(rng.random() * 1900)
        txn = Txn(b, key, group, topic, int(rng.random() * TOPICS[topic]), born, body_size, outcome)
        if producer.skew_ms:
            sim.fault(txn, "skewed_clock")
        if p.immunity_ratio and rng.random() < p.immunity_ratio:
            txn.immunity_s = rng.choice((30, 60, 120))
            sim.fault(txn, "immunity")
        if p.unaware_checker and rng.random() < p.unaware_checker:
            txn.unaware_checker = True
            sim.fault(txn, "unaware_checker")
        sim.open[key] = txn
        original = sim.store.store_half(b, txn, None, None)
        sim.tracer.pub(producer, txn)
        exec_ms = 5 + int(rng.random() * 195)
        txn.decided_at = sim.now + exec_ms
        r = rng.random()
        crash, never, unknown, slow = self.fault_cuts
        if r >= slow:  # the common case: the local transaction ends and the producer says so
            self.later(txn, sim.now + exec_ms, self._local_done, (txn, producer, original))
        elif r < crash:  # the instance dies before it can end the transaction; others answer checks
            sim.fault(txn, "producer_crash")
            producer.alive = False
            self.refresh()
            sim.at(sim.now + rng.randint(3_000, 10_000), P_CONTROL, self._restart, producer)
        elif r < never:  # UNKNOW now, and the state never becomes known
            sim.fault(txn, "never_decided")
            txn.decided_at = None
            sim.tracer.end(producer, txn, "UNKNOW", from_check=False)
        elif r < unknown:  # UNKNOW now (the broker ignores its end request); the state is known a little later
            sim.fault(txn, "unknown_answer")
            sim.tracer.end(producer, txn, "UNKNOW", from_check=False)
            txn.decided_at = sim.now + exec_ms + rng.randint(1_000, 90_000)
        else:  # a slow local transaction that commits minutes later (issue #8158)
            sim.fault(txn, "slow_local_txn")
            txn.outcome = "COMMIT"
            txn.decided_at = sim.now + rng.randint(480_000, 720_000)
            self.later(txn, txn.decided_at, self._local_done, (txn, producer, original))

    def later(self, txn: Txn, when: int, fn: Callable[[Any], object], arg: Any) -> None:
        """An event of the transaction's own: it cannot settle until the event happened."""
        txn.inflight += 1
        self.sim.at(when, P_STORE, fn, arg)

    def _local_done(self, arg: tuple[Txn, Producer, HalfEntry]) -> None:
        txn, producer, original = arg
        txn.inflight -= 1
        p, rng = self.sim.profile, self.sim.rng
        if producer.alive:
            self.sim.tracer.end(producer, txn, txn.outcome, from_check=False)
            self._send_end(txn, original, txn.outcome, from_check=False)
            if p.duplicate_end and rng.random() < p.duplicate_end:
                self.sim.fault(txn, "duplicate_end")
                self._send_end(txn, original, txn.outcome, from_check=False, delay=rng.randint(20, 2000))
        self.sim.settle(txn)

    def _send_end(self, txn: Txn, entry: HalfEntry, action: str, from_check: bool, delay: int = NET_MS) -> bool:
        """endTransactionOneway: no response, no retry (reference §1.2); it can be lost (False)."""
        sim = self.sim
        if sim.profile.lost_end and sim.rng.random() < sim.profile.lost_end:
            sim.fault(txn, "lost_end")
            return False
        self.later(txn, sim.now + delay, sim.store.end_transaction, (txn, entry, action, from_check))
        return True

    def check(self, txn: Txn, copy: HalfEntry) -> None:
        """checkProducerTransactionState: one-way to a live channel of the group, round-robin."""
        alive, p = self.alive[txn.group], self.sim.profile
        if not alive:  # only a warning; the copy is written and the check count consumed
            self.sim.fault(txn, "no_producer_for_check")
            return
        if self.sim.now < self.checks_lost_until or (p.lost_check and self.sim.check_rng.random() < p.lost_check):
            self.sim.fault(txn, "lost_check")  # sent one-way and lost, or not sent at all (rocketmq #8311)
            return
        producer = alive[self.check_rr[txn.group] % len(alive)]
        self.check_rr[txn.group] += 1
        self.later(txn, self.sim.now + NET_MS, self._check_answer, (txn, copy, producer))

    def _check_answer(self, arg: tuple[Txn, HalfEntry, Producer]) -> None:
        """checkLocalTransaction: the business state if known by now (an application answers from its own
        table, also for a transaction it ended already), else UNKNOW, which sends nothing."""
        txn, copy, producer = arg
        txn.inflight -= 1
        known = txn.decided_at is not None and self.sim.now >= txn.decided_at and not txn.unaware_checker
        if producer.alive:
            # The answer is traced before it is sent; UNKNOW is sent too, and the broker ignores it.
            first = self.sim.tracer.end(producer, txn, txn.outcome if known else "UNKNOW", from_check=True)
            if known:
                sent = self._send_end(txn, copy, txn.outcome, from_check=True)
                if first and sent:  # lost yet if its broker is down when it arrives (Store.end_transaction)
                    txn.answer_sent_at = self.sim.tracer.at()
                elif first:
                    txn.answer_lost_at = self.sim.tracer.at()
        self.sim.settle(txn)

    def _restart(self, producer: Producer) -> None:
        producer.alive = True
        self.refresh()

    def group_offline(self, group: str) -> None:
        """Every instance of a group is gone for 8-10 minutes: nobody answers its checks."""
        sim = self.sim
        for pr in self.groups[group]:
            pr.alive = False
        self.refresh()
        sim.fault(None, "producer_group_offline")
        sim.at(sim.now + sim.rng.randint(480_000, 600_000), P_CONTROL, self._group_online, group)

    def check_outage(self, _: Any) -> None:
        """For 8-10 minutes no check request reaches a producer, though every group is alive: the broker writes
        its copies and counts its checks all the same."""
        self.checks_lost_until = self.sim.now + self.sim.check_rng.randint(480_000, 600_000)
        self.sim.fault(None, "check_outage")

    def _group_online(self, group: str) -> None:
        for pr in self.groups[group]:
            pr.alive = True
        self.refresh()
