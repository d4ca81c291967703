"""`txn-recon export-store`: a broker's store folder (live or copied) into landing files. No Spark.

Reads `commitlog/` from where the last run stopped, `config/consumerOffset.json` and `config/topics.json`, and
writes the half, op, real, offset and topology streams of one broker (its topic table alone: a store does not
know its cluster). What a run reached is kept in `<landing>/_export/<broker>.json`
and saved only after the landing files it wrote are on disk, so a run killed at any point repeats at
most records that ingest then drops as exact repeats. File names derive from the commit-log position a
run started at, so such a repeat rewrites the same files.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import mmap
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.config import Config
from jobs.errors import TxnReconError
from jobs.lock import folder_lock
from sources import offsets as offset_file
from sources import topology
from sources.commitlog import Corrupt, DataEnd, FileEnd, Message, scan
from sources.landing_files import ENCODE, Stream, make_landing, read_state, write_state
from sources.records import (
    RECORD,
    ROCKSDB_HALF_TOPIC,
    ROCKSDB_OP_TOPIC,
    TRACE_TOPICS,
    Record,
    half_log_offset,
    keep_body,
    rocksdb_op_record,
    stream_of,
)

log = logging.getLogger(__name__)
_RELEASE_EVERY = 50_000  # messages between two releases of the pages read (tens of MiB)
_UNSEEN: Any = object()
_COMMITLOG_NAME = re.compile(r"^\d{20}$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", type=Path, required=True, help="the broker's store folder (storePathRootDir)")
    parser.add_argument("--landing", type=Path, required=True, help="landing folder to add files to")
    parser.add_argument("--broker-name", required=True, help="the broker's brokerName (the store does not hold it)")


@dataclass
class State:
    """What earlier runs exported: the next commit-log position and the last offset of every queue."""

    position: int = 0
    offsets: dict[offset_file.QueueKey, int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> State:
        def build(doc: Any) -> State:
            return cls(int(doc["position"]), {(g, t, int(q)): int(o) for g, t, q, o in doc["offsets"]})

        return read_state(path, build, "an export-store state file", "to export the store from its start") or cls()

    def save(self, path: Path) -> None:
        write_state(path, {"position": self.position, "offsets": [[*k, v] for k, v in sorted(self.offsets.items())]})


@dataclass
class Summary:
    records: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)  # per topic
    corrupt: int = 0
    offsets: int = 0
    offsets_skipped: int = 0
    ops_without_half: int = 0  # RIP-82 ops whose half the store no longer holds (retention)


def commitlog_files(folder: Path) -> list[tuple[int, Path]]:
    """The commit-log files by their first physical offset (their names)."""
    return sorted((int(p.name), p) for p in folder.iterdir() if _COMMITLOG_NAME.match(p.name))


@dataclass(frozen=True)
class Stop:
    """Where the next run resumes, and why this one stopped if it could not go on (a corrupt record)."""

    position: int
    error: str | None = None


def _messages(files: list[tuple[int, Path]], position: int, summary: Summary,
              trace_topics: frozenset[str] = TRACE_TOPICS) -> Iterator[Message | Stop]:  # fmt: skip
    """Messages from `position` on across file boundaries, then where to resume next time."""

    def went_on(i: int) -> bool:
        """Whether the writer went on past file `i`: the next file starts with a record. (The broker creates
        the next files ahead of time, zeros until it writes there.)"""
        if i + 1 == len(files):
            return False
        try:
            with open(files[i + 1][1], "rb") as f:
                return f.read(8).strip(b"\0") != b""
        except OSError:
            return False

    for i, (start, path) in enumerate(files):
        if i + 1 < len(files) and position >= files[i + 1][0]:
            continue
        if position < start:  # retention deleted older files, or a copy of the store lacks some
            log.warning("the commit log from %d to %d is missing (deleted by the broker's retention, or not "
                        "copied): its records were never exported", position, start)  # fmt: skip
            position = start
        if path.stat().st_size == 0:
            continue  # just created by the broker: nothing in it yet
        log.info("reading %s from position %d", path.name, position)
        try:
            with open(path, "rb") as f:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise TxnReconError(f"cannot read the commit-log file {path}: {e.strerror}") from None
        with buf, contextlib.closing(scan(buf, start, position - start, keep_body(trace_topics))) as entries:
            released = 0  # the file's bytes before this are read and dropped from our mapping
            for n, entry in enumerate(entries, 1):
                if isinstance(entry, Message):
                    yield entry
                    if not n % _RELEASE_EVERY:
                        released = _release(buf, released, entry.position - start)
                elif isinstance(entry, Corrupt):
                    summary.corrupt += 1
                    where = f"{path}: position {entry.position}: {entry.reason}"
                    if entry.resumed_at is None and not went_on(i):
                        yield Stop(
                            entry.position,
                            f"{where}; no readable record follows in this file, so the "
                            f"export stops here (what came before it is written)",
                        )
                        return
                    # The next record, or the next file: the writer went on there.
                    resume = entry.resumed_at if entry.resumed_at is not None else files[i + 1][0]
                    log.warning("%s; skipped %d bytes to %s", where, resume - entry.position,
                                "the next record" if entry.resumed_at is not None else "the next file")  # fmt: skip
                    position = resume
                    if entry.resumed_at is None:
                        break
                elif isinstance(entry, FileEnd):
                    position = start + len(buf)  # the writer went on in the next file
                elif isinstance(entry, DataEnd):
                    if went_on(i):  # zeros where the file should go on: a span lost, not the end of the data
                        if entry.position < start + len(buf):
                            summary.corrupt += 1
                            log.warning("%s: position %d: %d zero bytes to the end of the file; skipped to the "
                                        "next file, where the writer went on", path, entry.position,
                                        start + len(buf) - entry.position)  # fmt: skip
                        position = files[i + 1][0]
                        break
                    if entry.incomplete:
                        log.info("the record at %d is still being written; the next run reads it", entry.position)
                    yield Stop(entry.position)
                    return
    yield Stop(position)


class Halves:
    """The queue offsets of RIP-82 halves, looked up by their commit-log offset (a RIP-82 op names its half
    so). The file last read stays mapped: an op is written soon after its half."""

    def __init__(self, files: list[tuple[int, Path]]) -> None:
        self.files = files
        self.mapped: tuple[int, mmap.mmap] | None = None

    def queue_offset(self, log_offset: int) -> int | None:
        """The queue offset of the RIP-82 half at `log_offset`, or None if the store has no such half."""
        starts = [start for start, _ in self.files if start <= log_offset]
        if not starts:
            return None
        start = starts[-1]
        if self.mapped is None or self.mapped[0] != start:
            self.close()
            path = dict(self.files)[start]
            try:
                with open(path, "rb") as f:
                    self.mapped = (start, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            except (OSError, ValueError):  # gone, or empty
                return None
        buf = self.mapped[1]
        if log_offset - start >= len(buf):
            return None
        with contextlib.closing(scan(buf, start, log_offset - start)) as entries:
            first = next(entries, None)
        ok = isinstance(first, Message) and first.topic == ROCKSDB_HALF_TOPIC and first.position == log_offset
        return first.queue_offset if ok and isinstance(first, Message) else None

    def close(self) -> None:
        if self.mapped is not None:
            self.mapped[1].close()
            self.mapped = None


def _release(buf: mmap.mmap, start: int, end: int) -> int:
    """Drop the pages of [start, end) from this process's mapping: they stay in the page cache, but the
    export's resident memory stays flat in the commit log's size. Returns the new released boundary."""
    end -= end % mmap.PAGESIZE
    if end > start:
        buf.madvise(mmap.MADV_DONTNEED, start, end - start)
    return max(start, end)


def _export_commitlog(store: Path, landing: Path, broker: str, state: State, summary: Summary,
                      trace_topics: frozenset[str] = TRACE_TOPICS) -> Stop:  # fmt: skip
    folder = store / "commitlog"
    try:
        files = commitlog_files(folder)
    except OSError as e:
        raise TxnReconError(f"cannot read the commit log folder {folder}: {e.strerror}") from None
    prefix = f"store-{broker}-{state.position:020d}"
    streams = {name: Stream(landing / name, prefix, ENCODE[name]) for name in RECORD}
    # Per topic: how its messages become records and the stream they go to (None: skipped).
    routes: dict[str, tuple[Callable[[str, Message], Record], Stream] | None] = {}
    stop = Stop(state.position)
    halves = Halves(files)
    try:
        for item in _messages(files, state.position, summary, trace_topics):
            if isinstance(item, Stop):
                stop = item
                break
            if item.topic == ROCKSDB_OP_TOPIC:
                _add_rocksdb_op(broker, item, halves, streams["op"], summary)
                continue
            route = routes.get(item.topic, _UNSEEN)
            if route is _UNSEEN:
                name = stream_of(item.topic, trace_topics)
                route = routes[item.topic] = None if name is None else (RECORD[name], streams[name])
            if route is None:
                summary.skipped[item.topic] += 1
                continue
            to_record, stream = route
            record = to_record(broker, item)
            if record is None:
                summary.skipped[item.topic] += 1
                continue
            stream.add_all(record)
    finally:
        halves.close()
        for name, s in streams.items():
            s.close()
            summary.records[name] = s.total
    return stop


def _add_rocksdb_op(broker: str, m: Message, halves: Halves, ops: Stream, summary: Summary) -> None:
    log_offset = half_log_offset(m)
    queue_offset = None if log_offset is None else halves.queue_offset(log_offset)
    if queue_offset is None:
        summary.ops_without_half += 1
        log.warning("the %s op at commit-log offset %d names no half the store holds (TRANS_OFFSET %s): "
                    "retention deleted it, so this op is not exported",
                    ROCKSDB_OP_TOPIC, m.position, log_offset)  # fmt: skip
        return
    ops.add(rocksdb_op_record(broker, m, queue_offset))


def _read_offsets(store: Path) -> tuple[dict[str, dict[int, int]], int] | None:
    """The offset table and the file's modification time; the broker's `.bak` when the file is being
    replaced (it moves the old file aside, then writes the new one). None if the broker has none yet."""
    problems = []
    for path in (store / "config" / "consumerOffset.json", store / "config" / "consumerOffset.json.bak"):
        try:
            mtime_ms = path.stat().st_mtime_ns // 1_000_000
            return offset_file.parse(path.read_text(encoding="utf-8")), mtime_ms
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, offset_file.OffsetFileError) as e:
            problems.append(f"{path}: {e}")
    if problems:
        raise TxnReconError("; ".join(problems))
    return None


def _export_offsets(store: Path, landing: Path, broker: str, state: State, summary: Summary) -> None:
    read = _read_offsets(store)
    if read is None:
        log.info("no consumerOffset.json yet: no consumer has committed an offset")
        return
    table, mtime_ms = read
    current, summary.offsets_skipped = offset_file.business_offsets(table)
    stream = Stream(landing / "offset", f"store-{broker}-{mtime_ms}", ENCODE["offset"])
    for key in offset_file.changed(state.offsets, current):
        stream.add(offset_file.offset_record(broker, key, current[key], mtime_ms))
        summary.offsets += 1
    stream.close()
    state.offsets.update(current)


def _export_topics(store: Path, landing: Path, broker: str) -> int:
    """The broker's business topics from config/topics.json, as a snapshot taken when the broker last changed
    its table (the file's dataVersion timestamp, else its modification time): a rerun on the same file lands
    the same records, which ingest drops as repeats. Returns the topics landed."""
    path = store / "config" / "topics.json"
    try:
        text, mtime_ms = path.read_text(encoding="utf-8"), path.stat().st_mtime_ns // 1_000_000
    except FileNotFoundError:
        log.info("no topics.json: the broker has written no topic table yet")
        return 0
    except (OSError, UnicodeDecodeError) as e:
        raise TxnReconError(f"{path}: cannot read it ({e})") from None
    try:
        stamp, table = topology.parse_topics_file(text)
    except topology.TopicsFileError as e:
        raise TxnReconError(f"{path}: {e}") from None
    topics = topology.business(broker, table)
    stream = Stream(landing / "topology", f"store-{broker}-topics-{stamp or mtime_ms}", ENCODE["topology"])
    for record in topology.table_records(stamp or mtime_ms, broker, None, (stamp, topics)):
        stream.add(record)
    stream.close()
    return len(topics)


def run(args: argparse.Namespace, config: Config) -> int:
    store: Path = args.store
    if not (store / "commitlog").is_dir():
        raise TxnReconError(f"--store {store} is not a RocketMQ store folder (no commitlog/ in it)")
    broker = args.broker_name
    if not re.fullmatch(r"[\w.-]+", broker):
        raise TxnReconError(f"--broker-name {broker!r} may hold only letters, digits, '_', '-' and '.'")
    landing: Path = args.landing
    make_landing(landing)
    state_path = landing / "_export" / f"{broker}.json"
    with folder_lock(landing / "_export", f"the export state of {broker} in {landing}", "export-store",
                     name=f".{broker}.lock"):  # fmt: skip
        state = State.load(state_path)
        summary = Summary()
        started_at = state.position
        trace_topics = TRACE_TOPICS | frozenset(config.collect.trace_topics)
        stop = _export_commitlog(store, landing, broker, state, summary, trace_topics)
        state.position = stop.position
        _export_offsets(store, landing, broker, state, summary)
        state.save(state_path)  # what came before a corrupt record stays exported
        topics = _export_topics(store, landing, broker)
        if stop.error is not None:
            raise TxnReconError(stop.error)
    skipped = ", ".join(f"{t} {n}" for t, n in sorted(summary.skipped.items())) or "none"
    print(
        f"export-store {broker}: commit log {started_at} -> {state.position}; records: "
        f"half {summary.records['half']}, op {summary.records['op']}, real {summary.records['real']}, "
        f"consumer copies {summary.records['copy']}, trace contexts {summary.records['trace']}; "
        f"offset records {summary.offsets} ({summary.offsets_skipped} internal queue offsets skipped); "
        f"business topics {topics}; corrupt records {summary.corrupt}; skipped topics: {skipped}"
        + (f"; RIP-82 ops whose half is gone {summary.ops_without_half}" if summary.ops_without_half else "")
    )
    return 0


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["export-store", *sys.argv[1:]]))
