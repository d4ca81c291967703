"""`txn-recon collect` throughput and memory against a real RocketMQ 5.3.3 broker on loopback.

Run with `make bench-collect`. The official Java client sends plain 200-byte messages to a 4-queue topic
in batches (BENCH_COLLECT_MESSAGES="100000 500000" by default: the totals after each round). After each
round a collector in a process of its own reads the whole broker into a fresh landing folder. Prints the
messages pulled and written per second (wall time, the landing files flushed to disk included) and the
collector's peak RSS: two sizes, to show its memory flat in the number of messages. A benchmark, not a
test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.rocketmq.cluster import BrokerSettings, RocketMQ, compile_driver, run_driver


def collect_once(namesrv: str, landing: Path) -> None:
    """In a child process: one collect pass, timed without the interpreter's start."""
    from jobs.collect import run
    from jobs.config import load_config

    started, cpu = time.perf_counter(), time.process_time()
    code = run(argparse.Namespace(namesrv=namesrv, landing=landing, once=True, every=None), load_config())
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    rows = [json.loads(line) for f in (landing / "_collect" / "runs").glob("*.jsonl") for line in f.open()]
    print(json.dumps({"code": code, "seconds": seconds, "cpu_seconds": cpu,
                      "messages": sum(r["half"] + r["op"] + r["real"] for r in rows),
                      "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))  # fmt: skip


def child(namesrv: str, landing: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tests.bench.bench_collect", "--collect", namesrv, str(landing)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--collect":
        collect_once(sys.argv[2], Path(sys.argv[3]))
        return 0
    totals = [int(x) for x in os.environ.get("BENCH_COLLECT_MESSAGES", "100000 500000").split()]
    (Path.cwd() / "landing").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-collect-", dir=Path.cwd() / "landing") as tmp:
        root = Path(tmp)
        classes = compile_driver(root / "classes")
        settings = BrokerSettings(commitlog_file_bytes=1 << 30)  # the broker's default file size
        with RocketMQ(root, settings) as rmq:
            sent = 0
            for total in totals:
                started = time.perf_counter()
                run_driver(classes, "bulk", rmq.namesrv, root / "sent.jsonl", str(total - sent), home=root / "client",
                           timeout_s=1800)  # fmt: skip
                print(f"sent {total - sent:,} messages with the Java client in {time.perf_counter() - started:.1f} s")
                sent = total
                f = child(rmq.namesrv, root / f"landing-{total}")
                print(f"collect {f['messages']:,} messages: {f['seconds']:.1f} s wall "
                      f"({f['messages'] / f['seconds']:,.0f} messages/s pulled and written), {f['cpu_seconds']:.1f} s "
                      f"CPU; peak RSS {f['peak_mib']:,.0f} MiB; exit {f['code']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
