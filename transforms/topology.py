"""The cluster rules (docs/concepts/topology.md): TOPIC_NOT_ON_BROKER and BROKER_WITHOUT_WRITES, from the
topology stream (schemas.landing.TOPOLOGY) and the writes each broker stored.

The topology is small (a few rows a pass, tables and routes only when they change) and the rules follow it
pass by pass, so they run in the driver as plain Python over its rows: `passes` rebuilds what each pass saw,
`topic_gaps` and `idle_brokers` judge it, `anomaly_rows` writes their findings as anomaly rows. `changes` and
`stored_writes` are what Spark computes for them (the latter kept as running totals in broker_windows); reconcile
collects both (`jobs.reconcile.cluster_anomalies`).

RocketMQ's own delays are not findings (reference: a broker registers with the name server every 30 s,
registerNameServerPeriod; a client asks for routes every 30 s, pollNameServerInterval): a topic must be
missing for `route_delay_ms` before it is TOPIC_NOT_ON_BROKER, and a broker's windows are judged only
`route_delay_ms` after it joined or its topics last changed.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from schemas.landing import HALF_TOPIC, ROCKSDB_HALF_TOPIC
from transforms.lifecycle import DISCARD_TOPIC, Rules

TOPOLOGY_TYPES = ("TOPIC_NOT_ON_BROKER", "BROKER_WITHOUT_WRITES")
# The columns of the topology the rules read.
COLUMNS = ("snapshot_ts", "kind", "cluster", "broker_name", "broker_id", "topic", "read_queues", "write_queues",
           "perm", "table_ts")  # fmt: skip
PERM_WRITE = 2
Queues = tuple[int, int, int]  # read, write, perm


@dataclass(frozen=True)
class Pass:
    """What one collect pass saw: each cluster's masters, and every broker's table and route as they stood."""

    ts: int
    masters: dict[str, frozenset[str]]  # cluster -> its live masters
    tables: dict[str, dict[str, Queues]]  # broker -> topic -> queues (the last table landed at or before ts)
    table_ts: dict[str, int | None]  # broker -> its table's dataVersion timestamp
    changed: dict[str, int]  # broker -> the pass that last landed a new table of it
    routes: dict[str, dict[str, Queues]]  # topic -> broker -> queues (empty: no route)


def passes(rows: Iterable[dict[str, Any]]) -> list[Pass]:
    """Topology rows (any order) as the passes they describe, in time order. A pass is a snapshot with
    member rows; a table or route snapshot without them (export-store's) stands from its time on."""
    by_ts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_ts[r["snapshot_ts"]].append(r)
    tables: dict[str, dict[str, Queues]] = {}
    table_ts: dict[str, int | None] = {}
    changed: dict[str, int] = {}
    routes: dict[str, dict[str, Queues]] = {}
    out = []
    for ts in sorted(by_ts):
        snap = by_ts[ts]
        for r in snap:
            if r["kind"] == "table":
                tables[r["broker_name"]], table_ts[r["broker_name"]], changed[r["broker_name"]] = {}, r["table_ts"], ts
            elif r["kind"] == "route":
                routes[r["topic"]] = {}
        for r in snap:
            if r["kind"] == "topic":
                tables.setdefault(r["broker_name"], {})[r["topic"]] = (r["read_queues"], r["write_queues"], r["perm"])
            elif r["kind"] == "route" and None not in (r["broker_name"], r["write_queues"], r["perm"]):
                routes[r["topic"]][r["broker_name"]] = (r["read_queues"], r["write_queues"], r["perm"])
        masters: dict[str, set[str]] = defaultdict(set)
        for r in snap:
            if r["kind"] == "broker" and r["broker_id"] == 0:
                masters[r["cluster"]].add(r["broker_name"])
        if masters:
            out.append(Pass(ts, {c: frozenset(b) for c, b in masters.items()},
                            {b: dict(t) for b, t in tables.items()}, dict(table_ts), dict(changed),
                            {t: dict(r) for t, r in routes.items()}))  # fmt: skip
    return out


def by_cluster(history: list[Pass]) -> dict[str, list[Pass]]:
    """Each cluster's own passes, seeing its masters alone: a collector per cluster lands passes at its own times,
    and one cluster's pass says nothing about another's."""
    out: dict[str, list[Pass]] = defaultdict(list)
    for p in history:
        for cluster, masters in p.masters.items():
            out[cluster].append(dataclasses.replace(p, masters={cluster: masters}))
    return dict(out)


def _writable(q: Queues | None) -> bool:
    return q is not None and q[1] > 0 and bool(q[2] & PERM_WRITE)


def gaps_in(p: Pass) -> dict[tuple[str, str, str], tuple[str, list[str], str]]:
    """(cluster, broker, topic) -> (reason, the masters serving the topic, the command that fixes it): each live
    master lacking a topic that other masters of its cluster take writes for, or holding it unwritable (in its
    own table, or in the route the name server gives producers)."""
    out = {}
    for cluster, masters in sorted(p.masters.items()):
        known = sorted(m for m in masters if m in p.tables)  # a master whose table was never read is not judged

        def takes(m: str, topic: str) -> bool:
            route = p.routes.get(topic, {})
            return _writable(p.tables[m].get(topic)) and (m not in route or _writable(route[m]))

        for topic in sorted({t for m in known for t in p.tables[m]}):
            serving = [m for m in known if takes(m, topic)]
            if not serving:
                continue  # nobody takes its writes: a read-only topic, not a gap
            widest = max((p.tables[m][topic] for m in serving), key=lambda q: (q[1], q[0]))
            for m in known:
                if m in serving:
                    continue
                own = p.tables[m].get(topic)
                update = f"mqadmin updateTopic -c {cluster} -t {topic} -w {widest[1]} -r {widest[0]}"
                if own is None:
                    reason, fix = "MISSING", update
                elif _writable(own):  # its table takes writes, the name server's route does not (wipeWritePerm)
                    reason, fix = "NOT_WRITABLE", f"mqadmin addWritePerm -b {m}"
                else:
                    reason, fix = "NOT_WRITABLE", f"{update} -p 6"
                out[(cluster, m, topic)] = (reason, serving, fix)
    return out


def topic_gaps(history: list[Pass], as_of: int, rules: Rules) -> list[dict[str, Any]]:
    """TOPIC_NOT_ON_BROKER of every cluster (`cluster_gaps` over its own passes)."""
    return [gap for passes_ in by_cluster(history).values() for gap in cluster_gaps(passes_, as_of, rules)]


def cluster_gaps(history: list[Pass], as_of: int, rules: Rules) -> list[dict[str, Any]]:
    """TOPIC_NOT_ON_BROKER: each run of consecutive passes with the same gap (`gaps_in`), lasting at least
    route_delay_ms (to its end, or to as_of while it goes on). since: its first pass; until: the first pass
    without it (null: it goes on). The detail names the serving masters, the fix and, once it ended, the
    broker's table time then (when the broker last changed its topics, as it tells)."""
    open_: dict[tuple[str, str, str], dict[str, Any]] = {}
    found = []

    def close(key: tuple[str, str, str], until: int | None, p: Pass | None) -> None:
        gap = open_.pop(key)
        if (until if until is not None else as_of) - gap["since"] >= rules.route_delay_ms:
            live = p is not None and any(key[1] in ms for ms in p.masters.values())
            table_ts = p.table_ts.get(key[1]) if live and p is not None else None
            found.append({**gap, "until": until, "table_ts": table_ts})

    for p in history:
        now = gaps_in(p)
        for key in [k for k in open_ if k not in now or now[k][0] != open_[k]["reason"]]:
            close(key, p.ts, p)
        for key, (reason, serving, fix) in now.items():
            if key not in open_:
                open_[key] = {"cluster": key[0], "broker_name": key[1], "topic": key[2], "reason": reason,
                              "since": p.ts}  # fmt: skip
            open_[key].update(served_by=serving, fix=fix)
    for key in sorted(open_):
        close(key, None, None)
    return found


def idle_brokers(history: list[Pass], writes: dict[tuple[str, int], int], as_of: int,
                 rules: Rules) -> list[dict[str, Any]]:  # fmt: skip
    """BROKER_WITHOUT_WRITES of every cluster (`cluster_idle` over its own passes)."""
    return [f for passes_ in by_cluster(history).values() for f in cluster_idle(passes_, writes, as_of, rules)]


def cluster_idle(history: list[Pass], writes: dict[tuple[str, int], int], as_of: int,
                 rules: Rules) -> list[dict[str, Any]]:  # fmt: skip
    """BROKER_WITHOUT_WRITES: windows of idle_window_ms (aligned on the epoch, ended by as_of) in which a master
    stored no message while the other masters of its cluster stored at least idle_min_messages, judged only
    where it was listed in the last pass at or before the window's start and in every pass within it, and
    settled (route_delay_ms after it joined or its table last changed) by the start. `writes`: (broker, window
    index) -> messages stored. Consecutive idle windows are one finding; until is the end of the last one,
    null while the last window ended by as_of is idle."""
    size, times = rules.idle_window_ms, [p.ts for p in history]
    last_window = as_of // size - 1
    settled = _settled(history, rules.route_delay_ms)
    by_window: dict[int, dict[str, int]] = defaultdict(dict)
    for (broker, k), n in writes.items():
        if k <= last_window:
            by_window[k][broker] = n
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    found = []
    previous = None
    for k in sorted(by_window):  # a window nobody stored in is idle for no one: it ends every run
        start, end = k * size, (k + 1) * size
        first = bisect.bisect_right(times, start)
        before, within = (history[first - 1] if first else None), history[first : bisect.bisect_left(times, end)]
        if previous is not None and k != previous + 1:
            found += [{**r, "until": (previous + 1) * size} for r in runs.values()]
            runs = {}
        previous = k
        if before is None:  # before the first pass: nobody is known, and no run has begun
            continue
        idle_now = set()
        for cluster, masters in sorted(before.masters.items()):
            listed = set().union(*(p.masters.get(cluster, frozenset()) for p in [before, *within]))
            for broker in sorted(masters):
                if (
                    by_window[k].get(broker, 0)
                    or settled[(first - 1, cluster, broker)] > start
                    or not all(broker in p.masters.get(cluster, frozenset()) for p in within)
                ):
                    continue
                others = {b: n for b, n in by_window[k].items() if b in listed and b != broker}
                if sum(others.values()) < rules.idle_min_messages:
                    continue
                run = runs.setdefault(
                    (cluster, broker),
                    {
                        "cluster": cluster,
                        "broker_name": broker,
                        "since": start,
                        "windows": 0,
                        "cluster_messages": 0,
                        "stored_by": set(),
                    },
                )
                run["windows"] += 1
                run["cluster_messages"] += sum(others.values())
                run["stored_by"] |= set(others)
                idle_now.add((cluster, broker))
        for key in [key for key in runs if key not in idle_now]:
            found.append({**runs.pop(key), "until": start})
    ended = None if previous is None or previous == last_window else (previous + 1) * size
    found += [{**r, "until": ended} for r in runs.values()]
    return [{**f, "stored_by": sorted(f["stored_by"])} for f in found]


def _settled(history: list[Pass], route_delay_ms: int) -> dict[tuple[int, str, str], int]:
    """(pass index, cluster, master) -> when its routes can have settled: route_delay_ms after the run of passes
    listing it began or the pass that landed its table last, whichever is later."""
    out: dict[tuple[int, str, str], int] = {}
    joined: dict[tuple[str, str], int] = {}
    for i, p in enumerate(history):
        here = {(c, b) for c, ms in p.masters.items() for b in ms}
        joined = {key: joined.get(key, p.ts) for key in here}
        for c, b in here:
            out[(i, c, b)] = max(joined[(c, b)], p.changed.get(b, p.ts)) + route_delay_ms
    return out


def _id(*parts: Any) -> str:
    return hashlib.sha256("|".join("" if p is None else str(p) for p in parts).encode()).hexdigest()


def anomaly_rows(gaps: list[dict[str, Any]], idle: list[dict[str, Any]], as_of: int,
                 window_ms: int) -> list[dict[str, Any]]:  # fmt: skip
    """The findings as rows of the anomalies schema."""
    rows = []
    for g in gaps:
        detail = {"cluster": g["cluster"], "since": g["since"], "until": g["until"], "ongoing": g["until"] is None,
                  "served_by": g["served_by"], "fix": g["fix"], "table_ts": g["table_ts"]}  # fmt: skip
        rows.append(_row("TOPIC_NOT_ON_BROKER", g["reason"], g, g["topic"], detail, as_of))
    for i in idle:
        detail = {"cluster": i["cluster"], "since": i["since"], "until": i["until"], "ongoing": i["until"] is None,
                  "windows": i["windows"], "window_ms": window_ms, "cluster_messages": i["cluster_messages"],
                  "stored_by": i["stored_by"]}  # fmt: skip
        rows.append(_row("BROKER_WITHOUT_WRITES", None, i, None, detail, as_of))
    return rows


def _row(kind: str, reason: str | None, f: dict[str, Any], topic: str | None, detail: dict[str, Any],
         as_of: int) -> dict[str, Any]:  # fmt: skip
    return {"anomaly_id": _id(kind, f["cluster"], f["broker_name"], topic, f["since"]), "anomaly_type": kind,
            "reason": reason, "broker_name": f["broker_name"], "uniq_key": None, "consumer_group": None,
            "topic": topic, "queue_id": None, "event_ts": f["since"], "as_of": as_of,
            "detail": json.dumps(detail, separators=(",", ":"))}  # fmt: skip


def stored_writes(half_df: DataFrame, real_df: DataFrame, window_ms: int) -> DataFrame:
    """(broker_name, window_ts, messages): what producers stored per broker and window, broker_windows' rows:
    original halves (a check copy is the broker's own) and business messages (not discards)."""
    halves = half_df.where(F.col("check_times").isNull() & F.col("topic").isin(HALF_TOPIC, ROCKSDB_HALF_TOPIC))
    messages = real_df.where(F.col("topic") != DISCARD_TOPIC)
    stores = [df.select("broker_name", "store_timestamp") for df in (halves, messages)]
    window = (F.floor(F.col("store_timestamp") / window_ms) * window_ms).cast("long")
    return (
        stores[0].unionByName(stores[1])
        .groupBy("broker_name", window.alias("window_ts"))
        .agg(F.count(F.lit(1)).alias("messages"))
    )  # fmt: skip


def last_whole_window(as_of: int, window_ms: int) -> int:
    """The start of the last window that ended by `as_of` (the one `as_of` falls in is still filling)."""
    return (as_of // window_ms - 1) * window_ms


def window_totals(windows: DataFrame) -> DataFrame:
    """(broker_name, window_ts, messages) per broker and window: the sum of broker_windows' rows of each, which
    an incremental reconcile adds to."""
    return windows.groupBy("broker_name", "window_ts").agg(F.sum("messages").cast("long").alias("messages"))


def changes(topology_df: DataFrame) -> DataFrame:
    """The topology rows the rules need: every table and route row, and each cluster's member rows of the passes
    that list other masters than its pass before, land a table or a route, or are its last. A pass like the one
    before it that lands nothing says nothing new, and a service lands one every cycle: the driver gets the
    changes."""
    kind = F.col("kind")
    members = topology_df.where(kind == "broker")
    master = F.when(F.col("broker_id") == 0, F.col("broker_name"))
    order = Window.partitionBy("cluster").orderBy("snapshot_ts")
    passes = members.groupBy("cluster", "snapshot_ts").agg(F.sort_array(F.collect_list(master)).alias("masters"))
    landing = topology_df.where(kind != "broker").select("snapshot_ts").distinct().withColumn("lands", F.lit(True))
    kept = (
        passes.join(landing, on="snapshot_ts", how="left")
        .withColumn("before", F.lag("masters").over(order)).withColumn("next", F.lead("snapshot_ts").over(order))
        .where(F.col("before").isNull() | (F.col("masters") != F.col("before")) | F.col("lands").isNotNull()
               | F.col("next").isNull())
        .select("cluster", "snapshot_ts")
    )  # fmt: skip
    return topology_df.where(kind != "broker").unionByName(members.join(kept, ["cluster", "snapshot_ts"], "left_semi"))
