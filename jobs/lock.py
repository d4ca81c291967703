"""One writer per warehouse: Delta's commit safety on local files holds only inside one JVM."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jobs.config import Config
from jobs.errors import TxnReconError


class LockedError(TxnReconError):
    """Another txn-recon job is writing to the same warehouse."""


@contextmanager
def warehouse_lock(config: Config, job: str) -> Iterator[None]:
    """Hold an exclusive lock on the warehouse for the job's duration (released by the OS if it dies)."""
    if not config.is_local_warehouse:  # on a cluster the scheduler serialises jobs
        yield
        return
    with folder_lock(Path(config.warehouse), f"the warehouse {config.warehouse}", job):
        yield


@contextmanager
def folder_lock(folder: Path, what: str, job: str, name: str = ".txn-recon.lock") -> Iterator[None]:
    """An exclusive lock file in `folder`; LockedError names the holder when another process has it."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise LockedError(f"{what} is in use by {holder}; try again when it ends") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"txn-recon {job} (pid {os.getpid()})")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)
