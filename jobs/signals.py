"""Ending a long-running job cleanly: SIGTERM (what a service manager sends) and SIGINT ask it to stop at
the next safe point instead of killing it where it stands."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger(__name__)


class Stop(threading.Event):
    """Set once a stop was asked for; `name` says by which signal."""

    name = ""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Stop]:
    """A Stop that SIGTERM and SIGINT set while the block runs; the previous handlers come back after.
    Only the main thread can take signals: elsewhere the Stop is the caller's to set."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        stop.name = signal.Signals(signum).name
        log.info("%s: stopping at the next safe point", stop.name)
        stop.set()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
