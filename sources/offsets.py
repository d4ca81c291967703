"""`config/consumerOffset.json` (reference §3.3): the broker's latest committed offset per group, topic and
queue, and the offset records a new snapshot of it adds. Pure.

The file is fastjson output, not strict JSON: queue ids are bare integer keys (`{0:25,1:28}`). It also
holds what is not a business consumer's offset: the check service's own progress
(`RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS`), retry topics and the broker's and tools' groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sources.fastjson import loads
from sources.records import is_business_topic

QueueKey = tuple[str, str, int]  # consumer group, topic, queue id
# MixAll.isSysConsumerGroupPullMessage (5.3.3): the groups of the broker, its tools and its check service.
SYSTEM_GROUPS = frozenset({"DEFAULT_CONSUMER", "TOOLS_CONSUMER", "SCHEDULE_CONSUMER", "FILTERSRV_CONSUMER",
                           "__MONITOR_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY", "CID_ONSAPI_PERMISSION",
                           "CID_ONSAPI_OWNER", "CID_ONSAPI_PULL"})  # fmt: skip


class OffsetFileError(ValueError):
    """The text is not a consumer-offset table."""


def parse(text: str) -> dict[str, dict[int, int]]:
    """The `offsetTable`: "topic@group" -> {queue id: offset}."""
    try:
        doc = loads(text)
        table = doc["offsetTable"]
        return {key: {int(q): int(o) for q, o in queues.items()} for key, queues in table.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise OffsetFileError(f"not a consumer-offset file ({type(e).__name__}: {e})") from None


def is_business(group: str, topic: str) -> bool:
    return is_business_topic(topic) and group not in SYSTEM_GROUPS and not group.startswith("CID_RMQ_SYS_")


def business_offsets(table: Mapping[str, Mapping[int, int]]) -> tuple[dict[QueueKey, int], int]:
    """The business consumers' offsets, and how many queue entries were skipped as not theirs. Keys
    that are not `topic@group` (e.g. proxy broadcast keys `topic@group@broadcast`) are skipped too."""
    out: dict[QueueKey, int] = {}
    skipped = 0
    for key, queues in table.items():
        parts = key.split("@")
        if len(parts) != 2 or not is_business(parts[1], parts[0]):
            skipped += len(queues)
            continue
        topic, group = parts
        for queue_id, offset in queues.items():
            out[(group, topic, queue_id)] = offset
    return out, skipped


def changed(previous: Mapping[QueueKey, int], current: Mapping[QueueKey, int]) -> list[QueueKey]:
    """The queues whose offset differs from the last snapshot's (or that are new), in a stable order."""
    return sorted(k for k, v in current.items() if previous.get(k) != v)


def offset_record(broker: str, key: QueueKey, offset: int, commit_timestamp: int,
                  seq: int | None = None) -> tuple[Any, ...]:  # fmt: skip
    """A snapshot's offset record: the commit time is the snapshot's, the client unknown; `seq` numbers
    the snapshots of a collector (a file's modification time orders export-store's)."""
    group, topic, queue_id = key
    return (broker, group, topic, queue_id, offset, commit_timestamp, None, seq)
