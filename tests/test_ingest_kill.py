"""An ingest killed hard mid-run, then run again, leaves the same tables as one clean run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.config import Config
from schemas import LANDING
from tests.conftest import REPO
from tests.test_ingest import fresh_db, ingest, make_landing

pytestmark = pytest.mark.spark
TXN_RECON = str(Path(sys.executable).parent / "txn-recon")


def _table_rows(spark: SparkSession, location: str, columns: list[str]) -> set[tuple[object, ...]]:
    return {tuple(r) for r in spark.read.format("delta").load(location).select(*columns).collect()}


def test_sigkill_mid_run_then_rerun_equals_one_clean_run(spark: SparkSession, config: Config, tmp_path: Path) -> None:
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

    clean = fresh_db(spark, config, "t_ingest_clean")
    ingest(spark, clean, landing, "clean")
    clean_root = f"{config.warehouse}/t_ingest_clean.db"
    killed_root = f"{warehouse}/txn_recon.db"
    for stream in LANDING:
        columns = [*LANDING[stream].names, "_record_hash", "_source_file"]
        killed = _table_rows(spark, f"{killed_root}/{stream}_events", columns)
        assert killed == _table_rows(spark, f"{clean_root}/{stream}_events", columns)
        assert len(killed) == spark.read.format("delta").load(f"{killed_root}/{stream}_events").count()  # no dupes
    for table, columns in (("quarantine", ["stream", "source_file", "raw", "reason"]),
                           ("ingest_files", ["stream", "path", "size", "modified_ms", "status"])):  # fmt: skip
        assert _table_rows(spark, f"{killed_root}/{table}", columns) == _table_rows(
            spark, f"{clean_root}/{table}", columns
        )
