"""A consumer group's snapshot as `consumer` landing records (DESIGN §1), from the answers RocketMQ's
admin tools read (`mqadmin consumerConnection`, `consumerStatus`): each broker's connection list with
the subscription table it keeps, and each member's running info (its own subscriptions, and the queues it
holds with its in-memory offset, `ProcessQueueInfo.commitOffset` = MEMORY_FIRST_THEN_STORE).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sources.client import HeldQueue

Member = tuple[list[dict[str, Any]], list[HeldQueue]]  # subscriptions (SubscriptionData), held queues


def snapshot_records(snapshot_ts: int, group: str, tables: Mapping[str, Mapping[str, Any]],
                     members: Mapping[str, Member]) -> list[tuple[Any, ...]]:  # fmt: skip
    """Records in CONSUMER field order. `tables`: broker name -> its ConsumerConnection answer; `members`:
    client id -> its running info. A queue being dropped (a rebalance took it away) is not held; a held
    queue's offset is null while the member has none for it yet (`commitOffset` -1: nothing consumed or
    committed, e.g. a retry queue that never had a message)."""
    out: list[tuple[Any, ...]] = []
    for client_id, (subscriptions, held) in sorted(members.items()):
        for sub in sorted(subscriptions, key=lambda s: s["topic"]):
            out.append((snapshot_ts, group, "subscription", client_id, sub["topic"], sub.get("subString"), None, None,
                        None))  # fmt: skip
        for q in held:
            if not q.dropped:
                offset = q.commit_offset if q.commit_offset >= 0 else None
                out.append((snapshot_ts, group, "queue", client_id, q.topic, None, q.broker_name, q.queue_id, offset))
    for broker, connection in sorted(tables.items()):
        for topic, sub in sorted((connection.get("subscriptionTable") or {}).items()):
            out.append((snapshot_ts, group, "subscription", None, topic, sub.get("subString"), broker, None, None))
    return out


def client_ids(connection: Mapping[str, Any]) -> list[str]:
    return sorted(c["clientId"] for c in connection.get("connectionSet") or [])
