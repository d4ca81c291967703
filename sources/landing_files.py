"""Landing files as the jobs that read brokers write them (DESIGN §1): JSON Lines, each written under a
hidden name, flushed to disk, then renamed, so ingest (which skips hidden files) never reads half a file
and a writer killed at any point leaves nothing it would have to undo."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from schemas import LANDING
from schemas.jsonl import line_encoder

log = logging.getLogger(__name__)
RECORDS_PER_FILE = 500_000
_LINES_PER_WRITE = 1000
ENCODE = {name: line_encoder(schema) for name, schema in LANDING.items()}
T = TypeVar("T")


class LandingError(Exception):
    """A landing folder or state file that cannot be used; the message is the one line the user sees."""


class Stream:
    """One landing stream's files of this run, rotated every RECORDS_PER_FILE records; each written under a
    hidden name, flushed to disk and then renamed, so ingest never reads half a file. Lines are written in
    batches: one write call per line costs a tenth of the export."""

    def __init__(self, folder: Path, prefix: str, encode: Callable[[Sequence[Any]], str]) -> None:
        self.folder, self.prefix, self.encode = folder, prefix, encode
        self.part, self.count, self.total = 0, 0, 0
        self.lines: list[str] = []
        self.handle: IO[str] | None = None

    def add(self, rec: tuple[Any, ...]) -> None:
        lines = self.lines
        lines.append(self.encode(rec))
        if len(lines) >= _LINES_PER_WRITE:
            self._write()

    def add_all(self, record: tuple[Any, ...] | list[tuple[Any, ...]]) -> None:
        """A record, or each of a list of them (a trace message's)."""
        for rec in record if isinstance(record, list) else (record,):
            self.add(rec)

    def _write(self) -> None:
        if self.handle is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.handle = open(self._path(hidden=True), "w", encoding="utf-8")  # noqa: SIM115
        self.handle.write("\n".join(self.lines) + "\n")
        self.count += len(self.lines)
        self.lines = []
        if self.count >= RECORDS_PER_FILE:
            self.close()
            log.info("  %d %s records", self.total, self.folder.name)

    def close(self) -> None:
        if self.lines:
            self._write()
        if self.handle is None:
            return
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        os.replace(self._path(hidden=True), self._path(hidden=False))
        self.handle, self.part, self.total, self.count = None, self.part + 1, self.total + self.count, 0

    def _path(self, hidden: bool) -> Path:
        name = f"{self.prefix}-{self.part:05d}.jsonl"
        return self.folder / (f".{name}.tmp" if hidden else name)


def durable_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def make_landing(landing: Path) -> None:
    try:
        landing.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LandingError(f"cannot create --landing {landing}: {e.strerror}") from None


def read_state(path: Path, build: Callable[[Any], T], what: str, remedy: str) -> T | None:
    """A job's state file through `build`, None if there is none yet; one clear error if it is not one."""
    if not path.exists():
        return None
    try:
        return build(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as e:
        raise LandingError(f"{path} is not {what} ({type(e).__name__}: {e}); move it away {remedy}") from None


def write_state(path: Path, doc: Any) -> None:
    durable_write(path, json.dumps(doc, indent=1) + "\n")
