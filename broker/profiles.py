"""Named fault profiles and the broker settings the model runs with.

Rates are probabilities per transaction (or per rebalance hand-off); schedules are counts of
incidents spread over the run by the seeded RNG, each with a duration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class BrokerSettings:
    """Broker settings (reference §1.1 defaults); the pipeline's rules use the same values."""

    transaction_timeout_ms: int = 6000
    check_interval_ms: int = 30000
    check_max: int = 15
    file_reserved_hours: int = 72
    op_batch_interval_ms: int = 3000
    op_msg_max_size: int = 4096  # transactionOpMsgMaxSize, characters
    op_context_capacity: int = 20000  # entries a half queue's MessageQueueOpContext holds (fixed in the broker)
    offset_flush_interval_ms: int = 5000  # flushConsumerOffsetInterval (also half/op check progress)


@dataclass(frozen=True)
class Profile:
    name: str
    # Workload.
    txn_per_second: float = 200.0  # virtual arrival rate of transactions
    commit_ratio: float = 0.9  # share of local transactions that commit (the rest roll back)
    plain_ratio: float = 0.1  # extra non-transactional messages per transaction
    immunity_ratio: float = 0.0  # transactions sent with CHECK_IMMUNITY_TIME_IN_SECONDS
    slow_consume_ratio: float = 0.001  # messages whose processing pins the committed offset
    poison_ratio: float = 0.0  # messages a consumer group fails every time: retried, then dead-lettered
    drain_ms: int = 120_000  # virtual time the run goes on after the last send
    # Producer faults (per transaction).
    producer_crash: float = 0.0  # the sending instance dies right after its half is stored; back in 3-10 s
    lost_end: float = 0.0  # a one-way end-transaction request (or check reply) is lost
    unknown_answer: float = 0.0  # executeLocalTransaction returns UNKNOW; the state is decided later
    never_decided: float = 0.0  # the local transaction's state never becomes known (checks say UNKNOW)
    slow_local_txn: float = 0.0  # executeLocalTransaction returns COMMIT minutes later
    duplicate_end: float = 0.0  # the end-transaction request is sent twice
    unaware_checker: float = 0.0  # the application answers every check UNKNOW, even once it has decided
    # Scheduled incidents (count over the run).
    skewed_producers: int = 0  # producer instances whose clock is behind by more than fileReservedTime
    producer_group_offline: int = 0  # every instance of one group down for 8-10 minutes
    broker_crash: int = 0  # broker process crash: unflushed op batch and progress lost, 10 s down
    check_stall: int = 0  # the check service makes no pass for 2-4 minutes
    op_stall: int = 0  # the op batch service writes no op for 30-90 s: checks reach resolved transactions
    consumer_crash: int = 0  # a consumer dies without persisting; restarts 30 s later
    consumer_scale: int = 0  # a consumer joins or leaves gracefully (rebalance hand-off)
    offset_reset: int = 0  # an admin resets a group's offsets on one topic back in time
    offset_skip: int = 0  # an admin resets a group's offsets on one topic to its end, skipping the backlog
    subscription_drift: int = 0  # a member deployed with other subscriptions joins its group for 3-6 minutes
    stale_client_list: int = 0  # a member allocates over a client list missing one member, for 90-180 s
    tag_drift: int = 0  # a member joins with a tag expression where the others take every tag, for 3-6 min
    broker_join: int = 0  # broker-c joins the cluster early and is never given the topics (broker/cluster.py)
    auto_created_topic: int = 0  # a producer's first send auto-creates a topic on broker-a, which keeps it alone
    write_perm_loss: int = 0  # a topic's queues on broker-b are made read-only for 2-4 minutes
    # Per rebalance hand-off: the previous owner's final offset commit lands late.
    stale_offset_commit: float = 0.0
    # Message trace (broker/trace.py): the first this many producer and consumer groups (by name) trace; a
    # share of their trace contexts is lost. A check request can be lost on its way to a live producer.
    traced_producer_groups: int = 0
    traced_consumer_groups: int = 0
    trace_loss: float = 0.0
    lost_check: float = 0.0
    check_outage: int = 0  # no check request reaches any producer for 8-10 minutes

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not 0.0 <= value <= (1e9 if f.name == "txn_per_second" else 1.0):
                raise ValueError(f"profile {self.name}: {f.name} out of range: {value}")
            if isinstance(value, int) and value < 0:
                raise ValueError(f"profile {self.name}: {f.name} must not be negative: {value}")


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("clean", slow_consume_ratio=0.0, drain_ms=60_000),
        Profile(
            "default",
            drain_ms=360_000,
            immunity_ratio=0.02,
            producer_crash=0.0005,
            lost_end=0.004,
            unknown_answer=0.01,
            never_decided=0.001,
            slow_local_txn=0.0005,
            duplicate_end=0.001,
            unaware_checker=0.005,
            producer_group_offline=1,
            broker_crash=1,
            check_stall=1,
            op_stall=1,
            consumer_crash=1,
            consumer_scale=2,
            offset_reset=1,
            stale_offset_commit=0.2,
            broker_join=1,
            auto_created_topic=1,
            write_perm_loss=1,
            traced_producer_groups=2,
            traced_consumer_groups=1,
            trace_loss=0.01,
            lost_check=0.002,
            check_outage=1,
        ),
        Profile(
            "chaos",
            drain_ms=360_000,
            poison_ratio=0.02,
            immunity_ratio=0.05,
            slow_consume_ratio=0.01,
            producer_crash=0.001,
            lost_end=0.03,
            unknown_answer=0.05,
            never_decided=0.01,
            slow_local_txn=0.005,
            duplicate_end=0.01,
            unaware_checker=0.1,
            skewed_producers=1,
            producer_group_offline=2,
            broker_crash=3,
            check_stall=2,
            op_stall=2,
            consumer_crash=3,
            consumer_scale=4,
            offset_reset=2,
            offset_skip=1,
            subscription_drift=2,
            stale_client_list=2,
            tag_drift=2,
            stale_offset_commit=0.6,
            broker_join=1,
            auto_created_topic=1,
            write_perm_loss=2,
            traced_producer_groups=2,
            traced_consumer_groups=3,
            trace_loss=0.05,
            lost_check=0.02,
        ),
    )
}
