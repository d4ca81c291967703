"""Message trace as clients built with `enableMsgTrace` write it (docs/concepts/trace.md): the producers of the
traced groups record each half sent (Pub), each end request and each check answer (EndTransaction), the members
of the traced consumer groups each consumption attempt (SubBefore, SubAfter). A client's dispatcher sends its
contexts in batches of up to ten, at most five seconds apart, as messages of RMQ_SYS_TRACE_TOPIC; a share of
them (`trace_loss`) is lost on the way, as a full queue or a dying client loses them.

The truth of the trace rules is what the kept contexts show: a duplicate consumption is one with two traced
successes, a discard's cause is read from the answers traced (`Tracer.cause`).
"""

from __future__ import annotations

import bisect
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.topology import CONSUMER_GROUPS, PRODUCER_GROUPS
from schemas.landing import TRACE

if TYPE_CHECKING:
    from broker.simulation import Simulation
    from broker.state import Consumer, Producer, Txn

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
NAMES = TRACE.names[TRACE.names.index("trace_type") : TRACE.names.index("malformed")]
FLUSH_MS = 5_000  # AsyncTraceDispatcher: flushTraceInterval


@dataclass
class Answers:
    """What a transaction's traced check answers said: counts by state, when the first COMMIT was."""

    states: Counter[str] = field(default_factory=Counter)
    decided_at: int | None = None  # the first COMMIT answer


class Tracer:
    def __init__(self, sim: Simulation, seed: int) -> None:
        self.sim = sim
        p = sim.profile
        self.rng = random.Random(seed + 0x7ACE)  # its own stream: tracing changes no other draw
        self.loss = p.trace_loss
        self.producer_groups = {g.name for g in PRODUCER_GROUPS[: p.traced_producer_groups]}
        self.consumer_groups = {g.name for g in CONSUMER_GROUPS[: p.traced_consumer_groups]}
        self.keys: dict[tuple[str, str, int], list[str | None]] = {}  # (topic, broker, queue) -> UNIQ_KEY by offset
        self.next_offset: dict[str, int] = {}
        self.answers: dict[str, Answers] = {}  # by UNIQ_KEY
        self.sent: dict[str, list[tuple[int, str]]] = {}  # producer group -> kept (time, key), in time order
        self.sent_keys: set[str] = set()
        self.consumed: Counter[tuple[str, str]] = Counter()  # (group, key) -> traced successes
        self.failed: Counter[tuple[str, str]] = Counter()
        self.requests = 0

    # ---- what the clients record --------------------------------------------------------------------

    def stored(self, rec: tuple[Any, ...]) -> None:
        """A `real` record was stored: its key, by queue offset, for the consumers that trace."""
        if self.consumer_groups:
            self.keys.setdefault((rec[1], rec[0], rec[2]), []).append(rec[7])

    def pub(self, producer: Producer, txn: Txn) -> None:
        """The half sent (SendMessageTraceHookImpl)."""
        if txn.group in self.producer_groups and self._kept(
            producer.client_id, producer.skew_ms, "Pub", group_name=txn.group, msg_topic=txn.topic,
            uniq_key=txn.uniq_key, keys=txn.keys, cost_ms=2, msg_type="Trans_Msg_Half", success=True,
        ):  # fmt: skip
            self._sent(txn.group, txn.uniq_key)

    def end(self, producer: Producer, txn: Txn, state: str, from_check: bool) -> bool:
        """An end request or a check answer, COMMIT, ROLLBACK or UNKNOW, traced before it is sent
        (EndTransactionTraceHookImpl). True when it is a check's first COMMIT answer and its trace was kept."""
        name = {"COMMIT": "COMMIT_MESSAGE", "ROLLBACK": "ROLLBACK_MESSAGE"}.get(state, "UNKNOW")
        if txn.group not in self.producer_groups or not self._kept(
            producer.client_id, producer.skew_ms, "EndTransaction", group_name=txn.group, msg_topic=txn.topic,
            uniq_key=txn.uniq_key, keys=txn.keys, msg_type="Trans_msg_Commit", transaction_state=name,
            from_check=from_check,
        ):  # fmt: skip
            return False
        self._sent(txn.group, txn.uniq_key)
        if not from_check:
            return False
        a = self.answers.setdefault(txn.uniq_key, Answers())
        a.states[name] += 1
        if name != "COMMIT_MESSAGE" or a.decided_at is not None:  # the first COMMIT answer is judged
            return False
        a.decided_at = self.at()
        return True

    def attempts(self, c: Consumer, mq: tuple[str, str, int], start: int, end: int, refused: set[int]) -> None:
        """A member consumed offsets [start, end) of a queue but the `refused`; it fails the poison ones."""
        if c.group not in self.consumer_groups:
            return
        keys = self.keys.get(mq, [])
        for offset in range(start, min(end, len(keys))):
            key = keys[offset]
            if offset not in refused and key is not None:
                self.attempt(c.group, c.client_id, key, 0, not self.sim.sendback.poison(c.group, key))

    def retry(self, group: str, key: str, times: int) -> None:
        """A retry copy consumed by a member of the group, and failed again (broker/retries.py)."""
        members = self.sim.consumers.members.get(group) or []
        if members:
            self.attempt(group, members[0].client_id, key, times, False)

    def attempt(self, group: str, client: str, key: str, retry: int, success: bool) -> None:
        """One consumption: SubBefore, then SubAfter with its result, each kept or lost on its own."""
        if group not in self.consumer_groups:
            return
        self.requests += 1
        request = f"REQ{self.requests:012X}"
        self._kept(client, 0, "SubBefore", group_name=group, request_id=request, uniq_key=key, retry_times=retry)
        if self._kept(client, 0, "SubAfter", group_name=group, request_id=request, uniq_key=key, cost_ms=3,
                      success=success, context_code=0 if success else 1):  # fmt: skip
            (self.consumed if success else self.failed)[(group, key)] += 1

    # ---- the truth --------------------------------------------------------------------------------

    def cause(self, txn: Txn, first_copy_ts: int, until: int) -> tuple[dict[str, int] | None, str | None]:
        """A discard's `answers` and `cause` as its kept trace shows them (None, None: its group traced neither
        its send nor anything between its first copy and its discard, `until`)."""
        sent = self.sent.get(txn.group, [])
        covered = sent[bisect.bisect_left(sent, (first_copy_ts,)) : bisect.bisect_right(sent, (until, "~"))]
        a = self.answers.get(txn.uniq_key, Answers())
        if not covered and txn.uniq_key not in self.sent_keys:
            return None, None
        # While the broker made its last check: from its last copy to its discard.
        since = bisect.bisect_left(sent, (txn.last_copy_ts,))
        window = sent[since : bisect.bisect_right(sent, (until, "~"))]
        s = a.states
        answers = {"unknown": s["UNKNOW"], "commit": s["COMMIT_MESSAGE"], "rollback": s["ROLLBACK_MESSAGE"],
                   "unanswered": max(txn.max_check_times - sum(s.values()), 0)}  # fmt: skip
        if answers["commit"] + answers["rollback"]:
            return answers, "ANSWER_LOST"
        if answers["unknown"]:
            return answers, "ANSWERED_UNKNOWN"
        alive = any(k != txn.uniq_key for _, k in window)
        return answers, "CHECKS_WITHOUT_CALLBACK" if alive else "UNANSWERED"

    def truth(self) -> list[dict[str, Any]]:
        """DUPLICATE_CONSUMPTION and CONSUME_FAILED as the kept trace shows them."""
        out = [{"anomaly_type": "DUPLICATE_CONSUMPTION", "reason": None, "consumer_group": g, "uniq_key": k,
                "detail": {"consumed": n}} for (g, k), n in sorted(self.consumed.items()) if n > 1]  # fmt: skip
        out += [{"anomaly_type": "CONSUME_FAILED", "reason": None, "consumer_group": g, "uniq_key": k,
                 "detail": {"failed": n}} for (g, k), n in sorted(self.failed.items())]  # fmt: skip
        return out

    # ---- the trace messages -----------------------------------------------------------------------

    def at(self) -> int:
        """A context's time on the broker's clock, as the rules read it (its client time moved by its trace
        message's store time minus born time): now, plus the network's millisecond."""
        return self.sim.now + 1

    def _sent(self, group: str, key: str) -> None:
        bisect.insort(self.sent.setdefault(group, []), (self.at(), key))
        self.sent_keys.add(key)

    def _kept(self, client: str, skew: int, kind: str, **fields: Any) -> bool:
        """One context, sent in a trace message of its own within FLUSH_MS by the client's trace producer (its
        address from the client id); False when it is lost. `skew`: the client's clock minus true time."""
        if self.loss and self.rng.random() < self.loss:
            return False
        sim = self.sim
        b = next((b for b in sim.brokers.values() if b.up), None)
        if b is None:  # nowhere to send it: lost
            return False
        offset = self.next_offset.get(b.name, 0)
        self.next_offset[b.name] = offset + 1
        sent = sim.now + int(self.rng.random() * FLUSH_MS)
        ip, pid = client.split("@")[0], int(client.split("@")[1].split("#")[0])
        fields = {"trace_type": kind, "timestamp": sim.now + skew, "region_id": "DefaultRegion"} | fields
        # TRACE field order: its message stored a millisecond after it was sent, born on the client's clock.
        rec = (b.name, TRACE_TOPIC, 0, offset, sim.store.phys(b, 200), sent + 1, sent + skew, f"{ip}:{30000 + pid}",
               0, *(fields.get(n) for n in NAMES), None, None)  # fmt: skip
        sim.emit("trace", rec, sent + 1)
        return True
