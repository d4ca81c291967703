"""`make bench`: ingest and reconcile at 1M and 5M transactions, then 1% more events, incrementally.

For each size N (BENCH_TRANSACTIONS, default "1000000 5000000") the model simulates 1.01 x N
transactions of the default profile as Parquet into landing/bench-N (reused when it is there), split
by event time into `base` (about N transactions) and `tail` (the last 1% of events). Then, each
stage a `txn-recon` process of its own, timed with the peak resident memory of its process tree
(the driver JVM included, default driver settings):

  ingest base -> reconcile --full -> ingest tail -> reconcile (incremental) -> reconcile --full

The incremental run is compared with the last full run, which sees the same data. Figures go to
stdout and to BENCH_OUT (default artifacts/bench.json). A benchmark, not a test: nothing asserts on time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tests.bench.bench_reconcile import TXN_RECON, timed_job

ROOT = Path(__file__).resolve().parents[2]
TIME = {"half": "store_timestamp", "op": "store_timestamp", "real": "store_timestamp", "offset": "commit_timestamp"}
TAIL_SHARE = 0.01
DONE = re.compile(r"reconcile done: (\w+), (\d+) transactions, (\d+) queues \(([\d.]+) s\)")
STEP = re.compile(r"(\w+) (?:written|merged) \(([\d.]+) s\)")  # reconcile's progress: a table done, seconds in


def landing_for(n: int) -> tuple[Path, Path, dict[str, int]]:
    """landing/bench-N/{base,tail}, simulated and split once; the event counts of both parts."""
    root = ROOT / "landing" / f"bench-{n}"
    counts_file = root / "split.json"
    if not counts_file.exists():
        split_landing(root, n + n // 100, TAIL_SHARE)
    return root / "base", root / "tail", json.loads(counts_file.read_text())


def split_landing(root: Path, transactions: int, tail_share: float) -> None:
    """Simulate `transactions` as Parquet, split by event time into root/base and root/tail (the last
    `tail_share` of events), and write the counts of both to root/split.json."""
    shutil.rmtree(root, ignore_errors=True)
    sim = root / "simulated"
    started = time.perf_counter()
    subprocess.run([TXN_RECON, "simulate", "--out", str(sim), "--transactions", str(transactions), "--format",
                    "parquet"], check=True, capture_output=True)  # fmt: skip
    print(f"simulated {transactions:,} transactions in {time.perf_counter() - started:.0f} s", flush=True)
    tables = {s: pq.read_table(sim / s) for s in TIME}
    times = pa.chunked_array([c for s, t in tables.items() for c in t.column(TIME[s]).chunks])
    cut = pc.quantile(times, q=1 - tail_share, interpolation="lower")[0].as_py()
    counts = {"base": 0, "tail": 0}
    for s, table in tables.items():
        late = pc.greater(table.column(TIME[s]), cut)
        for part, rows in (("base", table.filter(pc.invert(late))), ("tail", table.filter(late))):
            (root / part / s).mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, root / part / s / "part-00000.parquet", row_group_size=250_000)
            counts[part] += rows.num_rows
    shutil.rmtree(sim)
    (root / "split.json").write_text(json.dumps(counts))


def stage(name: str, cmd: list[str], items: int, unit: str) -> dict[str, Any]:
    seconds, peak, err = timed_job(cmd)
    logs = ROOT / "artifacts" / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{name.replace(' ', '-')}-{items}.log").write_text(err)  # the job's own progress lines
    figure: dict[str, Any] = {"stage": name, "wall_s": round(seconds, 1), "peak_rss_mib": peak, unit: items,
                              f"{unit}_per_s": round(items / seconds)}  # fmt: skip
    done = DONE.search(err)
    if done:  # reconcile logs its own time, without JVM start and session set-up
        job_s, touched = float(done[4]), int(done[2])
        figure |= {"mode": done[1], "transactions_computed": touched, "queues": int(done[3]), "job_s": job_s,
                   "transactions_per_s_in_job": round(items / job_s)}  # fmt: skip
    steps = dict(STEP.findall(err))
    if "deliveries" in steps:  # the deliveries table, written last: its own seconds within the job
        figure["deliveries_s"] = round(float(steps["deliveries"]) - float(steps["txn_lifecycle"]), 1)
    print(f"  {name:<22} {figure['wall_s']:>8.1f} s  {figure[f'{unit}_per_s']:>10,} {unit}/s  "
          f"peak {peak:,} MiB" + (f"  (in job {figure['job_s']:.1f} s, {figure['mode']})" if done else "")
          + (f", of which deliveries {figure['deliveries_s']:.1f} s" if "deliveries_s" in figure else ""),
          flush=True)  # fmt: skip
    return figure


def bench(n: int) -> dict[str, Any]:
    base, tail, counts = landing_for(n)
    warehouse = ROOT / "landing" / f"bench-{n}" / "warehouse"
    shutil.rmtree(warehouse, ignore_errors=True)
    wh = ["--warehouse", str(warehouse)]
    print(f"{n:,} transactions: {counts['base']:,} events, then {counts['tail']:,} more", flush=True)
    stages = [
        stage("ingest", [TXN_RECON, "ingest", "--landing", str(base), *wh], counts["base"], "events"),
        stage("reconcile full", [TXN_RECON, "reconcile", "--full", *wh], n, "transactions"),
        stage("ingest 1% more", [TXN_RECON, "ingest", "--landing", str(tail), *wh], counts["tail"], "events"),
        stage("reconcile incremental", [TXN_RECON, "reconcile", *wh], n, "transactions"),
        stage("reconcile full again", [TXN_RECON, "reconcile", "--full", *wh], n, "transactions"),
    ]
    incremental, full = stages[3], stages[4]
    ratio = {"wall": round(incremental["wall_s"] / full["wall_s"], 3),
             "in_job": round(incremental["job_s"] / full["job_s"], 3)}  # fmt: skip
    print(f"  incremental / full: {ratio['wall']:.1%} of the wall time, {ratio['in_job']:.1%} in job", flush=True)
    shutil.rmtree(warehouse, ignore_errors=True)
    return {"transactions": n, "events": counts, "stages": stages, "incremental_over_full": ratio}


def main() -> int:
    sizes = [int(n) for n in os.environ.get("BENCH_TRANSACTIONS", "1000000 5000000").split()]
    out = Path(os.environ.get("BENCH_OUT", ROOT / "artifacts" / "bench.json"))
    results = [bench(n) for n in sizes]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cores": os.cpu_count()}, "runs": results}, indent=2) + "\n")
    print(f"figures: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
