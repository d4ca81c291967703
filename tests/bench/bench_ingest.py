"""Ingest throughput: a landing of about a million events, from JSON Lines and from Parquet.

Run with `make bench-ingest`; prints wall time and events per second for each format (a benchmark,
not a test: nothing here asserts on time).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TXN_RECON = str(Path(sys.executable).parent / "txn-recon")
TRANSACTIONS = 385_000  # about 2.6 events per transaction in the default profile: ~1M events


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        root = Path(tmp)
        for fmt in ("jsonl", "parquet"):
            landing, warehouse = root / f"landing-{fmt}", root / f"warehouse-{fmt}"
            subprocess.run([TXN_RECON, "simulate", "--out", str(landing), "--transactions", str(TRANSACTIONS),
                            "--format", fmt], check=True, capture_output=True)  # fmt: skip
            events = sum(json.loads((landing / "_truth/meta.json").read_text())["records"].values())
            started = time.perf_counter()
            done = subprocess.run([TXN_RECON, "ingest", "--landing", str(landing), "--warehouse", str(warehouse)],
                                  capture_output=True, text=True)  # fmt: skip
            elapsed = time.perf_counter() - started
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
            print(done.stdout.strip())
            print(f"ingest {fmt}: {events:,} events in {elapsed:.1f} s (whole job, JVM start included): "
                  f"{events / elapsed:,.0f} events/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
