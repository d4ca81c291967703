"""The consumer groups: members that heartbeat, rebalance, consume and commit offsets (reference §2, §3), the
incidents that befall them (crashes, scaling, resets, drifted subscriptions, stale client lists), and the
snapshots `txn-recon collect` would take of them."""

from __future__ import annotations

import bisect
import functools
from typing import TYPE_CHECKING, Any

from broker.events import NET_MS, P_CONSUMER, P_CONTROL, P_SNAPSHOT, P_STORE
from broker.filters import ALL, Filter, FilterWatch, tag_matches
from broker.groups import MQ, SNAPSHOT_MS, GroupWatch, Member
from broker.rebalance import allocate
from broker.state import BrokerState, Consumer
from broker.topology import CONSUMER_GROUPS, TAG, ConsumerGroupSpec, client_id, client_ip

if TYPE_CHECKING:
    from broker.simulation import Simulation

REBALANCE_INTERVAL_MS = 20_000  # rocketmq.client.rebalance.waitInterval (reference §2.3)
HEARTBEAT_MS = 30_000  # heartbeatBrokerInterval (§2.1)
PERSIST_INTERVAL_MS = 5_000  # persistConsumerOffsetInterval (§3.2)


class Consumers:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.specs = {g.name: g for g in CONSUMER_GROUPS}
        self.members: dict[str, list[Consumer]] = {
            g.name: [self._new(g.name) for _ in range(g.members)] for g in CONSUMER_GROUPS
        }
        # Each group's broker subscription table (reference §2.1): its topic set is the last heartbeat's, and
        # per topic it keeps the expression with the newest subVersion (`kept`: topic -> expression, version).
        self.sub_table = {g.name: g.topics for g in CONSUMER_GROUPS}
        self.kept = {g.name: {t: (ALL, sim.now) for t in g.topics} for g in CONSUMER_GROUPS}
        self.moved: dict[tuple[str, MQ], tuple[str, int]] = {}  # a queue's last holder and its memory offset
        self.watch = GroupWatch(lambda rec, ts: sim.emit("consumer", rec, ts), sim.truth_anomaly,
                                sim.thresholds.stranded_after_ms)  # fmt: skip
        self.filters = FilterWatch(sim.truth_anomaly)

    def start(self) -> None:
        """Every group rebalances from the start; each member persists and heartbeats at its own phase."""
        sim = self.sim
        for group, members in self.members.items():
            sim.at(sim.now, P_CONSUMER, self._rebalance_tick, group)
            for c in members:
                sim.at(sim.now + sim.rng.randrange(PERSIST_INTERVAL_MS), P_CONSUMER, self._tick, c)
                sim.at(sim.now + sim.crng.randrange(HEARTBEAT_MS), P_CONSUMER, self._heartbeat, c)
        sim.at(sim.now + SNAPSHOT_MS, P_SNAPSHOT, self._snapshot)

    def _new(self, group: str, topics: tuple[str, ...] | None = None, expression: str = ALL) -> Consumer:
        n = next(self.sim.client_n)
        cid = client_id(client_ip(n), 2000 + n, n * 104_729 + self.sim.now % 1_000_000)
        return Consumer(group, cid, topics or self.specs[group].topics, expression, self.sim.now)

    def _heartbeat(self, c: Consumer) -> None:
        if not c.alive:
            return
        self.sim.at(self.sim.now + HEARTBEAT_MS, P_CONSUMER, self._heartbeat, c)
        self._register(c)

    def _register(self, c: Consumer) -> None:
        """ConsumerGroupInfo.updateSubscription with a member's heartbeat (reference §2.1): the table's topics
        become the member's; a topic's expression is replaced only by a strictly newer subVersion."""
        self.sub_table[c.group] = c.topics
        kept = self.kept[c.group]
        for topic in c.topics:
            if topic not in kept or c.versions[topic] > kept[topic][1]:
                kept[topic] = (c.expression, c.versions[topic])
        for topic in [t for t in kept if t not in c.topics]:
            del kept[topic]

    def _rebalance_tick(self, group: str) -> None:
        self.sim.at(self.sim.now + REBALANCE_INTERVAL_MS, P_CONSUMER, self._rebalance_tick, group)
        self._rebalance(group)

    def _rebalance(self, group: str) -> None:
        """Every member recomputes its queues (reference §2.3); a moved queue's old owner persists it
        on removal, then the new owner starts from the broker's stored offset."""
        sim = self.sim
        spec: ConsumerGroupSpec = self.specs[group]
        members = self.members[group]
        cids = [c.client_id for c in members]
        wanted = {c.client_id: self._allocation(spec, c, c.view or cids) for c in members}
        changed = {c.client_id: {mq[0] for mq in c.assigned ^ wanted[c.client_id]} for c in members}
        for c in members:
            for mq in sorted(c.assigned - wanted[c.client_id]):
                late = sim.rng.random() < sim.profile.stale_offset_commit
                self._commit_offset(c, mq, c.memory[mq], delay=sim.rng.randint(5_000, 15_000) if late else NET_MS)
                if late:
                    sim.fault(None, "stale_offset_commit")
                self.moved[(group, mq)] = (c.client_id, c.memory[mq])
                self._drop(c, mq)
        for c in members:
            for mq in sorted(wanted[c.client_id] - c.assigned):
                topic, bname, qid = mq
                stored = sim.brokers[bname].offsets.get((group, topic, qid))
                start = stored[0] if stored else 0  # a young queue answers 0 (reference §3.3, §3.6)
                c.assigned.add(mq)
                c.memory[mq] = start
                if (group, mq) in self.moved:
                    old, memory = self.moved.pop((group, mq))
                    self.watch.handed_off(group, mq, old, memory - start)
        for c in members:  # messageQueueChanged: a new subVersion for the topic, and a heartbeat at once
            if changed[c.client_id]:
                c.versions.update(dict.fromkeys(changed[c.client_id], sim.now))
                self._register(c)

    def _allocation(self, spec: ConsumerGroupSpec, c: Consumer, cids: list[str] | tuple[str, ...]) -> set[MQ]:
        """Each member allocates its own topics over the client list it has (reference §2.3)."""
        mq_all = self.sim.mq_all
        return {mq for t in c.topics for mq in allocate(spec.strategy, spec.name, c.client_id, mq_all[t], cids)}

    def _drop(self, c: Consumer, mq: MQ) -> None:
        c.assigned.discard(mq)
        c.memory.pop(mq, None)
        c.pins.pop(mq, None)

    def _tick(self, c: Consumer) -> None:
        if not c.alive:
            return
        self.sim.at(self.sim.now + PERSIST_INTERVAL_MS, P_CONSUMER, self._tick, c)
        # persistAll sends what was consumed so far, every assigned queue, changed or not (§3.2); what is
        # consumed next stays in memory until the next persist, and is lost with the member if it dies.
        for mq in sorted(c.assigned):
            self._commit_offset(c, mq, c.memory[mq])
        self._consume(c, self.sim.now - 100, pins=True)

    def _consume(self, c: Consumer, upto_ts: int, pins: bool) -> None:
        """Advance memory offsets over what was stored by `upto_ts`; a slow message pins the committed
        offset at itself until it is done (ProcessQueue.removeMessage, reference §3.1)."""
        sim = self.sim
        rng, ratio = sim.rng, sim.profile.slow_consume_ratio
        for mq in sorted(c.assigned):
            topic, bname, qid = mq
            b = sim.brokers[bname]
            if not b.up or topic not in self.sub_table[c.group]:  # a pull fails: "subscription not exist"
                continue
            table = self.kept[c.group][topic][0]
            target = bisect.bisect_right(b.real_store_ts[(topic, qid)], upto_ts)
            mem = c.memory[mq]
            pin = c.pins.get(mq)
            if pin is not None and (not pins or sim.now >= pin[1]):
                del c.pins[mq]
                pin = None
            if pin is not None:
                target = min(target, pin[0])
            elif pins and ratio and target > mem and rng.random() < min(1.0, (target - mem) * ratio):
                slow = mem + rng.randrange(target - mem)
                c.pins[mq] = (slow, sim.now + rng.randint(10_000, 60_000))
                target = slow
            if target > mem:  # increase-only update of the memory offset (§3.2)
                c.memory[mq] = target
                refused = self._refused(c, mq, table, mem, target) if (table, c.expression) != (ALL, ALL) else set()
                sim.sendback.consumed(sim.now, c.group, mq, mem, target, refused)
                sim.tracer.attempts(c, mq, mem, target, refused)

    def _refused(self, c: Consumer, mq: MQ, table: str, start: int, end: int) -> set[int]:
        """Offsets [start, end) of a queue that the broker's filter (the table's expression) or the member's own
        refused: skipped, not delivered. Those some member of the group wants are lost to it."""
        tags = self.sim.brokers[mq[1]].real_tags[(mq[0], mq[2])]
        wanted = {m.expression for m in self.members[c.group] if mq[0] in m.topics}
        refused = {
            o for o in range(start, end) if not (tag_matches(table, tags[o]) and tag_matches(c.expression, tags[o]))
        }
        for o in sorted(refused):
            if any(tag_matches(e, tags[o]) for e in wanted):
                self.filters.refuse(c.group, mq, o)
        return refused

    def _commit_offset(self, c: Consumer | None, mq: MQ, offset: int, delay: int = NET_MS) -> None:
        client = c.client_id if c is not None else None
        self.sim.at(self.sim.now + delay, P_STORE, self._accept_offset, (c.group if c else "", mq, offset, client))

    def _accept_offset(self, arg: tuple[str, MQ, int, str | None]) -> None:
        group, (topic, bname, qid), offset, client = arg
        b = self.sim.brokers[bname]
        if not b.up:
            return  # one-way update to a dead broker: lost
        self._store_offset(b, group, topic, qid, offset, client)

    def _store_offset(self, b: BrokerState, group: str, topic: str, qid: int, offset: int, client: str | None) -> None:
        """ConsumerOffsetManager.commitOffset: an unconditional overwrite (reference §3.3)."""
        sim = self.sim
        now = sim.now
        b.offset_seq += 1
        rec = (b.name, group, topic, qid, offset, now, client, b.offset_seq)  # OFFSET field order
        sim.emit("offset", rec, now)
        self.filters.commit(group, (topic, b.name, qid), now)
        key = (group, topic, qid)
        before = b.offsets.get(key)
        if before is not None and offset > before[0] and client is None and before[1] is not None:
            sim.truth_anomaly({
                "anomaly_type": "OFFSET_JUMP", "reason": None, "broker_name": b.name, "consumer_group": group,
                "topic": topic, "queue_id": qid, "commit_timestamp": now, "seq": b.offset_seq,
                "event_ts": now, "detail": {"from_offset": before[0], "to_offset": offset,
                                            "skipped": offset - before[0], "client_before": before[1]},
            })  # fmt: skip
        if before is not None and offset < before[0]:
            real = b.real_store_ts[(topic, qid)]
            sim.truth_anomaly({
                "anomaly_type": "OFFSET_REGRESSION", "reason": None, "broker_name": b.name,
                "consumer_group": group, "topic": topic, "queue_id": qid,
                "commit_timestamp": now, "seq": b.offset_seq, "event_ts": now,
                "detail": {"from_offset": before[0], "to_offset": offset, "rewind": before[0] - offset,
                           "client_before": before[1], "client_after": client,
                           "redelivery_estimate": min(before[0], len(real)) - offset},
            })  # fmt: skip
        b.offsets[key] = (offset, client)

    def finish(self) -> None:
        """Graceful shutdown: every member finishes what was stored and persists every queue."""
        sim = self.sim
        for group in sorted(self.members):
            for c in self.members[group]:
                self._consume(c, sim.now, pins=False)
                for mq in sorted(c.assigned):
                    topic, bname, qid = mq
                    if sim.brokers[bname].up:
                        self._store_offset(sim.brokers[bname], group, topic, qid, c.memory[mq], c.client_id)

    # ---- membership ---------------------------------------------------------------------------------

    def crash(self, group: str) -> None:
        """A consumer dies: progress since its last persist is lost; the others take its queues."""
        sim = self.sim
        members = self.members[group]
        if len(members) < 2:
            return
        victim = members[sim.rng.randrange(len(members))]
        victim.alive = False
        members.remove(victim)
        for mq in sorted(victim.assigned):  # what it had consumed dies with it
            self.moved[(group, mq)] = (victim.client_id, victim.memory[mq])
        sim.fault(None, "consumer_crash")
        self._rebalance(group)
        sim.at(sim.now + 30_000, P_CONTROL, self._join, group)

    def _join(self, group: str, topics: tuple[str, ...] | None = None, expression: str = ALL) -> Consumer:
        sim = self.sim
        c = self._new(group, topics, expression)
        self.members[group].append(c)
        self._register(c)  # its registration is a heartbeat
        self._rebalance(group)
        sim.at(sim.now + sim.rng.randrange(PERSIST_INTERVAL_MS), P_CONSUMER, self._tick, c)
        sim.at(sim.now + HEARTBEAT_MS, P_CONSUMER, self._heartbeat, c)
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

    def scale(self, group: str) -> None:
        """A graceful scale-in (persist everything, then leave) or scale-out."""
        members = self.members[group]
        self.sim.fault(None, "consumer_scale")
        if len(members) > 1 and self.sim.rng.random() < 0.5:
            self._leave(members[-1])
        else:
            self._join(group)

    def subscription_drift(self, group: str) -> None:
        """A member deployed with other subscriptions (the classic mistake, reference §2.2): one topic fewer,
        or for a one-topic group another topic instead. It leaves again 3-6 minutes later."""
        sim = self.sim
        topics = self.specs[group].topics
        others = [t for t in sim.topic_names if t not in topics]
        drifted = topics[:-1] if len(topics) > 1 else (sim.crng.choice(others),)
        sim.fault(None, "subscription_drift")
        c = self._join(group, drifted)
        sim.at(sim.now + sim.crng.randint(180_000, 360_000), P_CONTROL, self._leave, c)

    def tag_drift(self, group: str) -> None:
        """A member deployed with a tag expression where the others take every tag (reference §2.2 (c)): while
        the broker keeps its expression, every member's pulls skip the untagged messages the others want, and
        its own skip them too. It leaves again 3-6 minutes later."""
        sim = self.sim
        sim.fault(None, "tag_drift")
        c = self._join(group, expression=TAG)
        sim.at(sim.now + sim.crng.randint(180_000, 360_000), P_CONTROL, self._leave, c)

    def stale_client_list(self, group: str) -> None:
        """One member allocates over a client list that misses another member (it asked a broker the other
        had not reached yet), for 90-180 s: queues may be held twice or by nobody."""
        sim = self.sim
        members = self.members[group]
        if len(members) < 2:
            return
        c = members[sim.crng.randrange(len(members))]
        missing = sim.crng.choice([m.client_id for m in members if m is not c])
        c.view = tuple(m.client_id for m in members if m.client_id != missing)
        sim.fault(None, "stale_client_list")
        self._rebalance(group)
        sim.at(sim.now + sim.crng.randint(90_000, 180_000), P_CONTROL, self._fresh_client_list, c)

    def _fresh_client_list(self, c: Consumer) -> None:
        c.view = None
        if c.alive:
            self._rebalance(c.group)

    # ---- admin resets ---------------------------------------------------------------------------------

    def offset_skip(self, group: str) -> None:
        """An admin resets one topic of a group to its end (skipping a backlog): an OFFSET_JUMP wherever
        that moves the committed offset forward."""
        sim = self.sim
        topic = sim.crng.choice(self.specs[group].topics)
        sim.fault(None, "offset_skip")
        for mq in sim.mq_all[topic]:
            _, bname, qid = mq
            b = sim.brokers[bname]
            end, current = b.real_next[(topic, qid)], b.offsets.get((group, topic, qid))
            if not b.up or current is None or end <= current[0]:
                continue
            self._store_offset(b, group, topic, qid, end, None)
            if current[1] is not None:
                self.filters.skip(group, mq, sim.now, current[0], end)
            for c in self.members[group]:
                if mq in c.assigned:
                    c.memory[mq] = end
                    c.pins.pop(mq, None)

    def offset_reset(self, group: str) -> None:
        """An admin resets one topic of a group back in time (reference §3.5): the broker's table is
        overwritten where the target is smaller, and the owners restart from it."""
        sim = self.sim
        topic = sim.rng.choice(self.specs[group].topics)
        since = sim.now - sim.rng.randint(60_000, 180_000)
        sim.fault(None, "offset_reset")
        for mq in sim.mq_all[topic]:
            _, bname, qid = mq
            b = sim.brokers[bname]
            target = bisect.bisect_left(b.real_store_ts[(topic, qid)], since)
            current = b.offsets.get((group, topic, qid))
            if not b.up or current is None or target >= current[0]:
                continue
            self._store_offset(b, group, topic, qid, target, None)
            for c in self.members[group]:
                if mq in c.assigned:
                    c.memory[mq] = target  # updateOffset(increaseOnly=false)
                    c.pins.pop(mq, None)

    # ---- what collect sees ----------------------------------------------------------------------------

    def _snapshot(self, _: Any) -> None:
        """What `txn-recon collect` reads of every group with members (the brokers that are up answer)."""
        sim = self.sim
        sim.at(sim.now + SNAPSHOT_MS, P_SNAPSHOT, self._snapshot)
        up = [b.name for b in sim.brokers.values() if b.up]
        for group in sorted(self.members):
            members = self.members[group]
            if not members or not up:
                continue
            table = {t: self.kept[group][t][0] for t in self.sub_table[group]}
            self.watch.snapshot(
                sim.now, group,
                [Member(c.client_id, c.topics, c.expression, {mq: c.memory[mq] for mq in c.assigned})
                 for c in members],
                dict.fromkeys(up, table),
                committed=functools.partial(self._committed, group),
                end=self._stored,
                queues=lambda t: sim.mq_all[t],
            )  # fmt: skip
            self.filters.snapshot(sim.now, group, self._filters(members, table, set(up)),
                                  {mq: c for t in sim.topic_names for mq in sim.mq_all[t]
                                   if (c := self._committed(group, mq)) is not None},
                                  lambda mq: sim.brokers[mq[1]].real_tags[(mq[0], mq[2])])  # fmt: skip

    @staticmethod
    def _filters(members: list[Consumer], table: dict[str, str], up: set[str]) -> dict[MQ, frozenset[Filter]]:
        """The filters of every held queue at a snapshot: the holder's expression and the table's, where the
        queue's broker answers and its table has the topic."""
        wanted = {t: tuple(sorted({m.expression for m in members if t in m.topics})) for t in table}
        found: dict[MQ, set[Filter]] = {}
        for m in members:
            for mq in m.assigned:
                if mq[0] in m.topics and mq[0] in table and mq[1] in up:
                    found.setdefault(mq, set()).add(Filter(m.client_id, m.expression, table[mq[0]], wanted[mq[0]]))
        return {mq: frozenset(f) for mq, f in found.items()}

    def _stored(self, mq: MQ) -> int:
        return self.sim.brokers[mq[1]].real_next[(mq[0], mq[2])]

    def _committed(self, group: str, mq: MQ) -> int | None:
        stored = self.sim.brokers[mq[1]].offsets.get((group, mq[0], mq[2]))
        return None if stored is None else stored[0]
