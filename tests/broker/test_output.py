"""`txn-recon simulate`: files, determinism, formats and errors (no Spark)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from jobs.cli import main
from schemas import LANDING
from schemas.arrow import to_arrow


def _simulate(out: Path, *args: str) -> None:
    assert main(["simulate", "--out", str(out), *args]) == 0


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_same_seed_same_bytes_different_seed_different_output(tmp_path: Path) -> None:
    args = ("--transactions", "400", "--profile", "chaos", "--rate", "2")
    _simulate(tmp_path / "a", *args, "--seed", "5")
    _simulate(tmp_path / "b", *args, "--seed", "5")
    _simulate(tmp_path / "c", *args, "--seed", "6")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert (tmp_path / "a/half/part-00000.jsonl").read_bytes() != (tmp_path / "c/half/part-00000.jsonl").read_bytes()


def test_output_does_not_depend_on_python_hash_seed(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "jobs.cli", "simulate", "--transactions", "300", "--profile", "chaos", "--rate", "2"]
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([*cmd, "--out", str(tmp_path / hash_seed)], check=True, env=env, capture_output=True)
    assert _digest(tmp_path / "1") == _digest(tmp_path / "2")


def test_pinned_seed_output(tmp_path: Path) -> None:
    _simulate(tmp_path, "--transactions", "3", "--seed", "11", "--profile", "clean")
    half = _lines(tmp_path / "half/part-00000.jsonl")
    assert [(h["broker_name"], h["queue_offset"], h["commit_log_offset"], h["store_timestamp"] - 1767225600000,
             h["uniq_key"], h["real_queue_id"], h["body_size"]) for h in half] == [
        ("broker-a", 0, 0, 0, "0A00000303EADDA1494C000000000000", 2, 369),
        ("broker-b", 0, 0, 2, "0A00000403EB8F4D3E27000000020000", 0, 1680),
        ("broker-a", 1, 669, 9, "0A00000303EADDA1494C000000090001", 0, 658),
    ]  # fmt: skip
    ops = _lines(tmp_path / "op/part-00000.jsonl")
    assert [(o["broker_name"], o["store_timestamp"] - 1767225600000, o["body"]) for o in ops] == [
        ("broker-b", 15, "0"), ("broker-a", 3000, "1,0,")]  # fmt: skip
    assert [(r["broker_name"], r["queue_offset"], r["commit_log_offset"], r["prepared_transaction_offset"])
            for r in _lines(tmp_path / "real/part-00000.jsonl")] == [
        ("broker-b", 0, 1980, 0), ("broker-a", 0, 1627, 669), ("broker-a", 0, 2585, 0)]  # fmt: skip
    meta = json.loads((tmp_path / "_truth/meta.json").read_text())
    assert (meta["as_of"], meta["records"], meta["anomalies"]) == (
        1767225660009,
        # topology: 7 passes of 2 members, and the first lands both tables (2 + 6 topics) and 3 routes of 2.
        {
            "half": 3,
            "op": 2,
            "real": 3,
            "offset": meta["records"]["offset"],
            "consumer": 390,
            "copy": 0,
            "topology": 28,
            "trace": 0,  # the clean profile's clients do not trace
        },
        {},
    )


def test_parquet_holds_the_same_records_as_jsonl(tmp_path: Path) -> None:
    args = ("--transactions", "300", "--profile", "chaos", "--rate", "2", "--seed", "3")
    _simulate(tmp_path / "j", *args)
    _simulate(tmp_path / "p", *args, "--format", "parquet")
    for stream, schema in LANDING.items():
        table = pq.read_table(tmp_path / f"p/{stream}/part-00000.parquet")
        assert table.schema.equals(to_arrow(schema), check_metadata=False)
        from_parquet = [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]
        assert from_parquet == _lines(tmp_path / f"j/{stream}/part-00000.jsonl")
    assert json.loads((tmp_path / "p/_truth/meta.json").read_text())["as_of"] == json.loads(
        (tmp_path / "j/_truth/meta.json").read_text())["as_of"]  # fmt: skip


def test_files_rotate_and_counts_add_up(tmp_path: Path) -> None:
    _simulate(tmp_path, "--transactions", "500", "--records-per-file", "100", "--rate", "50")
    meta = json.loads((tmp_path / "_truth/meta.json").read_text())
    for stream in LANDING:
        files = sorted((tmp_path / stream).glob("part-*.jsonl"))
        assert len(files) == meta["files"][stream] == -(-meta["records"][stream] // 100)
        assert sum(len(f.read_text().splitlines()) for f in files) == meta["records"][stream]
    assert not list(tmp_path.rglob(".*.tmp"))
    assert len((tmp_path / "_truth/transactions.jsonl").read_text().splitlines()) == 500


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "mayhem"], "unknown profile 'mayhem'; expected one of clean, default, chaos"),
        (["--transactions", "-5"], "--transactions must not be negative, got -5"),
        (["--rate", "0"], "--rate must be positive, got 0.0"),
        (["--transactions", "ten"], "argument --transactions: invalid int value: 'ten'"),
    ],
)
def test_bad_arguments_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                       message: str) -> None:  # fmt: skip
    try:
        code = main(["simulate", "--out", str(tmp_path / "o"), *args])
    except SystemExit as e:  # argparse's own errors
        code = int(e.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_unwritable_or_nonempty_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    (tmp_path / "file").write_text("")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    for out, message in [
        (tmp_path / "full", "is not empty"),
        (tmp_path / "file", "exists and is not a folder"),
        (locked / "sub", "cannot create --out"),
    ]:
        if out.parent == locked and os.geteuid() == 0:
            out = Path("/proc/txn-recon-cannot-write-here")  # root ignores permission bits
        assert main(["simulate", "--out", str(out), "--transactions", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert (tmp_path / "full" / "x").read_text() == "keep me"


def test_demo_never_deletes_a_folder_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "important"
    keep.mkdir()
    (keep / "data.txt").write_text("precious")
    assert main(["demo", "--out", str(keep), "--transactions", "1"]) == 2
    assert "is not a previous simulation" in capsys.readouterr().err
    assert (keep / "data.txt").read_text() == "precious"
