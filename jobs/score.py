"""`txn-recon score --truth DIR`: precision and recall of the anomalies table against the broker
model's `_truth/anomalies.jsonl`, per type, listing every false positive and false negative key, and every
UNDELIVERED finding whose count does not hold what the model's filters refused. Exit code 1 when any type's
precision or recall is below 1.0 or a count is off."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from jobs.catalog import table_exists
from jobs.config import Config
from jobs.errors import TxnReconError
from jobs.reconcile import latest_as_of
from jobs.session import build_session
from schemas.reconciled import ANOMALIES
from schemas.truth import truth_key

Key = tuple[Any, ...]
SHOWN = 20  # keys listed per type and direction


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--truth", type=Path, required=True, help="a landing folder with _truth/, or _truth/ itself")


def run(args: argparse.Namespace, config: Config) -> int:
    truth_dir = args.truth / "_truth" if (args.truth / "_truth").is_dir() else args.truth
    truth, truth_as_of = read_truth(truth_dir)
    spark = build_session(config)
    rows = read_found(spark, config)
    as_of = latest_as_of(spark, config)
    if as_of is not None and as_of != truth_as_of:
        raise TxnReconError(f"the anomalies are as of {as_of} but the truth in {truth_dir} is as of {truth_as_of}; "
                            f"reconcile this landing alone (or with --as-of {truth_as_of}) before scoring")  # fmt: skip
    scores = score(truth, rows)
    print(report(scores))
    return 0 if all(s.perfect for s in scores.values()) else 1


def read_truth(truth_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """The truth's anomaly records, and the time they are as of."""
    try:
        meta = json.loads((truth_dir / "meta.json").read_text())
        lines = (truth_dir / "anomalies.jsonl").read_text().splitlines()
    except FileNotFoundError as e:
        raise TxnReconError(f"{truth_dir} has no ground truth ({Path(e.filename).name} missing)") from None
    return [json.loads(line) for line in lines], int(meta["as_of"])


def read_found(spark: SparkSession, config: Config) -> list[dict[str, Any]]:
    table = config.table(ANOMALIES.name)
    if not table_exists(spark, table):
        raise TxnReconError(f"{table} does not exist; run `txn-recon reconcile` first")
    return [r.asDict() for r in spark.table(table).collect()]


def _parsed(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anomaly rows (the anomalies table's columns) with their detail parsed, as the truth has it."""
    return [{**r, "detail": json.loads(r["detail"])} for r in rows]


def keys(records: Iterable[dict[str, Any]]) -> dict[str, set[Key]]:
    """Truth records or parsed anomaly rows, keyed by type."""
    found: dict[str, set[Key]] = {}
    for a in records:
        found.setdefault(a["anomaly_type"], set()).add(truth_key(a))
    return found


def miscounted(truth: Iterable[dict[str, Any]], found: Iterable[dict[str, Any]]) -> list[Key]:
    """UNDELIVERED findings whose count does not hold what the model's filters really refused: at least
    `messages` (what every filter seen refuses), at most `at_most` (what any refuses), exactly `messages` when
    the finding is exact. A finding the truth lacks is a false positive, not a miscount."""
    refused = {truth_key(a): a["detail"]["messages_refused"] for a in truth if a["anomaly_type"] == "UNDELIVERED"}
    out = []
    for a in found:
        key, d = truth_key(a), a["detail"]
        if a["anomaly_type"] == "UNDELIVERED" and key in refused:
            high = d["messages"] if d["exact"] else d["at_most"]
            if not d["messages"] <= refused[key] <= high:
                out.append((*key, f"refused {refused[key]}, found {d['messages']}..{high}"))
    return sorted(out, key=repr)


@dataclass
class Score:
    expected: int
    found: int
    false_positives: list[Key] = field(default_factory=list)
    false_negatives: list[Key] = field(default_factory=list)
    miscounted: list[Key] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return 1.0 if self.found == 0 else (self.found - len(self.false_positives)) / self.found

    @property
    def recall(self) -> float:
        return 1.0 if self.expected == 0 else (self.expected - len(self.false_negatives)) / self.expected

    @property
    def perfect(self) -> bool:
        return not self.false_positives and not self.false_negatives and not self.miscounted


def score(truth: list[dict[str, Any]], rows: Iterable[dict[str, Any]]) -> dict[str, Score]:
    """Truth records against anomaly rows (detail as JSON text), per type."""
    found_rows = _parsed(rows)
    expected, found = keys(truth), keys(found_rows)
    off = miscounted(truth, found_rows)
    return {
        kind: Score(
            len(expected.get(kind, set())),
            len(found.get(kind, set())),
            sorted(found.get(kind, set()) - expected.get(kind, set()), key=repr),
            sorted(expected.get(kind, set()) - found.get(kind, set()), key=repr),
            off if kind == "UNDELIVERED" else [],
        )
        for kind in sorted(set(expected) | set(found))
    }


def report(scores: dict[str, Score]) -> str:
    lines = [f"{'anomaly type':<28} {'expected':>9} {'found':>9} {'precision':>9} {'recall':>9}"]
    for kind, s in scores.items():
        lines.append(f"{kind:<28} {s.expected:>9} {s.found:>9} {s.precision:>9.4f} {s.recall:>9.4f}")
    for kind, s in scores.items():
        lines += _listing(f"{kind} false positive", s.false_positives)
        lines += _listing(f"{kind} false negative", s.false_negatives)
        lines += _listing(f"{kind} miscounted", s.miscounted)
    verdict = "all types perfect" if all(s.perfect for s in scores.values()) else "MISMATCH"
    return "\n".join([*lines, f"score: {verdict}"])


def _listing(label: str, keys: Iterable[Key]) -> list[str]:
    keys = list(keys)
    shown = [f"  {label}: {k}" for k in keys[:SHOWN]]
    return shown + ([f"  ... and {len(keys) - SHOWN} more"] if len(keys) > SHOWN else [])


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["score", *sys.argv[1:]]))
