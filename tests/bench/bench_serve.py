"""`make bench-serve`: what a serve cycle costs that brings about 1,000 new transactions to a warehouse
that already holds N reconciled ones (BENCH_TRANSACTIONS, default "10000 1000000").

For each N the model simulates N + 1,000 transactions of the default profile as Parquet, split by event
time into `base` and `tail`: the tail is the window in which the last 1,000 transactions arrive, with every
event of that window (their halves, ops and messages, the answers to older ones, offset commits), the same
at every N, so that the cycles differ only by the warehouse. The base is split again into `start` and
`warm-1` to `warm-3`, each warm part the window of the 1,000 arrivals before the next part's
(landing/bench-serve-N+1000, reused when it is there).
`txn-recon ingest` and `reconcile` make the warehouse from `start`, reconciled as of a second before its
last event; then `txn-recon serve` starts on it with a cycle every 5 s. Its first cycle finds nothing new
to ingest but, after a start, runs every step once, reconciling that last second incrementally (a reconcile
with nothing new at all would compute nothing); then the warm parts land one per cycle, as a cluster in
steady traffic brings them, so that the measured cycle runs code the JVM has compiled, as a service's do;
then `tail` lands and the next cycle brings it in: N transactions are reconciled when it starts. Printed: the warm
cycles' seconds, then that cycle's status, how it reconciled (incremental, else the bench exits 1 at its end),
seconds per step and Spark jobs from serve's own line (the metrics' reading of the tables included; collect
excluded: nothing to collect here), and the peak resident memory of serve's process tree; serve's log is kept in
artifacts/bench-logs. Then, on the same warehouse, the floor of that cycle (`tests.bench.floor cycle`): what Delta
alone takes, warm, to write and read the rows the cycle wrote, with no rule, expectation or dashboard, and the same
with the outputs appended instead of merged; its steps are kept beside serve's log. The last line puts the sizes
side by side, "cycle ratio 1M/10k X (floor R); cycle/floor Y; jobs Z (floor F)": the cycle on the largest warehouse
over the same on the smallest (and the same ratio of their floors), and the largest cycle/floor and job count of
any size (and the most its floor ran). A benchmark, not a test: nothing asserts on time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tests.bench.bench_pipeline import FLOOR, ROOT, TIME, Window, split_landing
from tests.bench.bench_reconcile import TXN_RECON, _hwm_kib, _tree, timed, timed_job

NEW_TRANSACTIONS = 1_000  # what the measured cycle brings, whatever the warehouse holds
# Cycles that bring as much before the measured one: a service in steady traffic, whose JVM has compiled the code
# that every cycle runs again (in the first cycles after a start, the JIT compiler's threads take much of the CPU).
WARM_CYCLES = 3
LOGS = ROOT / "artifacts" / "bench-logs"
CYCLE = re.compile(r"txn-recon serve: cycle (\d+) (\w+): inserted (\d+)(.*)")
JOBS = re.compile(r", Spark jobs (\d+) \(([^)]*)\)")
APPENDED = re.compile(r"floor done, outputs appended \(([\d.]+) s\)")
FLOOR_JOBS = re.compile(r"floor Spark jobs (\d+)\n.*floor Spark jobs, outputs appended (\d+)", re.S)


def arrivals(new: int) -> Window:
    """The window in which the last `new` transactions arrive: after the first half of the transaction
    before them, up to the first half of the last. What a cycle of a cluster in steady traffic
    brings; the checks and answers after the simulated traffic stops (a drain no running cluster has, and
    which is nearly all of the last events at 10,000) are left out."""

    def window(tables: dict[str, pa.Table]) -> tuple[int, int]:
        times = births(tables["half"])
        return times[-new - 1].as_py(), times[-1].as_py()

    return window


def births(half: pa.Table) -> pa.Array:
    """The store time of each transaction's first half, earliest first."""
    first = half.group_by(["broker_name", "uniq_key"]).aggregate([("store_timestamp", "min")])
    order = pc.sort_indices(first, sort_keys=[("store_timestamp_min", "ascending")])
    return pc.take(first.column("store_timestamp_min"), order)


def landing_for(n: int) -> tuple[Path, list[Path], Path]:
    """landing/bench-serve-N+1000/{start,warm-1..,tail}, simulated and split once: the base split again into
    its start and the arrivals of the WARM_CYCLES x 1,000 transactions before the tail's."""
    root = ROOT / "landing" / f"bench-serve-{n}+{NEW_TRANSACTIONS}"
    split = root / "split.json"
    if "window" not in (json.loads(split.read_text()) if split.exists() else {}):  # an older split: the last events
        split_landing(root, n + NEW_TRANSACTIONS, arrivals(NEW_TRANSACTIONS))
        split.write_text(json.dumps({**json.loads(split.read_text()), "window": "arrivals"}))
    if json.loads(split.read_text()).get("warm") != WARM_CYCLES:
        split.write_text(json.dumps({**json.loads(split.read_text()), **split_warm(root), "warm": WARM_CYCLES}))
    return root / "start", [root / f"warm-{k}" for k in range(1, WARM_CYCLES + 1)], root / "tail"


def split_warm(root: Path) -> dict[str, int]:
    """Split root/base by event time into root/start and the WARM_CYCLES parts after it, each the window in
    which the next 1,000 of its transactions arrive (the last one up to the base's end); their counts."""
    tables = {s: pq.read_table(root / "base" / s / "part-00000.parquet") for s in TIME}
    born = births(tables["half"])
    cuts = [born[-k * NEW_TRANSACTIONS - 1].as_py() for k in range(WARM_CYCLES, 0, -1)]
    bounds = [None, *cuts, None]  # part i holds the events after bounds[i], up to bounds[i + 1]
    names = ["start", *(f"warm-{k}" for k in range(1, WARM_CYCLES + 1))]
    counts = {}
    for i, name in enumerate(names):
        counts[name] = 0
        for s, table in tables.items():
            at = table.column(TIME[s])
            kept = pc.greater(at, bounds[i]) if bounds[i] is not None else pc.is_valid(at)
            if bounds[i + 1] is not None:
                kept = pc.and_(kept, pc.less_equal(at, bounds[i + 1]))
            rows = table.filter(kept)
            (root / name / s).mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, root / name / s / "part-00000.parquet", row_group_size=250_000)
            counts[name] += rows.num_rows
    return counts


def last_event(landing: Path) -> int:
    """The latest event time in a landing folder: the data time serve reconciles it as of."""
    return max(pc.max(pq.read_table(landing / s / "part-00000.parquet", columns=[c])[c]).as_py()
               for s, c in TIME.items())  # fmt: skip


def cycles(log: Path) -> list[re.Match[str]]:
    return list(CYCLE.finditer(log.read_text(errors="replace")))


def wait_for_cycle(log: Path, after: int, proc: subprocess.Popen[bytes], peak: list[int]) -> re.Match[str]:
    while len(cycles(log)) <= after:
        if proc.poll() is not None:
            raise SystemExit(f"serve ended:\n{log.read_text()[-3000:]}")
        peak[0] = max([peak[0], *(_hwm_kib(p) for p in _tree(proc.pid))])
        time.sleep(0.5)
    return cycles(log)[after]


def bring(part: Path, landing: Path, log: Path, proc: subprocess.Popen[bytes], peak: list[int]) -> re.Match[str]:
    """Land `part` beside what serve watches; the line of the cycle that took it in."""
    for s in TIME:
        os.link(part / s / "part-00000.parquet", landing / s / f"{part.name}.parquet")
    new = wait_for_cycle(log, len(cycles(log)), proc, peak)
    while int(new[3]) == 0:  # a cycle that had begun before the part landed
        new = wait_for_cycle(log, int(new[1]), proc, peak)
    return new


def reconciled(log: Path, m: re.Match[str]) -> str:
    """How the cycle of line `m` reconciled (full, incremental or unchanged), from its reconcile's last line
    before the next step's."""
    step = rf"cycle {m[1]}: reconcile\n(?:(?!cycle \d+: ).)*?reconcile done: (\w+),"
    found = re.search(step, log.read_text(errors="replace"), re.S)
    return found[1] if found else "not at all"


def _status(m: re.Match[str]) -> str:
    """ok, idle, or failed with serve's reason: a failed cycle's seconds are not a cycle's."""
    return m[2] if m[2] != "failed" else f"FAILED ({m[4].partition('; ')[2].strip()})"


def _seconds(m: re.Match[str]) -> float:
    return sum(float(v) for _, v in re.findall(r"(\w+) ([\d.]+) s", m[4]))


def _jobs(m: re.Match[str]) -> re.Match[str]:
    """The Spark jobs of serve's cycle line: their number, then the count per step."""
    found = JOBS.search(m[4])
    if found is None:
        raise SystemExit(f"serve's cycle line counts no Spark jobs: {m[0]}")
    return found


def _steps(m: re.Match[str]) -> str:
    steps = re.findall(r"(\w+) ([\d.]+) s", m[4])
    jobs = _jobs(m)
    return f"{_seconds(m):.1f} s in all ({', '.join(f'{k} {v} s' for k, v in steps)}); Spark jobs {jobs[1]} ({jobs[2]})"


class Floor(NamedTuple):
    merged_s: float
    appended_s: float
    merged_jobs: int
    appended_jobs: int


def cycle_floor(warehouse: Path, log: Path) -> Floor:
    """`tests.bench.floor cycle` on the warehouse: its seconds and Spark jobs with the outputs merged and
    appended; its steps written to `log`."""
    _, _, err = timed_job([sys.executable, "-m", "tests.bench.floor", "cycle", str(warehouse)])
    log.write_text(err)
    merged, appended, jobs = FLOOR.search(err), APPENDED.search(err), FLOOR_JOBS.search(err)
    if merged is None or appended is None or jobs is None:
        raise SystemExit(f"the floor of the cycle printed no figure:\n{err[-3000:]}")
    return Floor(float(merged[1]), float(appended[1]), int(jobs[1]), int(jobs[2]))


def main() -> int:
    sizes = [int(n) for n in os.environ.get("BENCH_TRANSACTIONS", "10000 1000000").split()]
    # size -> the cycle's seconds, its floor's, the cycle's Spark jobs, its floor's
    measured: dict[int, tuple[float, float, int, int]] = {}
    modes: dict[int, str] = {}  # size -> how the measured cycle reconciled
    for n in sizes:
        start, warm_parts, tail = landing_for(n)
        with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
            landing, warehouse, log = Path(tmp) / "landing", Path(tmp) / "warehouse", Path(tmp) / "serve.log"
            for s in TIME:
                (landing / s).mkdir(parents=True)
                os.link(start / s / "part-00000.parquet", landing / s / "start.parquet")
            wh = ["--warehouse", str(warehouse)]
            ingest_s, _ = timed([TXN_RECON, "ingest", "--landing", str(landing), *wh])
            reconcile_s, _ = timed([TXN_RECON, "reconcile", "--as-of", str(last_event(start) - 1000), *wh])
            conf = Path(tmp) / "serve.yaml"
            conf.write_text(json.dumps({"serve": {"every_s": 5, "http": "127.0.0.1:0", "sql": None}}))
            with open(log, "wb") as out:
                proc = subprocess.Popen([TXN_RECON, "serve", "--landing", str(landing), "--conf", str(conf), *wh],
                                        stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
            peak = [0]
            warm = wait_for_cycle(log, 0, proc, peak)
            brought = [bring(part, landing, log, proc, peak) for part in [*warm_parts, tail]]
            new = brought[-1]
            proc.send_signal(signal.SIGTERM)
            proc.wait(600)
            LOGS.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, LOGS / f"serve-{n}.log")  # the cycles' own lines, kept for a figure that surprises
            modes[n] = reconciled(log, new)
            floor = cycle_floor(warehouse, LOGS / f"floor-{n}.log")
            print(f"serve on {n:,} reconciled transactions (made by ingest {ingest_s:.0f} s, reconcile "
                  f"{reconcile_s:.0f} s; its log: {LOGS / f'serve-{n}.log'}):\n  warm-up cycle {_status(warm)}: "
                  f"{_steps(warm)}\n  the {len(warm_parts)} cycles after it, each bringing the arrivals of "
                  f"{NEW_TRANSACTIONS:,} transactions: {', '.join(f'{_seconds(m):.1f} s' for m in brought[:-1])}\n  "
                  f"the cycle that brought {int(new[3]):,} new records {_status(new)}, reconciled {modes[n]}: "
                  f"{_steps(new)}\n  peak RSS of "
                  f"serve's process tree {peak[0] // 1024:,} MiB\n  the floor of that "
                  f"cycle, Delta alone writing and reading its rows: {floor.merged_s:.1f} s, {floor.merged_jobs} "
                  f"Spark jobs; with the outputs appended instead of merged {floor.appended_s:.1f} s, "
                  f"{floor.appended_jobs} Spark jobs (its steps: {LOGS / f'floor-{n}.log'})",
                  flush=True)  # fmt: skip
            measured[n] = (_seconds(new), floor.merged_s, int(_jobs(new)[1]), floor.merged_jobs)
    print(ratios(measured), flush=True)
    # A failing incremental plan falls back to a full run (always safe) with a warning: its figures are not those
    # of the cycle this benchmark measures.
    others = {n: mode for n, mode in modes.items() if mode != "incremental"}
    if others:
        print(f"bench-serve: the measured cycle did not reconcile incrementally: {others}", file=sys.stderr)
        return 1
    return 0


def ratios(measured: dict[int, tuple[float, float, int, int]]) -> str:
    """The issue's three figures in one line: the measured cycle on the largest warehouse over the same cycle
    on the smallest (with the same ratio of their floors: how much of the growth is the engine's, or the
    hour's), the largest cycle/floor of any size, and the most Spark jobs a cycle ran (with the most its
    floor ran beside it)."""
    small, large = min(measured), max(measured)
    flat, floor_flat = (measured[large][i] / measured[small][i] for i in (0, 1))
    return (
        f"cycle ratio {_size(large)}/{_size(small)} {flat:.2f} (floor {floor_flat:.2f}); cycle/floor "
        f"{max(s / f for s, f, _, _ in measured.values()):.2f}; jobs {max(m[2] for m in measured.values())} "
        f"(floor {max(m[3] for m in measured.values())})"
    )


def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1_000}k" if n % 1_000 == 0 else str(n)


if __name__ == "__main__":
    sys.exit(main())
