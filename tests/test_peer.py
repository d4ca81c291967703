"""The benchmark's peer (tests/bench/peer_duckdb.py) finds what the broker model says it must: `make bench`
holds txn-recon's findings against the peer's, so the peer has to be right on its own. No Spark."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobs.config import load_config
from jobs.reconcile import rules_from
from schemas.truth import truth_key
from tests.bench.bench_pipeline import PEER_TYPES
from tests.bench.peer_duckdb import run

RULES = dataclasses.asdict(rules_from(load_config()))


def _key(a: dict[str, Any]) -> tuple[Any, ...]:
    """A finding's score key, but a discard's cause: the peer runs no trace rule."""
    key = truth_key(a)
    return key[:3] if a["anomaly_type"] == "DISCARDED_AFTER_MAX_CHECKS" else key


@pytest.mark.parametrize(("profile", "seed", "transactions"), [("chaos", 1, 3000), ("default", 1, 30000)])
def test_the_peer_finds_what_the_model_says(tmp_path: Path, profile: str, seed: int, transactions: int) -> None:
    landing = tmp_path / "landing"
    subprocess.run([str(Path(sys.executable).parent / "txn-recon"), "simulate", "--out", str(landing),
                    "--profile", profile, "--seed", str(seed), "--transactions", str(transactions),
                    "--format", "parquet"], check=True, capture_output=True)  # fmt: skip
    out = tmp_path / "peer.jsonl"
    run(landing, RULES, out)
    *found, tail = [json.loads(line) for line in out.read_text().splitlines()]
    truth = [json.loads(line) for line in (landing / "_truth" / "anomalies.jsonl").read_text().splitlines()]
    wanted = [a for a in truth if a["anomaly_type"] in PEER_TYPES]
    assert Counter(_key(a) for a in found) == Counter(_key(a) for a in wanted)
    estimates = {truth_key(a): a["detail"]["redelivery_estimate"] for a in wanted
                 if a["anomaly_type"] == "OFFSET_REGRESSION"}  # fmt: skip
    assert estimates and {truth_key(a): a["redelivery_estimate"] for a in found
                          if a["anomaly_type"] == "OFFSET_REGRESSION"} == estimates  # fmt: skip
    meta = json.loads((landing / "_truth" / "meta.json").read_text())
    assert (tail["as_of"], tail["states"]) == (meta["as_of"], meta["states"])
