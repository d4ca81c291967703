"""export-store throughput and memory: a commit log of transactional traffic from the broker model, written
through the store encoding (tests/store_encoding.py) into 1 GiB files, then exported by one process.

Run with `make bench-export` (BENCH_EXPORT_MIB="256 1024" by default: two sizes, to show memory flat in
the store's size). Prints records per second of the export's own work, by wall time (which includes
flushing the landing files to disk) and by CPU time, and its peak RSS; a benchmark, not a test: nothing
here asserts on time.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.profiles import PROFILES
from broker.simulation import simulate
from schemas import LANDING
from tests.store_encoding import blank, encode

FILE_BYTES = 1 << 30  # mappedFileSizeCommitLog's default
_NAMES = {stream: schema.names for stream, schema in LANDING.items()}
_HALF_PROPS = {"uniq_key": "UNIQ_KEY", "transaction_id": "__transactionId__", "producer_group": "PGROUP",
               "real_topic": "REAL_TOPIC", "real_queue_id": "REAL_QID", "check_times": "TRANSACTION_CHECK_TIMES",
               "check_immunity_seconds": "CHECK_IMMUNITY_TIME_IN_SECONDS",
               "prepared_queue_offset": "TRAN_PREPARED_QUEUE_OFFSET", "tags": "TAGS", "keys": "KEYS"}  # fmt: skip


class _Full(Exception):
    pass


class CommitLogSink:
    """The model's half, op and real records as commit-log records, file after file, until `limit` bytes."""

    def __init__(self, folder: Path, limit: int) -> None:
        folder.mkdir(parents=True)
        self.folder, self.limit, self.position, self.records = folder, limit, 0, 0
        self.file_start, self.handle = 0, open(folder / f"{0:020d}", "wb")  # noqa: SIM115

    def record(self, stream: str, rec: tuple[Any, ...]) -> None:
        if stream not in ("half", "op", "real"):  # offsets, group snapshots and consumer copies: not written here
            return
        r = dict(zip(_NAMES[stream], rec, strict=True))
        if stream == "half":
            props = {p: str(r[k]) for k, p in _HALF_PROPS.items() if r[k] is not None} | {"TRAN_MSG": "true"}
            data = self._encode("RMQ_SYS_TRANS_HALF_TOPIC", props, r, b"x" * r["body_size"])
        elif stream == "op":
            data = self._encode("RMQ_SYS_TRANS_OP_HALF_TOPIC", {"TAGS": "d"}, r, r["body"].encode())
        else:
            props = {"UNIQ_KEY": r["uniq_key"], "TRAN_MSG": "true" if r["transactional"] else "false"}
            data = self._encode(r["topic"], props, r, b"x" * (r["body_size"] or 0), sys_flag=r["sys_flag"],
                                prepared=r["prepared_transaction_offset"] or 0)  # fmt: skip
        self.handle.write(data)
        self.position += len(data)
        self.records += 1
        if self.position >= self.limit:
            raise _Full

    def _encode(self, topic: str, props: dict[str, str], r: dict[str, Any], body: bytes, **kw: Any) -> bytes:
        def at(position: int) -> bytes:
            return encode(topic, props, position=position, body=body, queue_offset=r["queue_offset"],
                          queue_id=r["queue_id"], born=r["born_timestamp"], store=r["store_timestamp"],
                          **kw)  # fmt: skip

        data = at(self.position)
        if self.position + len(data) + 8 > self.file_start + FILE_BYTES:  # the writer's end-of-file rule
            self.handle.write(blank(self.file_start + FILE_BYTES - self.position))
            self.handle.close()
            self.file_start = self.position = self.file_start + FILE_BYTES
            self.handle = open(self.folder / f"{self.file_start:020d}", "wb")  # noqa: SIM115
            data = at(self.position)
        return data

    def close(self) -> None:
        self.handle.truncate(FILE_BYTES)  # the broker maps whole files; the unwritten rest reads as zeros
        self.handle.close()

    def truth_transaction(self, rec: tuple[Any, ...]) -> None:
        pass

    def truth_anomaly(self, rec: dict[str, Any]) -> None:
        pass


def build_store(store: Path, limit: int) -> int:
    sink = CommitLogSink(store / "commitlog", limit)
    with contextlib.suppress(_Full):  # the model runs until the commit log has its size
        simulate(10**9, 1, PROFILES["default"], sink)
    sink.close()
    return sink.records


def decode_only(store: Path) -> tuple[int, float]:
    """Records decoded into landing tuples (the commit-log decoder and the record mapping, no writing),
    and the CPU seconds it took."""
    import mmap

    from jobs.export_store import commitlog_files
    from sources.commitlog import Message, scan
    from sources.records import OP_TOPIC, RECORD, stream_of

    cpu, n = time.process_time(), 0
    for start, path in commitlog_files(store / "commitlog"):
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            entries = scan(buf, start, 0, frozenset({OP_TOPIC}))
            for entry in entries:
                if type(entry) is Message and (name := stream_of(entry.topic)) is not None:
                    RECORD[name]("broker-a", entry)
                    n += 1
            entries.close()
    return n, time.process_time() - cpu


def export_once(store: Path, landing: Path) -> None:
    """In a child process: the export job's own work, timed without the interpreter's start."""
    import argparse

    from jobs.config import load_config
    from jobs.export_store import run

    started, cpu = time.perf_counter(), time.process_time()
    run(argparse.Namespace(store=store, landing=landing, broker_name="broker-a"), load_config())
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu,
                      "peak_mib": peak_mib}))  # fmt: skip


def child(*args: str) -> dict[str, Any]:
    """One measurement in a process of its own (its peak memory is its own)."""
    done = subprocess.run([sys.executable, "-m", "tests.bench.bench_export", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    for line in done.stdout.strip().splitlines()[:-1]:  # the export's own summary line
        print(line)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--export":
        export_once(Path(sys.argv[2]), Path(sys.argv[3]))
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "--decode":
        n, cpu = decode_only(Path(sys.argv[2]))
        print(json.dumps({"decoded": n, "cpu_seconds": cpu}))
        return 0
    sizes = [int(x) for x in os.environ.get("BENCH_EXPORT_MIB", "256 1024").split()]
    with tempfile.TemporaryDirectory(prefix="bench-export-", dir=Path.cwd() / "landing") as tmp:
        for mib in sizes:
            store, landing = Path(tmp) / f"store-{mib}", Path(tmp) / f"landing-{mib}"
            started = time.perf_counter()
            records = build_store(store, mib << 20)
            print(f"built a {mib} MiB commit log: {records:,} records in {time.perf_counter() - started:.1f} s")
            decoded = child("--decode", str(store))
            print(f"decode {mib} MiB: {decoded['decoded']:,} records into landing records in "
                  f"{decoded['cpu_seconds']:.1f} s CPU on one core "
                  f"({decoded['decoded'] / decoded['cpu_seconds']:,.0f} records/s)")  # fmt: skip
            figures = child("--export", str(store), str(landing))
            seconds, cpu, peak_mib = figures["seconds"], figures["cpu_seconds"], figures["peak_mib"]
            print(f"export-store {mib} MiB: {records:,} records in {seconds:.1f} s wall ({records / seconds:,.0f} "
                  f"records/s, the landing files flushed to disk included), {cpu:.1f} s CPU on one core "
                  f"({records / cpu:,.0f} records/s); peak RSS {peak_mib:,.0f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
