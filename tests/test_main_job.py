"""The README's main job, `make run`, at its default size: `txn-recon demo` simulates 100,000 transactions
of the default profile (seed 1), then ingests, reconciles, checks quality, draws the dashboard and scores.

The same command as the Makefile's, in its own process and with the same Spark settings (not the suite's
small-data defaults: in a full suite run it took 816 s with them, 559 s without), with the landing and the
warehouse in a temporary folder instead of the checkout. A smaller run would not have caught the op body of
79,986 characters that took the JVM down at this size.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.conftest import REPO

pytestmark = pytest.mark.spark
TXN_RECON = str(Path(sys.executable).parent / "txn-recon")


def test_make_run_scores_every_type_perfectly(spark: SparkSession, tmp_path: Path) -> None:
    landing, warehouse = tmp_path / "landing" / "demo", tmp_path / "warehouse"
    cmd = [TXN_RECON, "demo", "--out", str(landing), "--transactions", "100000", "--profile", "default",
           "--warehouse", str(warehouse)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    out = done.stdout

    rows = [line.split() for line in out.splitlines() if re.match(r"(half|op|real|offset|consumer) +\d", line)]
    assert {r[0] for r in rows} == {"half", "op", "real", "offset", "consumer"}
    assert all(int(r[2]) == 0 and int(r[6]) == 0 and int(r[4]) > 0 for r in rows), rows  # none failed or quarantined
    assert re.search(r"quality \S+: (\d+) expectations, \1 passed, 0 failed", out), out
    scores = re.findall(r"^([A-Z_]+) +(\d+) +(\d+) +([\d.]+) +([\d.]+)$", out, re.M)
    expected_types = {"STUCK_HALF", "DISCARDED_AFTER_MAX_CHECKS", "DUPLICATE_COMMIT", "ORPHANED_COMMIT",
                      "RECHECKED_AFTER_RESOLUTION", "OFFSET_REGRESSION"}  # fmt: skip
    assert {s[0] for s in scores} >= expected_types
    assert all(s[3] == s[4] == "1.0000" and int(s[1]) == int(s[2]) > 0 for s in scores), scores
    assert "score: all types perfect" in out
    dashboard, docs = out.strip().splitlines()[-2:]
    assert dashboard.startswith("dashboard: ") and Path(dashboard.split(": ", 1)[1]).is_file()
    assert docs.startswith("Data Docs: ") and Path(docs.split(": ", 1)[1]).is_file()
    quarantine = spark.read.format("delta").load(str(warehouse / "txn_recon.db" / "quarantine"))
    assert quarantine.count() == 0
