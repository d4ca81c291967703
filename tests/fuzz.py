"""What every decoder of outside bytes must hold, whatever the bytes (issue 45), and the inputs it is fuzzed
from. Each check takes one input and fails on any exception but the decoder's own error type, or on a result
that claims bytes the input does not have. `tests/test_fuzz.py` runs the checks under Hypothesis on a budget
for the suite and replays every input saved under `tests/data/fuzz/<decoder>/`; `make fuzz` runs them for
minutes and saves each input that fails there.

The seeds are bytes real RocketMQ 5.3.3 wrote: two commit-log files, the remoting frames of a broker and a
name server, and a `consumerOffset.json`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from schemas.landing import TRACE
from sources import client, offsets, remoting, topology
from sources.commitlog import Corrupt, DataEnd, FileEnd, Message, scan
from sources.fastjson import FastjsonError, loads
from sources.remoting import Command
from sources.trace import TRACE_TOPIC, trace_records
from tests.trace_encoding import TRACE_BODIES

DATA = Path(__file__).parent / "data"
REGRESSIONS = DATA / "fuzz"
STORE, FRAMES = DATA / "rocketmq-5.3.3", DATA / "remoting-5.3.3"
OP = frozenset({"RMQ_SYS_TRANS_OP_HALF_TOPIC"})
BASE = 196_608  # a file's first physical offset: positions must carry it


def _frames() -> list[bytes]:
    """The captured frames without their length prefix (the requests were saved with it)."""
    return [p.read_bytes()[4 if p.name.endswith(".request.bin") else 0 :] for p in sorted(FRAMES.glob("*.bin"))]


def _binary(command: Command) -> bytes:
    """A command in RocketMQSerializable's layout (a broker started with -Drocketmq.serialize.type=ROCKETMQ)."""
    ext = b"".join(struct.pack(">h", len(k.encode())) + k.encode() + struct.pack(">i", len(v.encode())) + v.encode()
                   for k, v in command.fields.items())  # fmt: skip
    remark = (command.remark or "").encode()
    header = (struct.pack(">hbhii", command.code, 0, 479, command.opaque, command.flag)
              + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + ext)  # fmt: skip
    return struct.pack(">i", (1 << 24) | len(header)) + header + command.body


def _both_headers() -> list[bytes]:
    """The captured frames, and each again with a binary header."""
    frames = _frames()
    return [*frames, *(_binary(remoting.decode(f)) for f in frames)]


def _bodies() -> list[bytes]:
    """The JSON answers' bodies (cluster and topic tables, connections, running info, offsets)."""
    bodies = [remoting.decode(frame).body for frame in _frames()]
    return [*(b for b in bodies if b[:1] in (b"{", b"[")), (STORE / "consumerOffset.json").read_bytes()]


def _second_file() -> bytes:
    return (STORE / "commitlog-00000000000000196608").read_bytes()


def _first_records(n: int) -> bytes:
    """The first `n` records of the real first commit-log file: a seed small enough to mutate quickly."""
    buf = (STORE / "commitlog-00000000000000000000").read_bytes()
    ends = [e.position + e.size for e in scan(buf, 0) if isinstance(e, Message)]
    return buf[: ends[min(n, len(ends)) - 1]]


# ---- the checks ------------------------------------------------------------------------------------------


def check_commitlog(data: bytes) -> None:
    """The scan yields entries in order, each message within the bytes, a corrupt record resumed further on
    (or nowhere), and ends with at most one end."""
    entries = list(scan(data, BASE, 0, OP))
    last = BASE - 1
    for i, e in enumerate(entries):
        assert e.position > last or (isinstance(e, (DataEnd, FileEnd)) and e.position >= last), (i, e, last)
        if isinstance(e, Message):
            assert e.position >= BASE and e.position - BASE + e.size <= len(data), e
            assert e.body is None or len(e.body) == e.body_size, e
            last = e.position + e.size - 1
        elif isinstance(e, Corrupt):
            assert e.resumed_at is None or e.position < e.resumed_at <= BASE + len(data), e
            last = e.position if e.resumed_at is None else e.resumed_at - 1
        else:
            assert i == len(entries) - 1 and e.position <= BASE + len(data), (i, e)


def check_remoting(data: bytes) -> None:
    """A frame (without its length prefix) is a command or a ProtocolError; its fields are text, and a pull
    answer's offsets are numbers or a RemotingError."""
    if len(data) >= 4:
        with contextlib.suppress(remoting.ProtocolError):
            remoting.frame_length(data[:4])
    try:
        command = remoting.decode(data)
    except remoting.ProtocolError:
        return
    assert isinstance(command.code, int) and isinstance(command.body, bytes)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in command.fields.items())
    assert command.remark is None or isinstance(command.remark, str)
    client.first_line(command.remark)
    with contextlib.suppress(client.RemotingError):
        client.pull_result(command)


def check_fastjson(data: bytes) -> None:
    with contextlib.suppress(FastjsonError):
        loads(data.decode("utf-8", "replace"))


def check_offsets(data: bytes) -> None:
    """`consumerOffset.json`, as a file or a GET_ALL_CONSUMER_OFFSET answer."""
    try:
        table = offsets.parse(data.decode("utf-8", "replace"))
    except offsets.OffsetFileError:
        return
    current, _ = offsets.business_offsets(table)
    assert all(isinstance(v, int) for v in current.values())


class _Answering:
    """A connection that answers every request with `body`, and a message view with `view`."""

    address = "127.0.0.1:10911"

    def __init__(self, body: bytes, view: bytes = b"") -> None:
        self.body, self.view, self.sent = body, view, 0

    def call(self, code: int, fields: Any = None, body: bytes = b"") -> Command:
        return Command(remoting.SUCCESS, 0, {}, self.body, None, 1)

    def send(self, code: int, fields: Any = None, body: bytes = b"") -> int:
        self.sent += 1
        return self.sent

    def receive(self, opaque: int) -> Command:
        return Command(remoting.SUCCESS, opaque, {}, self.view, None, 1)


def check_answers(data: bytes) -> None:
    """Every JSON answer the collector reads (cluster and topic tables, routes, consumer connections and running
    info, a consume-queue index) is what it needs or a RemotingError; a topics.json is a table or its error."""
    readers: list[Callable[[Any], Any]] = [
        client.master_brokers,
        client.cluster_members,
        client.topic_queues,
        client.topic_table,
        lambda c: client.topic_route(c, "t"),
        lambda c: client.consumer_connections(c, "g"),
        lambda c: client.consumer_running_info(c, "g", "c"),
        lambda c: client.read_by_index(c, "t", 0, 0),
    ]
    for read in readers:
        with contextlib.suppress(client.RemotingError):
            read(_Answering(data, view=data[:64]))
    # A broker's config/topics.json, as export-store reads it: a topic table or its own error.
    with contextlib.suppress(topology.TopicsFileError):
        topology.parse_topics_file(data.decode("utf-8", "replace"))


def check_trace(data: bytes) -> None:
    """A trace message's body gives at least one record, each of the landing schema's width and either decoded
    (it has a type) or malformed (it says why), never both."""
    records = trace_records("b", Message(0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, len(data), TRACE_TOPIC, "", data, "h:1"))
    assert records
    for rec in records:
        assert len(rec) == len(TRACE.names), rec
        fields = dict(zip(TRACE.names, rec, strict=True))
        assert (fields["malformed"] is None) == (fields["trace_type"] is not None)


# The decoders, their checks and seeds; the seeds are read when asked for.
DECODERS: dict[str, tuple[Callable[[bytes], None], Callable[[], list[bytes]]]] = {
    "commitlog": (check_commitlog, lambda: [_first_records(12), _second_file()[:6_000]]),
    "remoting": (check_remoting, _both_headers),
    "fastjson": (check_fastjson, _bodies),
    "offsets": (check_offsets, lambda: [(STORE / "consumerOffset.json").read_bytes()]),
    "answers": (check_answers, _bodies),
    "trace": (check_trace, lambda: list(TRACE_BODIES)),
}


# ---- inputs ----------------------------------------------------------------------------------------------


KINDS = ("flip", "cut", "insert", "field", "tail")
BOUNDARY = (0, -1, 1, 2**31 - 1, -(2**31))  # lengths and counts at their edges


def apply(data: bytes, edits: list[tuple[str, float, int, bytes]]) -> bytes:
    """`data` with `edits`, as an outsider's fuzzer makes them: (kind, where as a fraction of the length, an
    integer, some bytes). A bit flipped, a cut, bytes inserted, a 4-byte field (a length, a count)
    overwritten with the integer, the tail dropped."""
    out = bytearray(data)
    for kind, where, n, extra in edits:
        at = min(int(where * len(out)), max(len(out) - 1, 0))
        if kind == "flip" and out:
            out[at] ^= 1 << (n % 8)
        elif kind == "cut":
            del out[at : at + 1 + n % 64]
        elif kind == "insert":
            out[at:at] = extra or b"\0"
        elif kind == "field":
            out[at : at + 4] = (n % 2**32 - 2**31).to_bytes(4, "big", signed=True)
        elif kind == "tail":
            del out[at:]
    return bytes(out)


def random_edits(rng: random.Random, most: int = 6) -> list[tuple[str, float, int, bytes]]:
    """Edits drawn from `rng`, for inputs that cannot go through Hypothesis one at a time (a Spark batch)."""
    return [(rng.choice(KINDS), rng.random(), rng.choice([rng.getrandbits(32), *(b + 2**31 for b in BOUNDARY)]),
             rng.randbytes(rng.randint(1, 32))) for _ in range(rng.randint(1, most))]  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed with a few edits (`apply`), or bytes of no seed at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=512))
    edit = st.tuples(st.sampled_from(KINDS), st.floats(0, 1, exclude_max=True),
                     st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([b + 2**31 for b in BOUNDARY])),
                     st.binary(min_size=1, max_size=32))  # fmt: skip
    return apply(draw(st.sampled_from(seeds)), draw(st.lists(edit, min_size=1, max_size=6)))


def regressions(decoder: str) -> list[Path]:
    return sorted((REGRESSIONS / decoder).glob("*.bin"))


def run(decoder: str, data: bytes) -> None:
    """Check one input; under `make fuzz` (FUZZ_SAVE set) an input that fails is saved as a regression file
    first, at most MAX_SAVED per decoder (Hypothesis shrinks a failure through many failing inputs)."""
    check, _ = DECODERS[decoder]
    try:
        check(data)
    except Exception:
        if os.environ.get("FUZZ_SAVE"):
            folder = REGRESSIONS / decoder
            folder.mkdir(parents=True, exist_ok=True)
            if len(list(folder.glob("*.bin"))) < MAX_SAVED:
                (folder / f"{hashlib.sha256(data).hexdigest()[:16]}.bin").write_bytes(data)
        raise


MAX_SAVED = 20
