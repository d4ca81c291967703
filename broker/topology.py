"""The simulated cluster: brokers, topics, producer and consumer groups, and RocketMQ-shaped ids."""

from __future__ import annotations

from dataclasses import dataclass

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # reference §1.1: the real name has the extra underscore
OP_TAG = "d"
TAG = "TagA"  # the one tag the model's transactional messages carry (about half of them)
SYS_FLAG_COMMIT = 0x8  # MessageSysFlag.TRANSACTION_COMMIT_TYPE (reference §4.3)

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, virtual time zero


@dataclass(frozen=True)
class BrokerSpec:
    name: str
    batched_ops: bool  # 5.1+ writes "a,b,c," op bodies in batches; <= 5.0 one op per end request


@dataclass(frozen=True)
class ProducerGroupSpec:
    name: str
    topic: str
    instances: int
    weight: float


@dataclass(frozen=True)
class ConsumerGroupSpec:
    name: str
    topics: tuple[str, ...]
    strategy: str
    members: int


BROKERS = (BrokerSpec("broker-a", batched_ops=True), BrokerSpec("broker-b", batched_ops=False))
TOPICS = {"orders": 4, "payments": 4, "audit-log": 2}  # write queues per broker
PRODUCER_GROUPS = (
    ProducerGroupSpec("pg-orders", "orders", instances=3, weight=0.6),
    ProducerGroupSpec("pg-payments", "payments", instances=2, weight=0.4),
)
CONSUMER_GROUPS = (
    ConsumerGroupSpec("cg-billing", ("orders",), "AVG", members=3),
    ConsumerGroupSpec("cg-analytics", ("orders", "payments", "audit-log"), "AVG_BY_CIRCLE", members=2),
    ConsumerGroupSpec("cg-audit", ("payments", "audit-log"), "CONSISTENT_HASH", members=2),
)


def client_ip(n: int) -> str:
    return f"10.0.{n // 250}.{n % 250 + 1}"


def client_id(ip: str, pid: int, nanotime: int) -> str:
    """`ClientConfig.buildMQClientId` in clustering mode: ip@pid#nanotime (reference §2.3)."""
    return f"{ip}@{pid}#{nanotime}"


def uniq_key_prefix(ip: str, pid: int, loader_hash: int) -> str:
    """The fixed part of a producer's UNIQ_KEYs: hex of IP(4) + pid(2) + class-loader hash(4) (§4.4)."""
    ip_hex = "".join(f"{int(part):02X}" for part in ip.split("."))
    return f"{ip_hex}{pid & 0xFFFF:04X}{loader_hash & 0xFFFFFFFF:08X}"


def uniq_key(prefix: str, now_ms: int, counter: int) -> str:
    """UNIQ_KEY: the producer's prefix + ms since the start of the month(4) + counter(2), 32 hex digits."""
    return f"{prefix}{(now_ms - START_MS) & 0xFFFFFFFF:08X}{counter & 0xFFFF:04X}"
