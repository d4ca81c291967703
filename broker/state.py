"""Mutable state of the simulated entities. Plain slotted classes: the simulation holds many of them."""

from __future__ import annotations

from array import array
from collections import deque

from broker.topology import TAG, BrokerSpec


class Txn:
    """One transaction: its identity, the business decision, and what the broker did with it."""

    __slots__ = (
        "answer_lost_at",
        "answer_sent_at",
        "body_size",
        "born_ts",
        "broker",
        "commit_ts",
        "decided_at",
        "discard_ts",
        "faults",
        "first_copy_ts",
        "group",
        "immunity_s",
        "inflight",
        "keys",
        "last_copy_ts",
        "max_check_times",
        "max_copy_offset",
        "op_offsets",
        "outcome",
        "queue_id",
        "resolved_ts",
        "tags",
        "topic",
        "unaware_checker",
        "uniq_key",
    )  # fmt: skip

    def __init__(self, broker: BrokerState, uniq_key: str, group: str, topic: str, queue_id: int,
                 born_ts: int, body_size: int, outcome: str) -> None:  # fmt: skip
        self.broker = broker
        self.uniq_key = uniq_key
        self.group = group
        self.topic = topic
        self.queue_id = queue_id
        self.born_ts = born_ts
        self.body_size = body_size
        self.tags = TAG if body_size % 2 else None
        self.keys = f"order-{uniq_key[-8:]}" if body_size % 3 else None
        self.immunity_s: int | None = None
        self.answer_lost_at: int | None = None  # its first traced COMMIT check answer, lost (broker time)
        self.answer_sent_at: int | None = None  # the same answer, sent and on its way to the broker
        self.outcome = outcome  # the business decision: "COMMIT" or "ROLLBACK"
        self.decided_at: int | None = None  # when a check can learn the outcome; None: never
        self.unaware_checker = False  # the application answers its checks UNKNOW whatever it decided
        self.faults: list[str] = []
        self.first_copy_ts = 0  # the original half's store time
        self.last_copy_ts = 0
        self.max_check_times = 0
        self.max_copy_offset = -1
        self.op_offsets: set[int] = set()  # half offsets listed by op records already stored
        self.resolved_ts: int | None = None
        self.commit_ts: list[int] = []
        self.discard_ts: int | None = None
        self.inflight = 0  # scheduled events and unflushed op entries that still concern it


class HalfEntry:
    """One message in the half queue: the original prepare or a check copy (reference §1.6)."""

    __slots__ = ("check_times", "offset", "phys", "prepared_offset", "store_ts", "txn")

    def __init__(self, offset: int, txn: Txn, store_ts: int, check_times: int | None,
                 prepared_offset: int | None, phys: int) -> None:  # fmt: skip
        self.offset = offset
        self.txn = txn
        self.store_ts = store_ts
        self.check_times = check_times
        self.prepared_offset = prepared_offset
        self.phys = phys


class BrokerState:
    def __init__(self, spec: BrokerSpec) -> None:
        self.name = spec.name
        self.batched_ops = spec.batched_ops
        self.up = True
        self.stalled_until = 0
        self.op_stalled_until = 0
        self.crash_pending = False
        self.phys = 0  # next commit-log physical offset
        # Half queue 0, kept from the flushed check progress on (a crash reverts progress to it).
        self.half: deque[HalfEntry] = deque()
        self.half_base = 0  # offset of half[0]
        self.half_next = 0
        self.progress = 0  # CID_RMQ_SYS_TRANS half progress in memory
        self.flushed_progress = 0  # ... and as last persisted to consumerOffset.json
        self.op_next = 0
        self.op_ctx: list[tuple[int, Txn]] = []  # 5.1+ MessageQueueOpContext for half queue 0
        self.op_ctx_chars = 0
        self.op_last_flush = 0
        self.discard_next = 0
        self.real_next: dict[tuple[str, int], int] = {}
        self.real_store_ts: dict[tuple[str, int], array[int]] = {}  # store time per real queue offset
        self.real_tags: dict[tuple[str, int], list[str | None]] = {}  # tag per real queue offset
        self.offsets: dict[tuple[str, str, int], tuple[int, str | None]] = {}  # (group, topic, qid) -> offset, client
        self.offset_seq = 0
        self.settle_queue: deque[Txn] = deque()  # passed by the flushed progress, waiting to settle

    def half_entry(self, offset: int) -> HalfEntry | None:
        i = offset - self.half_base
        return self.half[i] if 0 <= i < len(self.half) else None


class Producer:
    __slots__ = ("alive", "client_id", "counter", "group", "key_prefix", "skew_ms")

    def __init__(self, group: str, client_id: str, key_prefix: str) -> None:
        self.group = group
        self.client_id = client_id
        self.key_prefix = key_prefix
        self.alive = True
        self.skew_ms = 0  # producer clock minus true time
        self.counter = 0


class Consumer:
    __slots__ = ("alive", "assigned", "client_id", "expression", "group", "memory", "pins", "topics", "versions",
                 "view")  # fmt: skip

    def __init__(self, group: str, client_id: str, topics: tuple[str, ...], expression: str, now: int) -> None:
        self.group = group
        self.client_id = client_id
        self.topics = topics  # its own subscriptions: it rebalances these only (reference §2.3)
        self.expression = expression  # its tag expression, for every topic it subscribes
        # subVersion per topic: when it subscribed, and again whenever its queues of the topic change (§2.1)
        self.versions = dict.fromkeys(topics, now)
        self.view: tuple[str, ...] | None = None  # a stale client list it allocates over; None: the broker's
        self.alive = True
        self.assigned: set[tuple[str, str, int]] = set()  # (topic, broker_name, queue_id)
        self.memory: dict[tuple[str, str, int], int] = {}  # increase-only memory offsets (§3.2)
        self.pins: dict[tuple[str, str, int], tuple[int, int]] = {}  # a slow in-flight message: offset, done at
