"""The brokers' side of a transaction: the half, final and op messages they store, end requests
(EndTransactionProcessor), op batching (TransactionalOpBatchService), and process crashes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.events import P_CONTROL, P_OP
from broker.state import BrokerState, HalfEntry, Producer, Txn
from broker.topology import DISCARD_TOPIC, OP_TAG, SYS_FLAG_COMMIT, uniq_key

if TYPE_CHECKING:
    from broker.simulation import Simulation


def _transaction_id(b: BrokerState, txn: Txn) -> str | None:
    """__transactionId__ as the broker stores it: the UNIQ_KEY from 5.1.0 (RIP-50, which came with batched
    ops), nothing before (a 4.9.7 broker writes none)."""
    return txn.uniq_key if b.batched_ops else None


class Store:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.cfg = sim.cfg

    def phys(self, b: BrokerState, size: int) -> int:
        """The commit-log offset of a message of `size` bytes appended now."""
        phys = b.phys
        b.phys += size
        return phys

    def phys_if_up(self, name: str, size: int) -> int | None:
        b = self.sim.brokers[name]
        return self.phys(b, size) if b.up else None

    def store_half(self, b: BrokerState, txn: Txn, check_times: int | None, prepared: int | None) -> HalfEntry:
        """Store the original or a check copy in RMQ_SYS_TRANS_HALF_TOPIC queue 0 (reference §1.3, §1.6)."""
        now = self.sim.now
        offset = b.half_next
        b.half_next += 1
        entry = HalfEntry(offset, txn, now, check_times, prepared, self.phys(b, 300 + txn.body_size))
        b.half.append(entry)
        if check_times is None and not txn.first_copy_ts:
            txn.first_copy_ts = now
        txn.last_copy_ts = now
        txn.max_copy_offset = offset
        if check_times is not None and check_times > txn.max_check_times:
            txn.max_check_times = check_times
        # HALF field order (schemas/landing.py).
        rec = (
            b.name, 0, offset, entry.phys, now, txn.born_ts, txn.uniq_key, _transaction_id(b, txn), txn.group,
            txn.topic, txn.queue_id, check_times, txn.immunity_s, prepared, txn.tags, txn.keys, txn.body_size,
            None,  # the classic half topic (no RIP-82 in the model)
        )  # fmt: skip
        self.sim.emit("half", rec, now)
        return entry

    def store_real(self, b: BrokerState, topic: str, queue_id: int, txn: Txn | None, producer: Producer | None,
                   prepared_phys: int | None = None) -> None:  # fmt: skip
        """A message in a business topic: a committed final message, a plain message, or a discard."""
        now = self.sim.now
        if topic == DISCARD_TOPIC:
            offset = b.discard_next
            b.discard_next += 1
        else:
            offset = b.real_next[(topic, queue_id)]
            b.real_next[(topic, queue_id)] = offset + 1
            b.real_store_ts[(topic, queue_id)].append(now)
            b.real_tags[(topic, queue_id)].append(txn.tags if txn else None)
        phys = self.phys(b, 300 + (txn.body_size if txn else 200))
        # REAL field order (schemas/landing.py).
        if txn is None:  # a plain message from a producer's ordinary send
            assert producer is not None
            key = uniq_key(producer.key_prefix, now + producer.skew_ms, producer.counter)
            producer.counter += 1
            rec: tuple[Any, ...] = (
                b.name, topic, queue_id, offset, phys, now, now + producer.skew_ms, key, 0, False,
                None, None, None, None, None, 200, 0,
            )  # fmt: skip
        else:
            # A discarded half keeps the half's sysFlag (NOT type), a final message gets COMMIT (§1.4, §4.6);
            # both keep TRAN_MSG=true in their stored properties [inferred §1.4].
            sys_flag = 0 if topic == DISCARD_TOPIC else SYS_FLAG_COMMIT
            rec = (
                b.name, topic, queue_id, offset, phys, now, txn.born_ts, txn.uniq_key, sys_flag, True,
                prepared_phys, txn.group, _transaction_id(b, txn), txn.tags, txn.keys, txn.body_size, 0,
            )  # fmt: skip
        self.sim.emit("real", rec, now)
        self.sim.sendback.stored(rec)
        self.sim.tracer.stored(rec)

    def end_transaction(self, arg: tuple[Txn, HalfEntry, str, bool]) -> None:
        """EndTransactionProcessor (reference §1.4): no idempotency check; commit = final, then op."""
        sim, cfg = self.sim, self.cfg
        txn, entry, action, from_check = arg
        txn.inflight -= 1
        b = txn.broker
        # Check answers travel in the order they are sent: the first end from a check to arrive after the judged
        # answer was sent is that answer.
        judged = None
        if from_check:
            judged, txn.answer_sent_at = txn.answer_sent_at, None
        if not b.up:
            sim.fault(txn, "end_to_down_broker")
            if judged is not None:
                txn.answer_lost_at = judged
        elif (
            txn.immunity_s is not None
            and not from_check
            and sim.now - txn.born_ts > max(txn.immunity_s * 1000, cfg.transaction_timeout_ms)
        ):
            sim.fault(txn, "late_end_rejected")  # rejectCommitOrRollback: ILLEGAL_OPERATION (604)
        else:
            if action == "COMMIT":
                self.store_real(b, txn.topic, txn.queue_id, txn, None, prepared_phys=entry.phys)
                txn.commit_ts.append(sim.now)
                if b.crash_pending:  # the process dies between the final write and the op write (§1.7)
                    sim.fault(txn, "op_lost_in_crash")
                    self.crash(b)
                    sim.settle(txn)
                    return
            if b.batched_ops and len(b.op_ctx) < cfg.op_context_capacity:
                b.op_ctx.append((entry.offset, txn))
                b.op_ctx_chars += len(str(entry.offset)) + 1
                txn.inflight += 1
                if b.op_ctx_chars > cfg.op_msg_max_size and not self._op_stalled(b):
                    self._flush_ops(b)
            elif b.batched_ops:  # the context is full: the offer times out and the request writes its own op
                self._write_op_message(b, [(entry.offset, txn)])
            else:
                self._store_op(b, [(entry.offset, txn)], str(entry.offset))
        sim.settle(txn)

    # ---- ops ------------------------------------------------------------------------------------------

    def _store_op(self, b: BrokerState, items: list[tuple[int, Txn]], body: str) -> None:
        """An op message in RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0, tag "d" (reference §1.5)."""
        now = self.sim.now
        offset = b.op_next
        b.op_next += 1
        # OP field order (schemas/landing.py).
        rec = (b.name, 0, offset, self.phys(b, 200 + len(body)), now, now, OP_TAG, body, None)
        self.sim.emit("op", rec, now)
        for half_offset, txn in items:
            txn.op_offsets.add(half_offset)
            if txn.resolved_ts is None:
                txn.resolved_ts = now

    def op_tick(self, b: BrokerState) -> None:
        """TransactionalOpBatchService: flush when over size or an interval after the last op write."""
        sim, interval = self.sim, self.cfg.op_batch_interval_ms
        sim.at(sim.now + interval, P_OP, self.op_tick, b)
        if b.up and b.op_ctx and sim.now - b.op_last_flush >= interval and not self._op_stalled(b):
            self._flush_ops(b)

    def _op_stalled(self, b: BrokerState) -> bool:
        return self.sim.now < b.op_stalled_until

    def op_stall(self, name: str) -> None:
        """The op batch service writes nothing for a while (a busy store, issue #9500's backlog): the check
        service then finds committed and rolled-back transactions without their op, and checks them."""
        b = self.sim.brokers[name]
        b.op_stalled_until = self.sim.now + self.sim.rng.randint(30_000, 90_000)
        self.sim.fault(None, "op_stall")

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
        b.op_last_flush = self.sim.now
        self._store_op(b, own + drained, body)
        for _, txn in drained:
            txn.inflight -= 1
            self.sim.settle(txn)

    # ---- crashes --------------------------------------------------------------------------------------

    def crash_soon(self, name: str) -> None:
        b = self.sim.brokers[name]
        if b.up and not b.crash_pending:
            b.crash_pending = True  # it dies right after its next final-message write
            self.sim.at(self.sim.now + 5_000, P_CONTROL, self._crash_if_pending, b)

    def _crash_if_pending(self, b: BrokerState) -> None:
        if b.crash_pending:
            self.crash(b)

    def crash(self, b: BrokerState) -> None:
        """A broker process crash: the unflushed op batch is lost and the check progress goes back to
        its last persisted value (reference §1.7); the broker is down for 10 s."""
        sim = self.sim
        b.crash_pending = False
        b.up = False
        sim.producers.refresh()
        sim.fault(None, "broker_crash")
        lost, b.op_ctx, b.op_ctx_chars = b.op_ctx, [], 0
        b.progress = b.flushed_progress
        for _, txn in lost:
            txn.inflight -= 1
            sim.fault(txn, "op_lost_in_crash")
            sim.settle(txn)
        sim.at(sim.now + 10_000, P_CONTROL, self._restart, b)

    def _restart(self, b: BrokerState) -> None:
        b.up = True
        self.sim.producers.refresh()
        b.op_last_flush = self.sim.now
