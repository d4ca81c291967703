"""Run ids: one format for every job's accounting rows. No Spark, so jobs that need none can use it."""

from __future__ import annotations

import datetime as dt
import secrets


def new_run_id(now: dt.datetime, job: str = "ingest") -> str:
    return f"{job}-{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
