"""The brokers' transaction check service (TransactionalMessageServiceImpl.check, reference §1.6): passes over
half queue 0 that re-append copies and ask producers, discards, and the persisted check progress."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.events import P_FLUSH, P_PASS
from broker.state import BrokerState, HalfEntry
from broker.topology import DISCARD_TOPIC

if TYPE_CHECKING:
    from broker.simulation import Simulation


class CheckService:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.cfg = sim.cfg

    def check_pass(self, b: BrokerState) -> None:
        """One pass of TransactionalMessageServiceImpl.check over half queue 0 (reference §1.6).

        Ops are applied as they are stored, so the pass sees every op written before it (the
        removeMap after pulling all op messages). Like the broker it walks strictly in offset order
        and stops at the first message that is too young or was stored during this pass. A copy is
        resolved only by an op listing its own offset: a 5.3.3 broker ignores op offsets below its
        progress, so an immunity copy is never resolved through its prepared offset (DESIGN §2).
        """
        sim, cfg, store = self.sim, self.cfg, self.sim.store
        sim.at(sim.now + cfg.check_interval_ms, P_PASS, self.check_pass, b)
        if not b.up or sim.now < b.stalled_until:
            return
        now, i = sim.now, b.progress
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
            if (ct is not None and ct >= cfg.check_max) or age > sim.reserved_ms:  # needDiscard / needSkip
                self._discard(b, entry)
                i += 1
                continue
            if entry.store_ts >= now:  # stored during this pass: next pass
                break
            next_ct = 1 if ct is None else ct + 1  # needDiscard's in-memory TRANSACTION_CHECK_TIMES
            if txn.immunity_s is not None:
                immunity = txn.immunity_s * 1000  # no max() with the timeout here
                if age < immunity:  # inside the window: re-append an immunity copy, no check
                    store.store_half(b, txn, next_ct, prepared if prepared is not None else entry.offset)
                    i += 1
                    continue
            else:
                immunity = cfg.transaction_timeout_ms
                if 0 <= age < immunity:  # too young: head-of-line stop
                    break
            if age > immunity or age <= -1:
                copy = store.store_half(b, txn, next_ct, prepared)
                sim.producers.check(txn, copy)
                i += 1
                continue
            break
        b.progress = i

    def _discard(self, b: BrokerState, entry: HalfEntry) -> None:
        """resolveDiscardMsg: the half goes to TRANS_CHECK_MAX_TIME_TOPIC, not to its real topic."""
        txn = entry.txn
        self.sim.store.store_real(b, DISCARD_TOPIC, 0, txn, None)
        if txn.discard_ts is None:
            txn.discard_ts = self.sim.now
        self.sim.fault(txn, "discarded")

    def flush_progress(self, b: BrokerState) -> None:
        """Persist the half progress (consumerOffset.json, every 5 s) and settle what it passed."""
        sim = self.sim
        sim.at(sim.now + self.cfg.offset_flush_interval_ms, P_FLUSH, self.flush_progress, b)
        if not b.up:
            return
        b.flushed_progress = b.progress
        while b.half and b.half[0].offset < b.flushed_progress:
            entry = b.half.popleft()
            b.half_base += 1
            if entry.txn.max_copy_offset == entry.offset:  # its newest copy is behind us
                b.settle_queue.append(entry.txn)
        while b.settle_queue:
            sim.settle(b.settle_queue.popleft())

    def stall(self, name: str) -> None:
        """The check service of a broker passes nothing for 2-4 minutes."""
        sim = self.sim
        b = sim.brokers[name]
        b.stalled_until = sim.now + sim.rng.randint(120_000, 240_000)
        sim.fault(None, "check_stall")
