"""Reconcile time and peak driver memory for N transactions of the default profile.

Run with `make bench-reconcile` (N = 1,000,000; `BENCH_TRANSACTIONS="1000000 5000000"` for more).
Simulates a Parquet landing, ingests it, then times `txn-recon reconcile` as its own process and
samples the peak resident memory (VmHWM) of that process tree, the driver JVM included.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TXN_RECON = str(Path(sys.executable).parent / "txn-recon")


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
    return out


def _hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def timed_job(cmd: list[str]) -> tuple[float, int, str]:
    """Wall time, the largest peak RSS (MiB) of any process in the command's tree, and its stderr."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max([peak, *(_hwm_kib(p) for p in _tree(proc.pid))])
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:2])} failed:\n{err}")
    return time.perf_counter() - started, peak // 1024, err


def timed(cmd: list[str]) -> tuple[float, int]:
    seconds, peak, _ = timed_job(cmd)
    return seconds, peak


def main() -> int:
    sizes = [int(n) for n in os.environ.get("BENCH_TRANSACTIONS", "1000000").split()]
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-reconcile-") as tmp:
            landing, warehouse = Path(tmp) / "landing", Path(tmp) / "warehouse"
            subprocess.run([TXN_RECON, "simulate", "--out", str(landing), "--transactions", str(n), "--format",
                            "parquet"], check=True, capture_output=True)  # fmt: skip
            ingest_s, _ = timed([TXN_RECON, "ingest", "--landing", str(landing), "--warehouse", str(warehouse)])
            reconcile_s, peak = timed([TXN_RECON, "reconcile", "--warehouse", str(warehouse)])
            print(f"reconcile {n:,} transactions: {reconcile_s:.1f} s ({n / reconcile_s:,.0f} transactions/s, "
                  f"whole job, JVM start included), peak driver memory {peak:,} MiB; ingest took {ingest_s:.1f} s",
                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
