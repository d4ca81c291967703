"""Consumer queue allocation, exactly as RocketMQ's client strategies compute it (reference §2.3-2.5).

Queues are `(topic, broker_name, queue_id)` tuples; client ids are strings. Like
`RebalanceImpl.rebalanceByTopic`, `allocate` sorts both lists first (queues by topic, broker name,
queue id; client ids as Java sorts strings, by UTF-16 code unit), then applies the named strategy.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

MessageQueue = tuple[str, str, int]

STRATEGIES = ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "CONFIG", "MACHINE_ROOM")


def allocate(
    strategy: str,
    consumer_group: str,
    current_cid: str,
    mq_all: Iterable[MessageQueue],
    cid_all: Iterable[str],
    **options: Any,
) -> list[MessageQueue]:
    """The queues `current_cid` owns. Raises ValueError where RocketMQ throws IllegalArgumentException.

    Options: `virtual_nodes` (CONSISTENT_HASH, default 10), `message_queue_list` (CONFIG),
    `consumeridcs` (MACHINE_ROOM: the machine rooms this group consumes from).
    """
    if strategy == "CONFIG":  # AllocateMessageQueueByConfig: no checks, the same list for everyone
        return list(options.get("message_queue_list") or [])
    mqs = sorted(mq_all, key=_queue_order)
    cids = sorted(cid_all, key=_java_string_order)
    if not _check(current_cid, mqs, cids):
        return []
    idx = cids.index(current_cid)
    if strategy == "AVG":
        return _averagely(mqs, len(cids), idx)
    if strategy == "AVG_BY_CIRCLE":
        return [mqs[i] for i in range(idx, len(mqs)) if i % len(cids) == idx]
    if strategy == "CONSISTENT_HASH":
        return _consistent_hash(mqs, cids, current_cid, options.get("virtual_nodes", 10))
    if strategy == "MACHINE_ROOM":
        return _machine_room(mqs, len(cids), idx, options.get("consumeridcs") or ())
    raise ValueError(f"unknown allocation strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")


def queue_string(mq: MessageQueue) -> str:
    """`MessageQueue.toString()`, the key ConsistentHash routes on."""
    topic, broker_name, queue_id = mq
    return f"MessageQueue [topic={topic}, brokerName={broker_name}, queueId={queue_id}]"


def md5_hash(key: str) -> int:
    """The default `MD5Hash`: the first 4 digest bytes as an unsigned big-endian number."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


def _check(current_cid: str, mqs: Sequence[MessageQueue], cids: Sequence[str]) -> bool:
    """`AbstractAllocateMessageQueueStrategy.check`: bad arguments raise; an unknown client gets nothing."""
    if not current_cid:
        raise ValueError("currentCID is empty")
    if not mqs:
        raise ValueError("mqAll is null or mqAll empty")
    if not cids:
        raise ValueError("cidAll is null or cidAll empty")
    return current_cid in cids


def _averagely(mqs: Sequence[MessageQueue], c: int, idx: int) -> list[MessageQueue]:
    n = len(mqs)
    mod = n % c
    if n <= c:
        avg = 1
    elif mod > 0 and idx < mod:
        avg = n // c + 1
    else:
        avg = n // c
    start = idx * avg if mod > 0 and idx < mod else idx * avg + mod
    size = min(avg, n - start)
    return list(mqs[start : start + max(size, 0)])


def _consistent_hash(
    mqs: Sequence[MessageQueue], cids: Sequence[str], current_cid: str, virtual_nodes: int
) -> list[MessageQueue]:
    if virtual_nodes < 0:
        raise ValueError(f"illegal virtual node counts :{virtual_nodes}")
    ring: dict[int, str] = {}
    for cid in cids:  # a later virtual node with a colliding hash overwrites, as in a TreeMap.put
        for r in range(virtual_nodes):
            ring[md5_hash(f"{cid}-{r}")] = cid
    if not ring:
        return []
    points = sorted(ring)
    owned = []
    for mq in mqs:
        i = bisect.bisect_left(points, md5_hash(queue_string(mq)))
        if ring[points[i % len(points)]] == current_cid:
            owned.append(mq)
    return owned


def _machine_room(mqs: Sequence[MessageQueue], c: int, idx: int, rooms: Iterable[str]) -> list[MessageQueue]:
    wanted = set(rooms)
    pre = []
    for mq in mqs:
        parts = _java_split(mq[1], "@")
        if len(parts) == 2 and parts[0] in wanted:
            pre.append(mq)
    mod, rem = divmod(len(pre), c)
    result = pre[idx * mod : idx * mod + mod]
    if rem > idx:
        result.append(pre[idx + mod * c])
    return result


def _java_split(text: str, sep: str) -> list[str]:
    """`String.split` with a literal separator: trailing empty strings are removed."""
    if sep not in text:
        return [text]
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _java_string_order(text: str) -> bytes:
    # Java compares strings by UTF-16 code unit; big-endian UTF-16 bytes sort the same way.
    return text.encode("utf-16-be", "surrogatepass")


def _queue_order(mq: MessageQueue) -> tuple[bytes, bytes, int]:
    return (_java_string_order(mq[0]), _java_string_order(mq[1]), mq[2])
