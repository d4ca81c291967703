"""Record request and answer frames of a real broker for the protocol unit tests (tests/test_remoting.py).

    python -m tests.rocketmq.capture_frames NAMESRV BROKER OUT_DIR [ACCESS_KEY SECRET_KEY | --group GROUP]

Run it against a broker holding a few transactional halves (Scenario.java's `young` phase). Each exchange
is kept as NAME.request.bin (the whole frame sent) and NAME.answer.bin (the answer without its 4-byte
length prefix). With keys (an ACL broker), one signed exchange and one with a wrong secret are taken.
With --group (while Scenario.java's `conflict` phase runs: CG_CONFLICT), the group's connections and
each member's running info.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sources import client, remoting
from sources.remoting import Credentials

GROUP = "txn_recon_collector"
HALF = "RMQ_SYS_TRANS_HALF_TOPIC"


def exchange(address: str, request: bytes) -> bytes:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock, sock.makefile("rb") as f:
        sock.sendall(request)
        return f.read(remoting.frame_length(f.read(4)))


def capture(out: Path, name: str, address: str, code: int, fields: Mapping[str, Any],
            creds: Credentials | None = None) -> remoting.Command:  # fmt: skip
    request = remoting.encode(code, 1, fields, b"", creds)
    answer = exchange(address, request)
    (out / f"{name}.request.bin").write_bytes(request)
    (out / f"{name}.answer.bin").write_bytes(answer)
    return remoting.decode(answer)


def pull(offset: int) -> dict[str, Any]:
    return client.pull_fields(GROUP, HALF, 0, offset)


def consumers(broker: str, out: Path, group: str) -> None:
    answer = capture(out, "consumer_connections", broker, remoting.GET_CONSUMER_CONNECTION_LIST,
                     {"consumerGroup": group})  # fmt: skip
    for member in json.loads(answer.body)["connectionSet"]:
        name = "running_info_" + member["clientId"].split("@")[1].removeprefix("member-").lower()
        capture(out, name, broker, remoting.GET_CONSUMER_RUNNING_INFO,
                {"consumerGroup": group, "clientId": member["clientId"], "jstackEnable": False})  # fmt: skip


def main(namesrv: str, broker: str, out: Path, creds: Credentials | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if creds is not None:
        capture(out, "signed_topic_config", broker, remoting.GET_ALL_TOPIC_CONFIG, {}, creds)
        wrong = Credentials(creds.access_key, creds.secret_key + "-wrong")
        capture(out, "wrong_secret_topic_config", broker, remoting.GET_ALL_TOPIC_CONFIG, {}, wrong)
        return
    capture(out, "cluster_info", namesrv, remoting.GET_BROKER_CLUSTER_INFO, {})
    capture(out, "topic_config", broker, remoting.GET_ALL_TOPIC_CONFIG, {})
    capture(out, "consumer_offsets", broker, remoting.GET_ALL_CONSUMER_OFFSET, {})
    found = capture(out, "pull_found", broker, remoting.PULL_MESSAGE, pull(0))
    capture(out, "pull_at_end", broker, remoting.PULL_MESSAGE, pull(int(found.fields["maxOffset"])))
    capture(out, "pull_moved", broker, remoting.PULL_MESSAGE, pull(10**6))
    capture(out, "pull_no_topic", broker, remoting.PULL_MESSAGE, client.pull_fields(GROUP, "NoSuchTopic", 0, 0))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[4] == "--group":
        consumers(sys.argv[2], Path(sys.argv[3]), sys.argv[5])
    else:
        keys = Credentials(sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else None
        main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), keys)
