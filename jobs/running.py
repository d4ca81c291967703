"""The `txn-recon serve` running on a warehouse, as other commands find it: it writes where its SQL server
listens to a file in the warehouse while it runs."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from jobs.config import Config, host_port


def address_file(config: Config) -> Path:
    """Where a running serve says how to reach its SQL server (removed when it stops)."""
    return Path(config.warehouse) / "_serve" / "serve.json"


def running_server(config: Config) -> str | None:
    """The JDBC URL of the serve running on this warehouse, if one is up and answers."""
    if not config.is_local_warehouse:
        return None
    try:
        doc = json.loads(address_file(config).read_text())
        os.kill(int(doc["pid"]), 0)
        with socket.create_connection(host_port(doc["sql"]), timeout=2):
            return str(doc["jdbc"])
    except (OSError, ValueError, KeyError, TypeError):  # none written, a dead process, a closed port
        return None
