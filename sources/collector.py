"""The collector's passes over a live RocketMQ cluster, through its remoting protocol (DESIGN §1's records).

A pass asks a name server for the cluster's master brokers, then on each broker pulls the half, op and
discard topics and the business topics from where the last pass stopped, and snapshots every consumer
group's committed offsets. Records are the ones export-store writes (a pulled message is in the
commit-log format), so ingest and everything after it cannot tell the two apart.

Nothing is lost and nothing is committed. A broker's positions are kept in `<landing>/_collect/<broker>.json`
and saved only after the files of its pass are on disk; file names derive from the pass number, so a
pass killed before saving is redone under the same names and repeats only records ingest drops as exact
repeats. Each pass's accounting lands in `<landing>/_collect/runs/`, which ingest loads into `collect_runs`.
`txn-recon collect` and `serve` are its shell: they parse the command, hold the lock and handle signals.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sources import client, remoting, topology
from sources import consumers as consumer_snapshot
from sources import offsets as offset_table
from sources.client import Connection, PullResult, Refused, RemotingError
from sources.commitlog import Corrupt, Message, scan
from sources.landing_files import ENCODE, Stream, durable_write, read_state, write_state
from sources.records import (
    DISCARD_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    RECORD,
    ROCKSDB_HALF_TOPIC,
    ROCKSDB_OP_TOPIC,
    TRACE_TOPICS,
    half_log_offset,
    is_business_topic,
    is_copy_topic,
    keep_body,
    rocksdb_op_record,
    stream_of,
)
from sources.remoting import Credentials

if TYPE_CHECKING:
    from jobs.config import CollectSettings

log = logging.getLogger(__name__)
CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # the transaction check service's own progress (MixAll.CID_SYS_RMQ_TRANS)
TRANSACTION_TOPICS = (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC, ROCKSDB_HALF_TOPIC, ROCKSDB_OP_TOPIC)
_IN_FLIGHT = 16  # pull requests sent before their answers are read (each answer up to 256 KiB)
_PROGRESS_EVERY = 100_000  # messages between two progress lines of one broker's pass
_RETRIES = 3  # PULL_RETRY_IMMEDIATELY answers in a row before a queue waits for the next pass
GROUP_RETRY_S = 0.5  # pause before a group whose snapshot failed is listed and asked again, once

QueueId = tuple[str, int]  # topic, queue id


@dataclass
class BrokerState:
    """What earlier passes collected from one broker."""

    passes: int = 0
    positions: dict[QueueId, int] = field(default_factory=dict)  # the next offset to pull
    offsets: dict[offset_table.QueueKey, int] = field(default_factory=dict)  # the last snapshot's
    snapshots: int = 0  # the seq of the last offset snapshot

    @classmethod
    def load(cls, path: Path) -> BrokerState:
        def build(doc: Any) -> BrokerState:
            return cls(int(doc["passes"]), {(t, int(q)): int(o) for t, q, o in doc["positions"]},
                       {(g, t, int(q)): int(o) for g, t, q, o in doc["offsets"]}, int(doc["snapshots"]))  # fmt: skip

        return read_state(path, build, "a collect state file", "to collect that broker from its queues' start") or cls()

    def save(self, path: Path) -> None:
        write_state(path, {"passes": self.passes, "snapshots": self.snapshots,
                           "positions": [[*k, v] for k, v in sorted(self.positions.items())],
                           "offsets": [[*k, v] for k, v in sorted(self.offsets.items())]})  # fmt: skip


@dataclass
class BrokerRun:
    """One broker's part of a pass: the collect_runs row."""

    broker_name: str
    address: str | None
    started_at: dt.datetime
    finished_at: dt.datetime | None = None
    messages: Counter[str] = field(default_factory=Counter)  # per topic
    records: Counter[str] = field(default_factory=Counter)  # per landing stream
    offset_records: int = 0
    check_backlog: int | None = None  # half-queue messages the check service has not gone past yet
    op_backlog: int | None = None  # op messages it has not read yet
    errors: list[str] = field(default_factory=list)  # failures, and messages lost or moved
    groups: set[str] = field(default_factory=set)  # consumer groups with committed offsets here
    refused: bool = False  # the server answered, and said no (ACL keys, permissions, the group)
    reached: bool = False  # the broker answered
    complete: bool = False  # every queue was read to its end and the offsets were snapshot
    queues_not_read: int = 0  # queues this pass could not read to their end (read again next pass)

    @property
    def status(self) -> str:
        return "failed" if not self.reached else "ok" if self.complete else "partial"

    def row(self, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, "broker_name": self.broker_name or None, "address": self.address,
                "started_at": _iso(self.started_at), "finished_at": _iso(self.finished_at or self.started_at),
                "status": self.status, "half": self.records["half"], "op": self.records["op"],
                "real": self.records["real"], "discarded": self.messages[DISCARD_TOPIC],
                "offset_records": self.offset_records, "check_backlog": self.check_backlog,
                "op_backlog": self.op_backlog, "errors": self.errors}  # fmt: skip


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Collector:
    """Passes over one cluster into one landing folder."""

    def __init__(self, namesrv: list[str], landing: Path, settings: CollectSettings,
                 creds: Credentials | None = None, stop: threading.Event | None = None) -> None:  # fmt: skip
        self.namesrv, self.landing, self.settings, self.creds = namesrv, landing, settings, creds
        # Once set, a pass stops pulling at the end of its round; a `jobs.signals.Stop` names its signal.
        self.stop = stop or threading.Event()
        self.folder = landing / "_collect"
        # What the last pass's topology snapshot saw: cluster -> master -> its business topics (None: unread).
        self.seen: dict[str, dict[str, list[str] | None]] = {}
        self.trace_topics = TRACE_TOPICS | frozenset(settings.trace_topics)

    def connect(self, address: str) -> Connection:
        return Connection(address, self.settings.timeout_s, self.creds)

    def brokers(self) -> dict[str, tuple[str, str]]:
        """brokerName -> (master address, cluster), from the first name server that answers."""
        problems = []
        for address in self.namesrv:
            try:
                with self.connect(address) as conn:
                    return client.master_brokers(conn)
            except RemotingError as e:
                problems.append(str(e))
        raise RemotingError("no name server answered: " + "; ".join(problems))

    def run_pass(self, run_id: str) -> list[BrokerRun]:
        """One pass over every master broker, then the consumer groups; a broker that fails is reported and
        the others go on."""
        started = _now()
        try:
            brokers = self.brokers()
        except RemotingError as e:
            log.error("collect: %s", e)
            return [BrokerRun("", None, started, _now(), errors=[str(e)], refused=isinstance(e, Refused))]
        runs = [self.collect_broker(name, address, cluster) for name, (address, cluster) in sorted(brokers.items())]
        self.snapshot_groups(brokers, runs, run_id)
        self.snapshot_topology(runs, run_id)
        # A broker collected before that has no master now is down, restarting or failing over.
        for name in sorted({p.stem for p in self.folder.glob("*.json")} - set(brokers)):
            problem = f"{name} has no master registered with the name server (down or restarting); read next pass"
            log.error("collect %s", problem)
            runs.append(BrokerRun(name, None, started, _now(), errors=[problem]))
        if not runs:
            log.warning("collect: the name server knows no master broker yet")
        return runs

    def collect_broker(self, broker: str, address: str, cluster: str) -> BrokerRun:
        run = BrokerRun(broker, address, _now())
        path = self.folder / f"{broker}.json"
        state = BrokerState.load(path)
        prefix = f"collect-{broker}-{state.passes:08d}"
        streams = {name: Stream(self.landing / name, prefix, ENCODE[name]) for name in RECORD}
        try:
            with self.connect(address) as conn:
                queues, indexed = self._queues(conn, broker, cluster, state, run)
                run.reached = True
                whole = _pull_all(conn, self.settings.group, broker, queues, indexed, state, streams, run, self.stop,
                                  self.trace_topics)  # fmt: skip
                self._snapshot_offsets(conn, broker, state, run, prefix)
                run.complete = whole
        except RemotingError as e:
            run.errors.append(str(e))
            run.refused = isinstance(e, Refused)
            log.error("collect %s: %s%s", broker, e, "; what was read before stays collected" if run.messages else "")
        finally:
            for name, s in streams.items():
                s.close()  # durable before the positions that cover it are saved
                run.records[name] = s.total
        state.passes += 1
        state.save(path)
        run.finished_at = _now()
        if run.status == "failed":
            return run
        log.info("collect %s: half %d, op %d, real %d (discarded %d), consumer copies %d, trace contexts %d, "
                 "offset records %d, check backlog %s, op backlog %s%s", broker, run.records["half"], run.records["op"],
                 run.records["real"], run.messages[DISCARD_TOPIC], run.records["copy"], run.records["trace"],
                 run.offset_records,
                 _opt(run.check_backlog), _opt(run.op_backlog),
                 f"; {len(run.errors)} error(s)" if run.errors else "")  # fmt: skip
        return run

    def _queues(self, conn: Connection, broker: str, cluster: str, state: BrokerState,
                run: BrokerRun) -> tuple[list[QueueId], set[QueueId]]:  # fmt: skip
        """The queues to read this pass, and those of them to read through the store's index rather than
        pull. The topics named after the broker and its cluster only route sends and hold nothing. A topic
        the broker no longer has is forgotten (one line), so a topic created again under that name is read
        from its start. A 4.x broker keeps no topic config for its op topic: its queues are the half
        topic's (an op queue per half queue), read by index."""
        topics = client.topic_queues(conn)
        indexed: set[QueueId] = set()
        if HALF_TOPIC in topics and OP_TOPIC not in topics:
            topics[OP_TOPIC] = topics[HALF_TOPIC]
            indexed = {(OP_TOPIC, q) for q in range(topics[HALF_TOPIC])}
            if not state.positions.keys() & indexed:
                log.info("collect %s: %s is not in the broker's topic table (RocketMQ 4.x); its queues are read "
                         "through the consume-queue index", broker, OP_TOPIC)  # fmt: skip
        wanted = set(self.settings.topics)

        def chosen_topic(t: str) -> bool:
            if t in TRANSACTION_TOPICS or is_copy_topic(t) or t in self.trace_topics:
                return True
            return is_business_topic(t) and t not in (broker, cluster) and (not wanted or t in wanted)

        chosen = {t: n for t, n in topics.items() if chosen_topic(t)}
        for topic in sorted({t for t, _ in state.positions} - set(topics)):
            log.warning("collect %s: topic %s is gone from the broker (deleted); its positions are dropped",
                        broker, topic)  # fmt: skip
            run.errors.append(f"topic {topic} deleted")
            state.positions = {k: v for k, v in state.positions.items() if k[0] != topic}
        for topic in sorted(wanted - set(topics)):
            log.warning("collect %s: configured topic %s is not on this broker", broker, topic)
        return [(t, q) for t in sorted(chosen) for q in range(chosen[t])], indexed

    def _snapshot_offsets(self, conn: Connection, broker: str, state: BrokerState, run: BrokerRun,
                          prefix: str) -> None:  # fmt: skip
        """The offset records of the queues whose committed offset changed since the last snapshot. If this
        pass's offset file exists, an earlier try of the pass wrote it and was stopped before saving its
        state: it is kept, not replaced by a newer snapshot, so a retry repeats nothing."""
        written = self.landing / "offset" / f"{prefix}-00000.jsonl"
        if written.exists():
            for line in written.read_text(encoding="utf-8").splitlines():
                rec = json.loads(line)
                state.offsets[(rec["consumer_group"], rec["topic"], rec["queue_id"])] = rec["offset"]
                state.snapshots = max(state.snapshots, rec["seq"])
            run.groups = {g for g, _, _ in state.offsets} - {self.settings.group}
            return
        text = client.consumer_offsets(conn)
        taken_ms = int(time.time() * 1000)
        try:
            table = offset_table.parse(text)
        except offset_table.OffsetFileError as e:
            raise RemotingError(f"{conn.address}: unreadable consumer offsets ({e})") from None
        half_done, op_done = (table.get(f"{t}@{CHECK_GROUP}", {}).get(0) for t in (HALF_TOPIC, OP_TOPIC))
        run.check_backlog = _backlog(state.positions.get((HALF_TOPIC, 0)), half_done)
        run.op_backlog = _backlog(state.positions.get((OP_TOPIC, 0)), op_done)
        current, _ = offset_table.business_offsets(table)
        run.groups = {g for g, _, _ in current} - {self.settings.group}
        keys = offset_table.changed(state.offsets, current)
        if not keys:
            return
        seq = state.snapshots + 1
        stream = Stream(self.landing / "offset", prefix, ENCODE["offset"])
        for key in keys:
            stream.add(offset_table.offset_record(broker, key, current[key], taken_ms, seq))
        stream.close()
        state.offsets.update(current)
        state.snapshots, run.offset_records = seq, len(keys)

    def snapshot_topology(self, runs: list[BrokerRun], run_id: str) -> None:
        """The cluster's members, each master's business topics and their routes, read in one sweep at the end
        of the pass (so they agree with each other), into `topology/<run_id>.jsonl`; a table or a route only
        when it changed (`sources.topology`). A master whose table cannot be read keeps its last one."""
        by_broker = {r.broker_name: r for r in runs}
        landed_path = self.folder / "topology" / "landed.json"  # beside, not among, the brokers' states
        landed = topology.Landed.load(landed_path)
        try:
            with self._namesrv() as ns:
                members = client.cluster_members(ns)
                taken_ms = int(time.time() * 1000)
                tables: dict[str, tuple[str | None, topology.Table]] = {}
                for m in (m for m in members if m.broker_id == 0):
                    try:
                        with self.connect(m.address) as conn:
                            stamp, table = client.topic_table(conn)
                        tables[m.broker_name] = (m.cluster, (stamp, topology.business(m.broker_name, table)))
                    except RemotingError as e:
                        problem = f"topic table not read ({e}); its last one stands"
                        log.error("collect %s: %s", m.broker_name, problem)
                        if m.broker_name in by_broker:
                            by_broker[m.broker_name].errors.append(problem)
                topics = sorted({t for _, (_, ts) in tables.values() for t in ts})
                routes = {t: client.topic_route(ns, t) for t in topics}
        except RemotingError as e:
            problem = f"no topology snapshot this pass ({e})"
            log.error("collect: %s", problem)
            for run in runs:
                run.errors.append(problem)
            return
        self.seen = {}
        for m in (m for m in members if m.broker_id == 0):
            read = tables.get(m.broker_name)
            self.seen.setdefault(m.cluster, {})[m.broker_name] = None if read is None else sorted(read[1][1])
        records = topology.snapshot(taken_ms, members, tables, routes, landed)
        durable_write(self.landing / "topology" / f"{run_id}.jsonl",
                      "".join(ENCODE["topology"](r) + "\n" for r in records))  # fmt: skip
        landed.save(landed_path)  # after the file: a pass killed between the two lands the changes again
        log.info("collect: topology of %d broker(s), %d business topic(s), %d records", len(members), len(topics),
                 len(records))  # fmt: skip

    def _namesrv(self) -> Connection:
        """A connection to the first name server that answers."""
        problems = []
        for address in self.namesrv:
            try:
                return self.connect(address)
            except RemotingError as e:
                problems.append(str(e))
        raise RemotingError("no name server answered: " + "; ".join(problems))

    def snapshot_groups(self, brokers: dict[str, tuple[str, str]], runs: list[BrokerRun], run_id: str) -> None:
        """Snapshot every consumer group that has committed offsets: each master broker's connection list and
        subscription table, then each member's running info (the broker relays the request to the client).
        A group whose snapshot cannot be completed is left out of this pass, never landed in part: a missing
        member would look like a hand-off. The records go to `consumer/<run_id>.jsonl`."""
        by_broker = {r.broker_name: r for r in runs}
        groups = sorted(set().union(*(r.groups for r in runs)))
        if not groups:
            return
        records: list[tuple[Any, ...]] = []
        conns: dict[str, Connection] = {}
        try:
            for group in groups:
                for attempt in (1, 2):
                    try:
                        records += self._group_records(group, brokers, conns)
                        break
                    except _GroupFailed as failed:
                        stale = conns.pop(failed.broker, None)
                        if stale is not None:
                            stale.close()  # its stream may hold half a response; the next try reconnects
                        if attempt == 1:
                            # A member that leaves between the broker's listing and our question refuses it
                            # (its client no longer has the group); a fresh listing no longer names it.
                            time.sleep(GROUP_RETRY_S)
                            continue
                        problem = f"consumer group {group}: no snapshot this pass ({failed.cause})"
                        log.error("collect: %s", problem)
                        run = by_broker.get(failed.broker)
                        if run is not None:
                            run.errors.append(problem)
        finally:
            for conn in conns.values():
                conn.close()
        if records:
            durable_write(self.landing / "consumer" / f"{run_id}.jsonl",
                          "".join(ENCODE["consumer"](r) + "\n" for r in records))  # fmt: skip
            log.info("collect: %d consumer group(s) snapshot, %d records", len(groups), len(records))

    def _group_records(self, group: str, brokers: dict[str, tuple[str, str]],
                       conns: dict[str, Connection]) -> list[tuple[Any, ...]]:  # fmt: skip
        """One group's snapshot records, all of it or `_GroupFailed` naming the broker that failed."""
        taken_ms = int(time.time() * 1000)
        tables: dict[str, dict[str, Any]] = {}
        members: dict[str, consumer_snapshot.Member] = {}
        for broker, (address, _) in sorted(brokers.items()):
            try:
                if broker not in conns:
                    conns[broker] = self.connect(address)
                connection = client.consumer_connections(conns[broker], group)
                if connection is None:
                    continue
                tables[broker] = connection
                for cid in consumer_snapshot.client_ids(connection):
                    if cid not in members:
                        members[cid] = client.consumer_running_info(conns[broker], group, cid)
            except RemotingError as e:
                raise _GroupFailed(broker, e) from e
        return consumer_snapshot.snapshot_records(taken_ms, group, tables, members) if members else []


class _GroupFailed(Exception):
    def __init__(self, broker: str, cause: RemotingError) -> None:
        super().__init__(str(cause))
        self.broker, self.cause = broker, cause


def _backlog(end: int | None, done: int | None) -> int | None:
    """How far the check service's committed offset trails the queue's end as this pass read it."""
    return None if end is None or done is None else max(end - done, 0)


def _opt(value: int | None) -> str:
    return "unknown" if value is None else str(value)


def _pull_all(conn: Connection, group: str, broker: str, queues: list[QueueId], indexed: set[QueueId],
              state: BrokerState, streams: dict[str, Stream], run: BrokerRun,
              stop: threading.Event, trace_topics: frozenset[str] = TRACE_TOPICS) -> bool:  # fmt: skip
    """Pull every queue up to its end; False if some queue could not be (it is read again next pass). A
    round sends one request per unfinished queue, pipelined on the one connection, _IN_FLIGHT at a time: a
    round trip per chunk of queues, and the broker never holds more than a few MiB of answers for us. The
    `indexed` queues are read through the store's index instead (client.read_by_index), with the same
    answer. A stop asked for ends the pull after the round in flight; the rest is read next pass."""
    routes: dict[str, tuple[Callable[[str, Message], tuple[Any, ...] | None], Stream] | None] = {}
    retries: Counter[QueueId] = Counter()
    active = list(queues)
    pulled = next_progress = 0
    while active:
        if stop.is_set():
            by = getattr(stop, "name", "") or "request"  # a jobs.signals.Stop names its signal
            run.errors.append(f"stopped by {by} with {len(active)} queue(s) not at their end; read next pass")
            run.queues_not_read += len(active)
            break
        still = []
        for i in range(0, len(active), _IN_FLIGHT):
            sent = [
                (q, client.read_by_index(conn, *q, state.positions.get(q, 0)) if q in indexed
                 else client.send_pull(conn, group, *q, state.positions.get(q, 0)))
                for q in active[i : i + _IN_FLIGHT]
            ]  # fmt: skip
            for queue, pending in sent:
                result = (
                    pending
                    if isinstance(pending, PullResult)
                    else client.pull_result(conn.receive(pending), conn.address)
                )
                if _apply(result, queue, broker, state, streams, routes, run, retries, conn, trace_topics):
                    still.append(queue)
        active = still
        pulled = sum(run.messages.values())
        if pulled >= next_progress + _PROGRESS_EVERY:
            next_progress = pulled - pulled % _PROGRESS_EVERY
            log.info("collect %s: %d messages so far, %d queues not yet at their end", broker, pulled, len(active))
    return run.queues_not_read == 0


def _apply(result: PullResult, queue: QueueId, broker: str, state: BrokerState, streams: dict[str, Stream],
           routes: dict[str, Any], run: BrokerRun, retries: Counter[QueueId], conn: Connection,
           trace_topics: frozenset[str] = TRACE_TOPICS) -> bool:  # fmt: skip
    """Take one pull answer into the streams and positions; True if the queue has more to read now."""
    topic, queue_id = queue
    at = state.positions.get(queue, 0)
    where = f"collect {broker}: {topic} queue {queue_id}"
    if result.code == remoting.SUCCESS:
        for entry in scan(result.body, 0, 0, keep_body(trace_topics)):
            if isinstance(entry, Message) and entry.topic == ROCKSDB_OP_TOPIC:
                op = _rocksdb_op(conn, broker, entry)
                if op is None:  # as export-store does: the half is gone for good, so is what the op says
                    gone = f"the op at offset {entry.queue_offset} names a half the broker no longer holds"
                    run.errors.append(f"{topic} queue {queue_id}: {gone}; not landed")
                    log.warning("%s: %s (retention deleted it); the op is not landed", where, gone)
                else:
                    streams["op"].add(op)
                run.messages[entry.topic] += 1
            elif isinstance(entry, Message):
                route = routes.get(entry.topic, False)
                if route is False:
                    name = stream_of(entry.topic, trace_topics)
                    route = routes[entry.topic] = None if name is None else (RECORD[name], streams[name])
                if route is not None and (record := route[0](broker, entry)) is not None:
                    route[1].add_all(record)
                run.messages[entry.topic] += 1
            elif isinstance(entry, Corrupt):
                # The position stays before this batch: next pass reads it again (its good messages as
                # exact repeats), and reports the corrupt one again if it is still corrupt.
                run.errors.append(f"{topic} queue {queue_id}: corrupt message in a pull answer ({entry.reason})")
                run.queues_not_read += 1
                log.error("%s: a pull answer from offset %d holds a corrupt message (%s); this batch is read "
                          "again next pass", where, at, entry.reason)  # fmt: skip
                return False
        state.positions[queue] = _need(result.next_offset, where)
        return result.max_offset is None or state.positions[queue] < result.max_offset
    if result.code == remoting.PULL_NOT_FOUND:
        return False
    if result.code == remoting.PULL_RETRY_IMMEDIATELY:
        retries[queue] += 1
        state.positions[queue] = result.next_offset if result.next_offset is not None else at
        if retries[queue] < _RETRIES:
            return True
        run.errors.append(f"{topic} queue {queue_id}: the broker kept answering 'retry' ({result.reason})")
        run.queues_not_read += 1
        return False
    if result.code == remoting.PULL_OFFSET_MOVED:
        to = _need(result.next_offset, where)
        if to > at:
            log.warning("%s: offsets %d to %d were deleted by the broker (retention) before they were collected; "
                        "going on from %d", where, at, to - 1, to)  # fmt: skip
            run.errors.append(f"{topic} queue {queue_id}: offsets {at}..{to - 1} deleted before collection")
        else:
            log.warning("%s: the queue now ends at %d, before our position %d (the topic was re-created or "
                        "the store replaced); reading again from %d", where, to, at, to)  # fmt: skip
            run.errors.append(f"{topic} queue {queue_id}: offset moved back from {at} to {to}")
        state.positions[queue] = to
        return to != at
    if result.code == remoting.TOPIC_NOT_EXIST:
        log.warning("%s: the topic no longer exists; its position is dropped", where)
        run.errors.append(f"topic {topic} deleted")
        state.positions.pop(queue, None)
        return False
    reason = result.reason
    if result.code in (remoting.NO_PERMISSION, remoting.SUBSCRIPTION_GROUP_NOT_EXIST):
        raise Refused(f"{broker} refused the pull of {topic}: {reason}", result.code)
    log.error("%s: the pull failed (%s); the queue is read again next pass", where, reason)
    run.errors.append(f"{topic} queue {queue_id}: {reason}")
    run.queues_not_read += 1
    return False


def _rocksdb_op(conn: Connection, broker: str, op: Message) -> tuple[Any, ...] | None:
    """A RIP-82 op as a landing record: the half it names by commit-log offset, read from the broker, gives
    the queue offset the record lists. None if the broker has no such half."""
    log_offset = half_log_offset(op)
    stored = None if log_offset is None else client.message_at(conn, ROCKSDB_HALF_TOPIC, log_offset)
    if log_offset is None or stored is None:
        return None
    half = next(scan(stored, log_offset, 0), None)
    if not isinstance(half, Message) or half.topic != ROCKSDB_HALF_TOPIC:
        return None
    return rocksdb_op_record(broker, op, half.queue_offset)


def _need(value: int | None, where: str) -> int:
    if value is None:
        raise RemotingError(f"{where}: the pull answer lacks nextBeginOffset")
    return value


def write_runs(folder: Path, run_id: str, runs: list[BrokerRun]) -> None:
    """The pass's accounting rows, one file per pass (ingest lands them in `collect_runs`)."""
    text = "".join(json.dumps(r.row(run_id), separators=(",", ":")) + "\n" for r in runs)
    durable_write(folder / "runs" / f"{run_id}.jsonl", text)
