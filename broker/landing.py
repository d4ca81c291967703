"""The model's I/O shell: streams records into landing folders (DESIGN §1) and `_truth/` (DESIGN §3).

Files appear atomically: each is written under a hidden temporary name and renamed when complete,
so a reader never sees half a file. Memory stays flat: JSON Lines go straight to the file, Parquet
rows are buffered one row group at a time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from broker.simulation import Summary
from schemas import LANDING
from schemas.jsonl import line_encoder
from schemas.truth import TRUTH_TRANSACTION

FORMATS = ("jsonl", "parquet")
ROW_GROUP = 50_000
_ENCODERS = {name: line_encoder(schema) for name, schema in LANDING.items()}
_encode_truth = line_encoder(TRUTH_TRANSACTION)
_encode_json = json.JSONEncoder(separators=(",", ":")).encode


class LandingWriter:
    def __init__(self, out: Path, fmt: str = "jsonl", records_per_file: int = 250_000) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        self.out = out
        self.records_per_file = records_per_file
        self.parts = {s: (_JsonlPart if fmt == "jsonl" else _ParquetPart)(out / s, s) for s in LANDING}
        self.files: dict[str, int] = dict.fromkeys(LANDING, 0)
        self.fmt = fmt
        (out / "_truth").mkdir(parents=True, exist_ok=True)
        self.truth_txn = open(out / "_truth" / "transactions.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self.truth_anomalies = open(out / "_truth" / "anomalies.jsonl", "w", encoding="utf-8")  # noqa: SIM115

    def record(self, stream: str, rec: tuple[Any, ...]) -> None:
        part = self.parts[stream]
        part.add(rec)
        if part.count >= self.records_per_file:
            part.finish()
            self.files[stream] += 1

    def truth_transaction(self, rec: tuple[Any, ...]) -> None:
        self.truth_txn.write(_encode_truth(rec) + "\n")

    def truth_anomaly(self, rec: dict[str, Any]) -> None:
        self.truth_anomalies.write(_encode_json(rec) + "\n")

    def close(self, summary: Summary, extra: dict[str, Any]) -> None:
        for stream, part in self.parts.items():
            if part.count:
                part.finish()
                self.files[stream] += 1
        self.truth_txn.close()
        self.truth_anomalies.close()
        meta = {
            "as_of": summary.as_of, "seed": summary.seed, "profile": summary.profile,
            "transactions": summary.transactions, "format": self.fmt, "records": summary.records,
            "files": self.files, "states": dict(sorted(summary.states.items())),
            "anomalies": dict(sorted(summary.anomalies.items())), "faults": dict(sorted(summary.faults.items())),
            **extra,
        }  # fmt: skip
        tmp = self.out / "_truth" / ".meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.out / "_truth" / "meta.json")  # written last: the run is complete


class _JsonlPart:
    """part-NNNNN.jsonl files of one stream, written line by line under a temporary name."""

    def __init__(self, folder: Path, stream: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.encode, self.n, self.count = folder, _ENCODERS[stream], 0, 0
        self.handle: IO[str] | None = None

    def add(self, rec: tuple[Any, ...]) -> None:
        if self.handle is None:
            self.handle = open(self._tmp(), "w", encoding="utf-8")  # noqa: SIM115
        self.handle.write(self.encode(rec) + "\n")
        self.count += 1

    def finish(self) -> None:
        assert self.handle is not None
        self.handle.close()
        os.replace(self._tmp(), self.folder / f"part-{self.n:05d}.jsonl")
        self.handle, self.n, self.count = None, self.n + 1, 0

    def _tmp(self) -> Path:
        return self.folder / f".part-{self.n:05d}.jsonl.tmp"


class _ParquetPart:
    """part-NNNNN.parquet files of one stream, one row group per ROW_GROUP records."""

    def __init__(self, folder: Path, stream: str) -> None:
        import pyarrow.parquet as pq

        from schemas.arrow import to_arrow

        folder.mkdir(parents=True, exist_ok=True)
        self.pq, self.schema = pq, to_arrow(LANDING[stream])
        self.folder, self.n, self.count = folder, 0, 0
        self.rows: list[tuple[Any, ...]] = []
        self.writer: Any = None

    def add(self, rec: tuple[Any, ...]) -> None:
        self.rows.append(rec)
        self.count += 1
        if len(self.rows) >= ROW_GROUP:
            self._write_group()

    def finish(self) -> None:
        self._write_group()
        self.writer.close()
        os.replace(self._tmp(), self.folder / f"part-{self.n:05d}.parquet")
        self.writer, self.n, self.count = None, self.n + 1, 0

    def _write_group(self) -> None:
        import pyarrow as pa

        if not self.rows:
            return
        if self.writer is None:
            self.writer = self.pq.ParquetWriter(self._tmp(), self.schema, compression="snappy")
        columns = zip(*self.rows, strict=True)
        arrays = [pa.array(col, type=f.type) for col, f in zip(columns, self.schema, strict=True)]
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))
        self.rows = []

    def _tmp(self) -> Path:
        return self.folder / f".part-{self.n:05d}.parquet.tmp"
