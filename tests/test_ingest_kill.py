"""An ingest killed hard mid-run, then run again, leaves the tables one clean run leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


def test_sigkill_mid_run_then_rerun_equals_one_clean_run(spark: SparkSession, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    meta = make_landing(landing, n=150, seed=9, per_file=120, drain_ms=30_000)
    assert meta["files"]["half"] >= 2
    small = tmp_path / "small-batches.yaml"
    small.write_text("ingest:\n  batch_bytes: 50000\n")  # about one file per batch
    warehouse = tmp_path / "killed"
    cmd = [TXN_RECON, "ingest", "--landing", str(landing), "--warehouse", str(warehouse), "--conf", str(small)]

    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # kill as soon as a few batches are in, while the next one is being written
        seen.append(line)
        if "half: batch 1/" in line:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)

    rerun = subprocess.run(cmd[:-2], cwd=REPO, capture_output=True, text=True, timeout=600)  # default batches
    assert rerun.returncode == 0, rerun.stderr

    # What one clean run leaves: every landed record once, with the file it came from; nothing in
    # quarantine; every file recorded once as ingested.
    root = f"{warehouse}/txn_recon.db"
    for stream in LANDING:
        stored = spark.read.format("delta").load(f"{root}/{stream}_events").collect()
        got = [(_record({k: r[k] for k in LANDING[stream].names}), r["_source_file"]) for r in stored]
        expected = [(_record(json.loads(line)), str(f.resolve())) for f in (landing / stream).glob("*.jsonl")
                    for line in f.read_text().splitlines()]  # fmt: skip
        assert sorted(got) == sorted(expected), stream
    assert spark.read.format("delta").load(f"{root}/quarantine").count() == 0
    recorded = spark.read.format("delta").load(f"{root}/ingest_files").select("stream", "path", "status").collect()
    files = [(s, str(f.resolve()), "ingested") for s in LANDING for f in (landing / s).glob("*.jsonl")]
    assert sorted(tuple(r) for r in recorded) == sorted(files)
