"""An ingest killed hard mid-run, then run again, leaves the tables one clean run leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from schemas import LANDING
from tests.conftest import REPO
from tests.test_ingest import make_landing

pytestmark = pytest.mark.spark
TXN_RECON = str(Path(sys.executable).parent / "txn-recon")


def _record(fields: dict[str, object]) -> str:
    """A record's non-null fields as canonical JSON."""
    return json.dumps({k: v for k, v in fields.items() if v is not None}, sort_keys=True)


def _killed_ingest(tmp_path: Path, name: str, kill: Callable[[subprocess.Popen[str]], None]) -> tuple[Path, Path, str]:
    """Start `txn-recon ingest` in small batches on a fresh landing and warehouse and `kill` it as soon as
    the first half batch is in, while the next one is being written; its stderr so far."""
    landing = tmp_path / "landing"
    meta = make_landing(landing, n=150, seed=9, per_file=120, drain_ms=30_000)
    assert meta["files"]["half"] >= 2
    small = tmp_path / "small-batches.yaml"
    small.write_text("ingest:\n  batch_bytes: 50000\n")  # about one file per batch
    warehouse = tmp_path / name
    cmd = [TXN_RECON, "ingest", "--landing", str(landing), "--warehouse", str(warehouse), "--conf", str(small)]
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "half: batch 1/" in line:
            kill(proc)
            break
    seen += proc.stderr.readlines()
    proc.wait(timeout=60)
    return landing, warehouse, f"exit {proc.returncode}\n" + "".join(seen)


def _rerun_equals_one_clean_run(spark: SparkSession, landing: Path, warehouse: Path) -> None:
    """Ingest again with the default batches: the tables are what one clean run leaves. Every landed
    record once, with the file it came from; nothing in quarantine; every file recorded once as ingested."""
    rerun = subprocess.run([TXN_RECON, "ingest", "--landing", str(landing), "--warehouse", str(warehouse)],
                           cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    root = f"{warehouse}/txn_recon.db"
    for stream in LANDING:
        stored = spark.read.format("delta").load(f"{root}/{stream}_events").collect()
        got = [(_record({k: r[k] for k in LANDING[stream].names}), r["_source_file"]) for r in stored]
        defaults = LANDING[stream].defaults  # what an absent field is stored as
        expected = [(_record({**defaults, **json.loads(line)}), str(f.resolve()))
                    for f in (landing / stream).glob("*.jsonl") for line in f.read_text().splitlines()]  # fmt: skip
        assert sorted(got) == sorted(expected), stream
    assert spark.read.format("delta").load(f"{root}/quarantine").count() == 0
    recorded = spark.read.format("delta").load(f"{root}/ingest_files").select("stream", "path", "status").collect()
    files = [(s, str(f.resolve()), "ingested") for s in LANDING for f in (landing / s).glob("*.jsonl")]
    assert sorted(tuple(r) for r in recorded) == sorted(files)


def test_sigkill_mid_run_then_rerun_equals_one_clean_run(spark: SparkSession, tmp_path: Path) -> None:
    landing, warehouse, stderr = _killed_ingest(tmp_path, "killed", lambda proc: os.kill(proc.pid, signal.SIGKILL))
    assert stderr.startswith(f"exit {-signal.SIGKILL}"), stderr
    _rerun_equals_one_clean_run(spark, landing, warehouse)


def _kill_the_jvm(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the JVM that Spark runs in, a child of the job's Python process, and leave Python alone."""
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children, "no JVM under the ingest process"
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)


def test_a_dead_jvm_ends_the_run_in_one_line_and_quarantines_nothing(spark: SparkSession, tmp_path: Path) -> None:
    landing, warehouse, stderr = _killed_ingest(tmp_path, "dead-jvm", _kill_the_jvm)
    assert stderr.startswith("exit 1\n"), stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("txn-recon ingest: failed: Spark failed while ingesting half files ("), stderr
    assert last.endswith("nothing was quarantined for it, and the next run reads those files again"), stderr
    assert "Traceback" not in stderr and "quarantined /" not in stderr, stderr
    assert spark.read.format("delta").load(f"{warehouse}/txn_recon.db/quarantine").count() == 0
    _rerun_equals_one_clean_run(spark, landing, warehouse)
