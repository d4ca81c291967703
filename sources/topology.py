"""The topology stream's records (schemas.landing.TOPOLOGY): the cluster's members, each master's business
topics and each business topic's route, as `collect` reads them from a name server and its brokers and as
`export-store` reads one broker's `config/topics.json`.

Members are landed every pass: they say who was live when we looked. A broker's table and a topic's route
are landed only when they differ from what was landed last (`Landed`), so a cluster that does not change
adds a few rows per pass; a reader takes what a snapshot does not land from the last one that did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sources.client import Member, Queues
from sources.fastjson import FastjsonError, loads
from sources.landing_files import read_state, write_state
from sources.records import is_business_topic

PERM_INHERIT = 1  # PermName.PERM_INHERIT: set on the topics a broker makes for itself (TopicConfigManager)
REPLY_SUFFIX = "_REPLY_TOPIC"  # <cluster>_REPLY_TOPIC, every broker's own (MixAll.REPLY_TOPIC_POSTFIX)
Record = tuple[Any, ...]
Table = tuple[int | None, dict[str, Queues]]  # the table's dataVersion timestamp, topic -> queues
Route = dict[str, tuple[str | None, Queues]] | None  # broker -> (cluster, queues); None: no route


def business(broker: str, table: Mapping[str, Queues]) -> dict[str, Queues]:
    """The topics of a broker's table that applications write: not a system topic, not one the broker made
    for itself at start (its name, its cluster's, the reply topic: PERM_INHERIT marks those)."""
    return {
        t: q
        for t, q in table.items()
        if is_business_topic(t) and not q.perm & PERM_INHERIT and t != broker and not t.endswith(REPLY_SUFFIX)
    }


def member_record(ts: int, m: Member) -> Record:
    return (ts, "broker", m.cluster, m.broker_name, m.broker_id, m.address, None, None, None, None, None)


def table_records(ts: int, broker: str, cluster: str | None, table: Table) -> list[Record]:
    stamp, topics = table
    head: Record = (ts, "table", cluster, broker, None, None, None, None, None, None, stamp)
    return [head] + [(ts, "topic", cluster, broker, None, None, t, q.read, q.write, q.perm, None)
                     for t, q in sorted(topics.items())]  # fmt: skip


def route_records(ts: int, topic: str, route: Route) -> list[Record]:
    if not route:
        return [(ts, "route", None, None, None, None, topic, None, None, None, None)]
    return [(ts, "route", cluster, broker, None, None, topic, q.read, q.write, q.perm, None)
            for broker, (cluster, q) in sorted(route.items())]  # fmt: skip


def _table_doc(table: Table) -> Any:
    return [table[0], {t: [q.read, q.write, q.perm] for t, q in sorted(table[1].items())}]


def _route_doc(route: Route) -> Any:
    return None if not route else {b: [c, q.read, q.write, q.perm] for b, (c, q) in sorted(route.items())}


@dataclass
class Landed:
    """What the topology records landed so far say: each broker's table and each topic's route, as JSON-ready
    documents, kept in `<landing>/_collect/topology/landed.json` between passes."""

    tables: dict[str, Any] = field(default_factory=dict)
    routes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Landed:
        def build(doc: Any) -> Landed:
            return cls(dict(doc["tables"]), dict(doc["routes"]))

        return read_state(path, build, "a topology state file", "to land the whole topology again") or cls()

    def save(self, path: Path) -> None:
        write_state(path, {"tables": self.tables, "routes": self.routes})


def snapshot(ts: int, members: Iterable[Member], tables: Mapping[str, tuple[str | None, Table]],
             routes: Mapping[str, Route], landed: Landed) -> list[Record]:  # fmt: skip
    """One pass's records: every member, and the tables (broker -> its cluster and table, business topics
    only) and routes that changed since `landed`, which is updated to them."""
    out = [member_record(ts, m) for m in sorted(members, key=lambda m: (m.cluster, m.broker_name, m.broker_id))]
    for broker, (cluster, table) in sorted(tables.items()):
        doc = _table_doc(table)
        if landed.tables.get(broker) != doc:
            out += table_records(ts, broker, cluster, table)
            landed.tables[broker] = doc
    for topic, route in sorted(routes.items()):
        doc = _route_doc(route)
        if topic not in landed.routes or landed.routes[topic] != doc:
            out += route_records(ts, topic, route)
            landed.routes[topic] = doc
    return out


class TopicsFileError(Exception):
    """config/topics.json cannot be read as a topic table."""


def parse_topics_file(text: str) -> Table:
    """A broker's config/topics.json (TopicConfigSerializeWrapper): its dataVersion timestamp and topics."""
    try:
        doc = loads(text)
        stamp = (doc.get("dataVersion") or {}).get("timestamp")
        table = {str(t): Queues(int(c["readQueueNums"]), int(c["writeQueueNums"]), int(c["perm"]))
                 for t, c in (doc.get("topicConfigTable") or {}).items()}  # fmt: skip
        return (None if stamp is None else int(stamp)), table
    except (FastjsonError, AttributeError, KeyError, TypeError, ValueError) as e:
        raise TopicsFileError(f"not a topic table ({type(e).__name__}: {e})") from None
