"""The cluster as the name server and the brokers' topic tables show it, and the incidents that leave a broker
without writes (issue 43): a broker that joins and is never given the topics, a topic auto-created on one
broker by its first message, and a topic whose queues on one broker lose their write permission for a while.

Every `SNAPSHOT_MS` it lands what a `collect` pass would (schemas.landing.TOPOLOGY): the live brokers every
time, a broker's table and a topic's route when they changed. Its truth follows the same snapshots one at a
time: a gap opens at the first snapshot that shows it and closes at the first that does not; a window's
writes are counted as the store takes them. Nothing here draws from the simulation's own random streams, so
every other incident and transaction happens as it would without these (the refunds messages only move later
commit-log positions on broker-a).
"""

from __future__ import annotations

import bisect
import random
from array import array
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from broker.events import P_CONTROL, P_SNAPSHOT
from broker.state import Producer
from broker.topology import BROKERS, DISCARD_TOPIC, START_MS, TOPICS, client_id, uniq_key_prefix

if TYPE_CHECKING:
    from broker.simulation import Simulation

CLUSTER = "DefaultCluster"
SNAPSHOT_MS = 10_000  # a collect pass every 10 s
JOINING = "broker-c"  # the broker added mid-run that nobody gives the topics
AUTO_TOPIC = "refunds"  # auto-created on the broker that takes its first message, and left there
READ_ONLY_TOPIC = "audit-log"  # loses write permission on one broker for a while
RW, READ_ONLY = 6, 4  # PermName: read 4 + write 2
Queues = tuple[int, int, int]  # read, write, perm


class Cluster:
    def __init__(self, sim: Simulation, seed: int) -> None:
        self.sim = sim
        self.rng = random.Random(seed + 0xC1A5)
        start = START_MS - 3_600_000  # the tables were last changed before the run
        self.tables: dict[str, dict[str, Queues]] = {
            b.name: {t: (n, n, RW) for t, n in TOPICS.items()} for b in BROKERS
        }
        self.table_ts: dict[str, int] = {b.name: start for b in BROKERS}
        self.members = [b.name for b in BROKERS]  # the brokers of the cluster, up or not
        self.landed_tables: dict[str, Any] = {}
        self.landed_routes: dict[str, Any] = {}
        self.writes: dict[tuple[str, int], int] = defaultdict(int)  # (broker, window) -> messages stored
        self.history: list[tuple[int, frozenset[str], dict[str, int]]] = []  # (ts, live masters, table changes)
        self.open: dict[tuple[str, str], dict[str, Any]] = {}  # (broker, topic) -> the gap going on
        self.auto = Producer("pg-refunds", client_id("10.9.0.1", 4242, 1), uniq_key_prefix("10.9.0.1", 4242, 0xC1A5))

    def start(self, span: tuple[int, int]) -> None:
        sim, p, rng = self.sim, self.sim.profile, self.rng
        sim.at(START_MS, P_SNAPSHOT, self.snapshot)
        for _ in range(p.broker_join):
            sim.at(rng.randint(START_MS + 5_000, START_MS + 20_000), P_CONTROL, self.join)
        for _ in range(p.auto_created_topic):
            sim.at(rng.randint(START_MS + 5_000, START_MS + 15_000), P_CONTROL, self.auto_create)
        for _ in range(p.write_perm_loss):
            sim.at(rng.randint(*span), P_CONTROL, self.read_only, rng.randint(120_000, 240_000))

    # ---- incidents -------------------------------------------------------------------------------

    def _change(self, broker: str, topic: str, queues: Queues) -> None:
        self.tables[broker][topic] = queues
        self.table_ts[broker] = self.sim.now

    def join(self, _: Any) -> None:
        """A broker starts and registers: its table holds only the topics it makes for itself."""
        if JOINING not in self.members:
            self.members.append(JOINING)
            self.tables[JOINING], self.table_ts[JOINING] = {}, self.sim.now

    def auto_create(self, _: Any) -> None:
        """A producer sends to a topic nobody created: broker-a takes the first message and creates it with
        the default 4 queues; the route then names broker-a alone, so every later message goes there too."""
        b = self.sim.brokers[BROKERS[0].name]
        if b.up and AUTO_TOPIC not in self.tables[b.name]:
            self._change(b.name, AUTO_TOPIC, (4, 4, RW))
            for q in range(4):
                b.real_next[(AUTO_TOPIC, q)], b.real_store_ts[(AUTO_TOPIC, q)], b.real_tags[(AUTO_TOPIC, q)] = (
                    0,
                    array("q"),
                    [],
                )
            self.send_auto(None)

    def send_auto(self, _: Any) -> None:
        """The refunds producer: a message every few seconds while the business traffic goes on."""
        sim = self.sim
        b = sim.brokers[BROKERS[0].name]
        if b.up:
            sim.store.store_real(b, AUTO_TOPIC, self.rng.randrange(4), None, self.auto)
        if sim.sent < sim.n:
            sim.at(sim.now + self.rng.randint(1_000, 5_000), P_CONTROL, self.send_auto)

    def read_only(self, lasting_ms: int) -> None:
        """An operator sets the topic's queues on broker-b read-only (updateTopic -p 4), and back later."""
        broker = BROKERS[1].name
        read, write, _ = self.tables[broker][READ_ONLY_TOPIC]
        self._change(broker, READ_ONLY_TOPIC, (read, write, READ_ONLY))
        self.sim.at(self.sim.now + lasting_ms, P_CONTROL, self.restore, (broker, read, write))

    def restore(self, arg: tuple[str, int, int]) -> None:
        broker, read, write = arg
        self._change(broker, READ_ONLY_TOPIC, (read, write, RW))

    def writable(self, broker: str, topic: str) -> bool:
        """Whether producers' routes let them write `topic` to `broker`."""
        q = self.tables.get(broker, {}).get(topic)
        return q is not None and q[1] > 0 and bool(q[2] & 2)

    def stored(self, stream: str, rec: tuple[Any, ...]) -> None:
        """A record was landed: count the producers' writes (original halves, business messages)."""
        if stream == "half" and rec[11] is None:  # HALF field order: check_times at 11, store_timestamp at 4
            self.writes[(rec[0], rec[4] // self.sim.thresholds.idle_window_ms)] += 1
        elif stream == "real" and rec[1] != DISCARD_TOPIC:  # REAL: store_timestamp at 5
            self.writes[(rec[0], rec[5] // self.sim.thresholds.idle_window_ms)] += 1

    # ---- snapshots -------------------------------------------------------------------------------

    def live(self) -> list[str]:
        up = {name: b.up for name, b in self.sim.brokers.items()}
        return [m for m in self.members if up.get(m, True)]

    def snapshot(self, _: Any) -> None:
        sim, now = self.sim, self.sim.now
        live = self.live()
        for m in live:
            address = f"10.1.0.{self.members.index(m) + 1}:10911"
            sim.emit("topology", (now, "broker", CLUSTER, m, 0, address, None, None, None, None, None), now)
        changed = {}
        for m in live:
            doc = (self.table_ts[m], sorted(self.tables[m].items()))
            if self.landed_tables.get(m) != doc:
                self.landed_tables[m] = doc
                changed[m] = now
                sim.emit(
                    "topology", (now, "table", CLUSTER, m, None, None, None, None, None, None, self.table_ts[m]), now
                )
                for t, (r, w, perm) in sorted(self.tables[m].items()):
                    sim.emit("topology", (now, "topic", CLUSTER, m, None, None, t, r, w, perm, None), now)
        for topic in sorted({t for m in live for t in self.tables[m]}):
            route = sorted((m, self.tables[m][topic]) for m in live if topic in self.tables[m])
            if self.landed_routes.get(topic) != route:
                self.landed_routes[topic] = route
                for m, (r, w, perm) in route:
                    sim.emit("topology", (now, "route", CLUSTER, m, None, None, topic, r, w, perm, None), now)
        self.history.append((now, frozenset(live), changed))
        self._follow_gaps(now, live)
        sim.at(now + SNAPSHOT_MS, P_SNAPSHOT, self.snapshot)

    # ---- truth -----------------------------------------------------------------------------------

    def _follow_gaps(self, now: int, live: list[str]) -> None:
        """TOPIC_NOT_ON_BROKER as the snapshots show it: open on the first that has a gap, close on the first
        that does not (or has it for another reason)."""
        gaps = {}
        for topic in sorted({t for m in live for t in self.tables[m]}):
            serving = [m for m in live if self.writable(m, topic)]
            for m in live if serving else ():
                if m not in serving:
                    gaps[(m, topic)] = ("MISSING" if topic not in self.tables[m] else "NOT_WRITABLE", serving)
        for key in [k for k, g in self.open.items() if k not in gaps or gaps[k][0] != g["reason"]]:
            self._close(key, now, self.table_ts[key[0]] if key[0] in live else None)
        for (m, topic), (reason, serving) in gaps.items():
            gap = self.open.setdefault((m, topic), {"reason": reason, "since": now})
            gap["served_by"] = serving

    def _close(self, key: tuple[str, str], until: int | None, table_ts: int | None) -> None:
        gap = self.open.pop(key)
        if (until if until is not None else self.sim.summary.as_of) - gap["since"] < self.sim.thresholds.route_delay_ms:
            return
        self.sim.truth_anomaly({
            "anomaly_type": "TOPIC_NOT_ON_BROKER", "reason": gap["reason"], "broker_name": key[0], "topic": key[1],
            "event_ts": gap["since"], "detail": {"cluster": CLUSTER, "until": until, "served_by": gap["served_by"],
                                                 "table_ts": table_ts},
        })  # fmt: skip

    def close(self) -> None:
        """At the end: the gaps still open, and BROKER_WITHOUT_WRITES over the windows ended by as_of."""
        for key in sorted(self.open):
            self._close(key, None, None)
        thr, as_of = self.sim.thresholds, self.sim.summary.as_of
        size = thr.idle_window_ms
        for broker, since, until, windows in self._idle_runs(size, as_of // size - 1, thr):
            self.sim.truth_anomaly({
                "anomaly_type": "BROKER_WITHOUT_WRITES", "reason": None, "broker_name": broker, "event_ts": since,
                "detail": {"cluster": CLUSTER, "until": until, "windows": windows},
            })  # fmt: skip

    def _idle_runs(self, size: int, last: int, thr: Any) -> list[tuple[str, int, int | None, int]]:
        """Each broker's runs of idle windows: listed in the last snapshot at or before the window's start and
        in all within it, joined and last changed route_delay_ms before its start, storing nothing while the
        others listed store idle_min_messages or more."""
        settled: list[dict[str, int]] = []  # per snapshot: broker -> when its routes have settled
        joined: dict[str, int] = {}
        changed: dict[str, int] = {}
        for ts, live, landed in self.history:
            joined = {m: joined.get(m, ts) for m in live}
            changed.update(landed)
            settled.append({m: max(joined[m], changed.get(m, ts)) + thr.route_delay_ms for m in live})
        times = [ts for ts, _, _ in self.history]
        stores: dict[int, dict[str, int]] = defaultdict(dict)
        for (b, k), n in self.writes.items():
            stores[k][b] = n
        idle: dict[str, list[int]] = defaultdict(list)
        for k in sorted(k for k in stores if k <= last):
            i = bisect.bisect_right(times, k * size) - 1
            if i < 0:
                continue
            within = [live for ts, live, _ in self.history[i + 1 : bisect.bisect_left(times, (k + 1) * size)]]
            listed = self.history[i][1].union(*within)
            for m in sorted(self.history[i][1]):
                if settled[i][m] > k * size or stores[k].get(m, 0) or not all(m in w for w in within):
                    continue
                if sum(n for b, n in stores[k].items() if b in listed and b != m) >= thr.idle_min_messages:
                    idle[m].append(k)
        runs = []
        for m, ks in sorted(idle.items()):
            first = ks[0]
            for k, after in zip(ks, [*ks[1:], None], strict=True):
                if after != k + 1:  # the run ends with window k
                    runs.append((m, first * size, None if k == last else (k + 1) * size, k - first + 1))
                    first = after if after is not None else first
        return runs
