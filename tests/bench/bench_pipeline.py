"""`make bench`: ingest and reconcile at 1M and 2M transactions, then 1% more events, incrementally.

For each size N (BENCH_TRANSACTIONS, default "1000000 2000000") the model simulates 1.01 x N
transactions of the default profile as Parquet into landing/bench-N (reused when it is there), split
by event time into `base` (about N transactions) and `tail` (the last 1% of events). Then, each
stage a `txn-recon` process of its own, timed with the peak resident memory of its process tree
(the driver JVM included, default driver settings):

  ingest base -> reconcile --full -> ingest tail -> reconcile (incremental) -> reconcile --full

The incremental run is compared with the last full run, which sees the same data. After the full run,
the peer (`tests.bench.peer_duckdb`: DuckDB running the lifecycle, transaction rules and offset regressions
over the same base landing, a process of its own) is timed too, and its findings and lifecycle states are
compared with the tables'; the ratio is ingest plus full reconcile over the peer's time. Next to each
target, the floor this machine sets (`tests.bench.floor`, no check or rule of ours): the landing copied
into plain Delta tables and one row per transaction written, against the peer; and the least an
incremental run writes (as appends), on a copy of the warehouse as the incremental run found it, against
the full run. Figures go to stdout and to BENCH_OUT (default artifacts/bench.json). A benchmark, not a
test: nothing asserts on time, but findings that differ from the peer's end it with exit 1 after the
figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.config import load_config
from jobs.reconcile import rules_from
from tests.bench.bench_reconcile import TXN_RECON, timed_job
from tests.bench.peer_duckdb import FINDING, finding_key

ROOT = Path(__file__).resolve().parents[2]
TIME = {"half": "store_timestamp", "op": "store_timestamp", "real": "store_timestamp", "offset": "commit_timestamp"}
TAIL_SHARE = 0.01
DONE = re.compile(r"reconcile done: (\w+), (\d+) transactions, (\d+) queues \(([\d.]+) s\)")
FLOOR = re.compile(r"floor done \(([\d.]+) s; not counted ([\d.]+) s\)")
STEP = re.compile(r"(\w+) (?:written|merged) \(([\d.]+) s\)")  # reconcile's progress: a table done, seconds in
# The anomaly types the peer computes: the transaction rules and offset regressions of DESIGN §2.
PEER_TYPES = ("STUCK_HALF", "DISCARDED_AFTER_MAX_CHECKS", "DISCARDED_EXPIRED", "ORPHANED_COMMIT", "DUPLICATE_COMMIT",
              "RECHECKED_AFTER_RESOLUTION", "OFFSET_REGRESSION")  # fmt: skip


def landing_for(n: int) -> tuple[Path, Path, dict[str, int]]:
    """landing/bench-N/{base,tail}, simulated and split once; the event counts of both parts."""
    root = ROOT / "landing" / f"bench-{n}"
    counts_file = root / "split.json"
    if not counts_file.exists():
        split_landing(root, n + n // 100, last_share(TAIL_SHARE))
    return root / "base", root / "tail", json.loads(counts_file.read_text())


Window = Callable[[dict[str, pa.Table]], tuple[Any, Any]]  # the streams' tables -> (cut, end) in event time


def last_share(share: float) -> Window:
    """The last `share` of all events."""

    def window(tables: dict[str, pa.Table]) -> tuple[Any, Any]:
        times = pa.chunked_array([c for s, t in tables.items() for c in t.column(TIME[s]).chunks])
        return pc.quantile(times, q=1 - share, interpolation="lower")[0].as_py(), pc.max(times).as_py()

    return window


def split_landing(root: Path, transactions: int, window: Window) -> None:
    """Simulate `transactions` as Parquet and split it by event time at `window` = (cut, end): root/base
    holds the events up to the cut, root/tail those after it up to the end (later ones are left out); the
    counts of both go to root/split.json."""
    shutil.rmtree(root, ignore_errors=True)
    sim = root / "simulated"
    started = time.perf_counter()
    subprocess.run([TXN_RECON, "simulate", "--out", str(sim), "--transactions", str(transactions), "--format",
                    "parquet"], check=True, capture_output=True)  # fmt: skip
    print(f"simulated {transactions:,} transactions in {time.perf_counter() - started:.0f} s", flush=True)
    tables = {s: pq.read_table(sim / s) for s in TIME}
    cut, end = window(tables)
    counts = {"base": 0, "tail": 0}
    for s, table in tables.items():
        at = table.column(TIME[s])
        late = pc.greater(at, cut)
        parts = (("base", pc.invert(late)), ("tail", pc.and_(late, pc.less_equal(at, end))))
        for part, kept in parts:
            rows = table.filter(kept)
            (root / part / s).mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, root / part / s / "part-00000.parquet", row_group_size=250_000)
            counts[part] += rows.num_rows
    shutil.rmtree(sim)
    (root / "split.json").write_text(json.dumps(counts))


EVENT_LOGS = ROOT / "artifacts" / "bench-logs" / "spark-events"
TABLE = re.compile(r"txn_recon\.db/(\w+)/|txn_recon\.(\w+)\[")  # a scan's table in its plan text, by name or by folder
LANDED = re.compile(r"/(\w+)/[^/\]]*\]")  # else the landing folder of the files it lists


def event_log_layer() -> Path:
    """A --conf layer that has each job write Spark's event log, for `spark_metrics`."""
    EVENT_LOGS.mkdir(parents=True, exist_ok=True)
    layer = EVENT_LOGS.parent / "event-log.yaml"
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.rolling.enabled": "false",
        "spark.eventLog.compress": "false",
        "spark.eventLog.dir": EVENT_LOGS.as_uri(),
    }
    layer.write_text(json.dumps({"spark": {"conf": conf}}))
    return layer


def spark_metrics(log: Path) -> dict[str, Any]:
    """Spark's own account of one job from its event log: jobs, stages, tasks, records read, bytes shuffled
    and spilled, and the files each table's scans read."""
    m: Counter[str] = Counter()
    files_metric: dict[int, str] = {}  # accumulator id of a scan's "number of files read" -> its table
    files: Counter[str] = Counter()

    def scans(node: dict[str, Any]) -> None:
        if node.get("nodeName", "").startswith("Scan"):
            text = node.get("simpleString", "")
            table, landed = TABLE.search(text), LANDED.search(text)
            table_name = (
                (table[1] or table[2]) if table else "Delta logs" if "add#" in text else
                f"landing {landed[1]}" if landed else "?"
            )  # fmt: skip
            for metric in node.get("metrics", []):
                if metric["name"] == "number of files read":
                    files_metric[metric["accumulatorId"]] = table_name
        for child in node.get("children", []):
            scans(child)

    for line in log.open(encoding="utf-8"):
        e = json.loads(line)
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            m["jobs"] += 1
        elif kind == "SparkListenerStageCompleted":
            m["stages"] += 1
        elif kind == "SparkListenerTaskEnd":
            t = e.get("Task Metrics") or {}
            read = t.get("Shuffle Read Metrics", {})
            m["tasks"] += 1
            m["input_records"] += t.get("Input Metrics", {}).get("Records Read", 0)
            m["shuffle_read_bytes"] += read.get("Remote Bytes Read", 0) + read.get("Local Bytes Read", 0)
            m["shuffle_write_bytes"] += t.get("Shuffle Write Metrics", {}).get("Shuffle Bytes Written", 0)
            m["spill_bytes"] += t.get("Disk Bytes Spilled", 0)
        elif kind.endswith("SQLExecutionStart") or kind.endswith("SQLAdaptiveExecutionUpdate"):
            scans(e.get("sparkPlanInfo", {}))
        elif kind.endswith("SQLAdaptiveSQLMetricUpdates"):
            for metric in e.get("sqlPlanMetrics", []):
                if metric["name"] == "number of files read":
                    files_metric.setdefault(metric["accumulatorId"], "?")
        elif kind.endswith("DriverAccumUpdates"):
            for acc_id, value in e.get("accumUpdates", []):
                if acc_id in files_metric:
                    files[files_metric[acc_id]] += value
    return dict(m) | {"files_read": {t: n for t, n in files.most_common() if n}}


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def stage(name: str, cmd: list[str], items: int, unit: str) -> dict[str, Any]:
    layer = event_log_layer()
    before = set(EVENT_LOGS.iterdir())
    seconds, peak, err = timed_job([*cmd, "--conf", str(layer)])
    logs = ROOT / "artifacts" / "bench-logs"
    (logs / f"{name.replace(' ', '-')}-{items}.log").write_text(err)  # the job's own progress lines
    figure: dict[str, Any] = {"stage": name, "wall_s": round(seconds, 1), "peak_rss_mib": peak, unit: items,
                              f"{unit}_per_s": round(items / seconds)}  # fmt: skip
    done = DONE.search(err)
    if done:  # reconcile logs its own time, without JVM start and session set-up
        job_s, touched = float(done[4]), int(done[2])
        figure |= {"mode": done[1], "transactions_computed": touched, "queues": int(done[3]), "job_s": job_s,
                   "transactions_per_s_in_job": round(items / job_s)}  # fmt: skip
    # When each table was done, in seconds since the job began: reconcile writes some side by side, in two
    # threads, so these are times, not each table's own cost.
    if steps := {table: float(s) for table, s in STEP.findall(err)}:
        figure["tables_done_s"] = steps
    print(f"  {name:<22} {figure['wall_s']:>8.1f} s  {figure[f'{unit}_per_s']:>10,} {unit}/s  "
          f"peak {peak:,} MiB" + (f"  (in job {figure['job_s']:.1f} s, {figure['mode']})" if done else "")
          + (", tables done at " + ", ".join(f"{t} {s:.1f} s" for t, s in steps.items()) if steps else ""),
          flush=True)  # fmt: skip
    new_logs = sorted(set(EVENT_LOGS.iterdir()) - before)
    if new_logs:
        spark = figure["spark"] = spark_metrics(new_logs[-1])
        print(
            f"  {'':<22} Spark: {spark['jobs']} jobs, {spark['stages']} stages, {spark['tasks']:,} tasks; read "
            f"{spark['input_records']:,} records, shuffled {mib(spark['shuffle_write_bytes'])}, spilled "
            f"{mib(spark['spill_bytes'])}; files read: "
            + (", ".join(f"{t} {n}" for t, n in spark["files_read"].items()) or "none counted"),
            flush=True,
        )
    return figure


def floor(name: str, *args: str) -> dict[str, Any]:
    """One floor of `tests.bench.floor`, a process timed like a job."""
    seconds, peak, err = timed_job([sys.executable, "-m", "tests.bench.floor", *args])
    found = FLOOR.search(err)
    if found is None:
        raise SystemExit(f"the floor {name} printed no figure:\n{err}")
    job_s, seconds = float(found[1]), seconds - float(found[2])
    print(f"  {name:<22} {seconds:>8.1f} s  peak {peak:,} MiB  (in job {job_s:.1f} s)", flush=True)
    return {"stage": name, "wall_s": round(seconds, 1), "job_s": job_s, "peak_rss_mib": peak}


def spark_sql(query: str, wh: list[str]) -> list[dict[str, Any]]:
    out = subprocess.run([TXN_RECON, "sql", query, "--format", "json", *wh], check=True, capture_output=True,
                         text=True).stdout  # fmt: skip
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def peer(base: Path, wh: list[str]) -> dict[str, Any]:
    """The peer's run on the base landing, timed; its findings and lifecycle states against the tables'."""
    out = ROOT / "artifacts" / "peer-findings.jsonl"
    rules = json.dumps(dataclasses.asdict(rules_from(load_config())))
    seconds, peak, _ = timed_job([sys.executable, "-m", "tests.bench.peer_duckdb", str(base), rules, str(out)])
    *rows, tail = [json.loads(line) for line in out.read_text().splitlines()]
    regression = "CASE WHEN anomaly_type = 'OFFSET_REGRESSION' THEN CAST(get_json_object(detail, '$.{}') AS BIGINT) END"
    spark_rows = spark_sql(
        f"SELECT anomaly_type, reason, broker_name, uniq_key, consumer_group, topic, queue_id, event_ts, "
        f"{regression.format('seq')} AS seq, {regression.format('redelivery_estimate')} AS redelivery_estimate "
        f"FROM txn_recon.anomalies WHERE anomaly_type IN ({', '.join(repr(t) for t in PEER_TYPES)})",
        wh,
    )
    states = {r["state"]: r["n"] for r in spark_sql("SELECT state, count(*) AS n FROM txn_recon.txn_lifecycle "
                                                     "GROUP BY state", wh)}  # fmt: skip
    ours, theirs = Counter(map(finding_key, spark_rows)), Counter(map(finding_key, rows))
    only_ours, only_theirs = list((ours - theirs).elements()), list((theirs - ours).elements())
    same = not only_ours and not only_theirs and states == tail["states"]
    print(
        f"  {'peer (DuckDB)':<22} {seconds:>8.1f} s  peak {peak:,} MiB  findings {len(rows):,}, "
        + ("every one equal, and the lifecycle states" if same else "THEY DIFFER FROM OURS"),
        flush=True,
    )
    if not same:
        print(f"  lifecycle states: ours {states}, the peer's {tail['states']}", flush=True)
        for name, only in (("ours only", only_ours), ("the peer's only", only_theirs)):
            first = [dict(zip(FINDING, k, strict=True)) for k in only[:3]]
            print(f"  {len(only)} findings {name}, the first: {first}", flush=True)
    return {"wall_s": round(seconds, 1), "peak_rss_mib": peak, "findings": len(rows), "same_findings": same,
            "ours_only": len(only_ours), "peer_only": len(only_theirs)}  # fmt: skip


def bench(n: int) -> dict[str, Any]:
    base, tail, counts = landing_for(n)
    warehouse = ROOT / "landing" / f"bench-{n}" / "warehouse"
    shutil.rmtree(warehouse, ignore_errors=True)
    wh = ["--warehouse", str(warehouse)]
    print(f"{n:,} transactions: {counts['base']:,} events, then {counts['tail']:,} more", flush=True)
    stages = [
        stage("ingest", [TXN_RECON, "ingest", "--landing", str(base), *wh], counts["base"], "events"),
        stage("reconcile full", [TXN_RECON, "reconcile", "--full", *wh], n, "transactions"),
    ]
    compared = peer(base, wh)  # the tables hold the base landing alone now, as the peer reads it
    ours = stages[0]["wall_s"] + stages[1]["wall_s"]
    compared["ratio"] = round(ours / compared["wall_s"], 1)
    print(
        f"  ingest + reconcile --full / peer: {ours:.1f} s / {compared['wall_s']:.1f} s = {compared['ratio']}x",
        flush=True,
    )
    scratch = warehouse.with_name("floor")
    shutil.rmtree(scratch, ignore_errors=True)
    copied = floor("floor: copy, group", "copy", str(base), str(scratch))
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"  floor / peer: {copied['wall_s']:.1f} s / {compared['wall_s']:.1f} s = "
          f"{copied['wall_s'] / compared['wall_s']:.1f}x ({copied['job_s'] / compared['wall_s']:.1f}x in job), "
          "before any check or rule (target 4x)", flush=True)  # fmt: skip
    stages.append(stage("ingest 1% more", [TXN_RECON, "ingest", "--landing", str(tail), *wh], counts["tail"], "events"))
    shutil.copytree(warehouse, scratch)  # as the incremental run finds it, for the floor of its writes
    stages += [
        stage("reconcile incremental", [TXN_RECON, "reconcile", *wh], n, "transactions"),
        stage("reconcile full again", [TXN_RECON, "reconcile", "--full", *wh], n, "transactions"),
    ]
    incremental, full = stages[3], stages[4]
    ratio = {"wall": round(incremental["wall_s"] / full["wall_s"], 3),
             "in_job": round(incremental["job_s"] / full["job_s"], 3)}  # fmt: skip
    print(f"  incremental / full: {ratio['wall']:.1%} of the wall time, {ratio['in_job']:.1%} in job", flush=True)
    writes = floor("floor: incremental writes", "append", str(scratch), str(incremental["transactions_computed"]),
                   str(incremental["queues"]))  # fmt: skip
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"  floor / full: {writes['wall_s'] / full['wall_s']:.1%} of the wall time, "
          f"{writes['job_s'] / full['job_s']:.1%} in job, before any rule (target 10%)", flush=True)  # fmt: skip
    shutil.rmtree(warehouse, ignore_errors=True)
    floors = {"copy": copied, "incremental_writes": writes}
    return {
        "transactions": n,
        "events": counts,
        "stages": stages,
        "incremental_over_full": ratio,
        "peer": compared,
        "floors": floors,
    }


def main() -> int:
    sizes = [int(n) for n in os.environ.get("BENCH_TRANSACTIONS", "1000000 2000000").split()]
    out = Path(os.environ.get("BENCH_OUT", ROOT / "artifacts" / "bench.json"))
    results = [bench(n) for n in sizes]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cores": os.cpu_count()}, "runs": results}, indent=2) + "\n")
    print(f"figures: {out}")
    differ = [r["transactions"] for r in results if not r["peer"]["same_findings"]]
    if differ:
        print(f"FAILED: the findings differ from the peer's at {differ} transactions (above)", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
