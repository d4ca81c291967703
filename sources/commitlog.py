"""RocketMQ's commit-log record format (reference §4.1-4.5), decoded: bytes in, messages out. No I/O.

`scan` walks one commit-log file's bytes from a position and yields what it finds there: messages
(headers, topic and properties; of the body only its length, its CRC checked, and its bytes kept for
the op topic whose body is the data), the blank record that ends a file, the end of what the broker has
written, and corrupt records with the position the walk resumed at.
"""

from __future__ import annotations

import ipaddress
import mmap
import struct
import zlib
from collections.abc import Generator
from dataclasses import dataclass
from typing import NamedTuple

MAGIC_V1 = -626843481  # 0xDAA320A7: topic length in one byte
MAGIC_V2 = -626843477  # 0xDAA320AB: topic length in two bytes (topics longer than 127)
BLANK_MAGIC = -875286124  # 0xCBD43194: the rest of the file is unused, go on in the next one
BORNHOST_V6 = 0x10
STOREHOST_V6 = 0x20
TRANSACTION_BITS = 0xC
NAME_VALUE = "\x01"
PROPERTY_SEP = "\x02"

# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTIMESTAMP: 48 bytes
_HEAD = struct.Struct(">iiiiiqqiq")
_SIZE_MAGIC = struct.Struct(">ii")
_TOPICS: dict[bytes, str] = {}  # topic names are few: each decoded once
_LONG = struct.Struct(">q")
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_TAIL = struct.Struct(">iqi")  # RECONSUMETIMES PREPAREDTRANSACTIONOFFSET BODYLENGTH
# Every fixed field with IPv4 hosts, BORNHOST and STOREHOST skipped, up to BODYLENGTH: 88 bytes.
_V4_FIXED = struct.Struct(">iiiiiqqiq8xq8xiqi")
ZERO_SPAN = 1 << 20  # zeros this long with no record after them are the end of what the broker has written
MIN_SIZE = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2  # IPv4 hosts, empty body/topic/props


class Message(NamedTuple):
    """One stored message. `position` is its physical offset as read, `physical_offset` as written. (A named
    tuple: a frozen dataclass costs a third of the decoding time to build.)"""

    position: int
    size: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    store_timestamp: int
    reconsume_times: int
    prepared_transaction_offset: int
    body_size: int
    topic: str
    properties: str  # the raw properties string; `properties()` parses it
    body: bytes | None  # kept only for the topics asked for (op bodies are data)
    born_host: str | None = None  # "ip:port" of the sender, for the topics whose body is kept


@dataclass(frozen=True, slots=True)
class FileEnd:
    """The blank record: the writer went on in the next file."""

    position: int


@dataclass(frozen=True, slots=True)
class DataEnd:
    """Nothing more is written here yet: zeros, or (`incomplete`) a last record whose bytes are still
    arriving, with only zeros behind it. A later run resumes here."""

    position: int
    incomplete: bool = False


@dataclass(frozen=True, slots=True)
class Corrupt:
    """A record that is not one: its position, why, and where the walk resumed (None: nowhere in this file)."""

    position: int
    reason: str
    resumed_at: int | None


Entry = Message | FileEnd | DataEnd | Corrupt
Buffer = bytes | mmap.mmap  # both slice to bytes and have find()


def properties(text: str) -> dict[str, str]:
    """`name 0x01 value 0x02` entries (reference §4.2); entries without a separator are ignored."""
    tokens = text.replace(NAME_VALUE, PROPERTY_SEP).split(PROPERTY_SEP)
    pairs_n = len(tokens) // 2
    if not tokens[-1] and text.count(NAME_VALUE) == pairs_n == text.count(PROPERTY_SEP):  # name, value, ...
        pairs = iter(tokens)
        return dict(zip(pairs, pairs, strict=False))  # (the trailing empty token has no partner)
    entries = (entry.split(NAME_VALUE, 1) for entry in text.split(PROPERTY_SEP) if NAME_VALUE in entry)
    return {entry[0]: entry[1] for entry in entries if entry[0]}


def _decode(buf: Buffer, view: memoryview, at: int, base: int, keep_body: frozenset[str]) -> Message | str:
    """The message at `at`, or why there is none. `view` is a memoryview of `buf`: the body's CRC is taken
    without copying the body."""
    end = len(buf)
    if at + 88 <= end:  # the usual case, IPv4 hosts: the fixed fields in one unpack
        (
            size,
            magic,
            body_crc,
            queue_id,
            flag,
            queue_offset,
            physical,
            sys_flag,
            born_ts,
            store_ts,
            reconsume,
            prepared,
            body_len,
        ) = _V4_FIXED.unpack_from(buf, at)
    else:
        size, magic = _SIZE_MAGIC.unpack_from(buf, at)
        sys_flag = -1
    if magic not in (MAGIC_V1, MAGIC_V2):
        return f"bad magic code {magic & 0xFFFFFFFF:#010x}"
    if size < MIN_SIZE or at + size > end:
        return f"bad length {size}"
    # Every read from here on stays within the record: a corrupt length says so, and never reads past it.
    stop = at + size
    p = at + 88
    if sys_flag & (BORNHOST_V6 | STOREHOST_V6):  # an IPv6 host shifts every later field
        _, _, body_crc, queue_id, flag, queue_offset, physical, sys_flag, born_ts = _HEAD.unpack_from(buf, at)
        p = at + 48 + (20 if sys_flag & BORNHOST_V6 else 8)
        if p + 8 + (20 if sys_flag & STOREHOST_V6 else 8) + 16 > stop:
            return f"bad length {size} for IPv6 hosts"
        store_ts = _LONG.unpack_from(buf, p)[0]
        p += 8 + (20 if sys_flag & STOREHOST_V6 else 8)
        reconsume, prepared, body_len = _TAIL.unpack_from(buf, p)
        p += 16
    topic_width = 1 if magic == MAGIC_V1 else 2
    if body_len < 0 or p + body_len + topic_width > stop:
        return f"bad body length {body_len}"
    if zlib.crc32(view[p : p + body_len]) & 0x7FFFFFFF != body_crc:
        return "body CRC mismatch"
    body_at = p
    p += body_len
    topic_len = buf[p] if magic == MAGIC_V1 else _SHORT.unpack_from(buf, p)[0]
    p += topic_width
    if topic_len < 0 or p + topic_len + 2 > stop:
        return f"bad topic length {topic_len}"
    raw = buf[p : p + topic_len]
    if b"\0" in raw:
        return "zero bytes in the topic"
    topic = _TOPICS.get(raw)
    if topic is None:
        topic = raw.decode("utf-8", "replace")
        if len(_TOPICS) < 10_000:  # a corrupt store must not grow the cache without end
            _TOPICS[raw] = topic
    p += topic_len + 2
    props_len = _SHORT.unpack_from(buf, p - 2)[0]
    if p + props_len != stop:
        return f"bad properties length {props_len}"
    raw_props = buf[p:stop]
    if b"\0" in raw_props:  # no client writes them, and no CRC covers the properties: a page lost to zeros
        return "zero bytes in the properties"
    props = raw_props.decode("utf-8", "replace")
    if topic not in keep_body:
        return Message(at + base, size, queue_id, flag, queue_offset, physical, sys_flag, born_ts, store_ts,
                       reconsume, prepared, body_len, topic, props, None)  # fmt: skip
    return Message(at + base, size, queue_id, flag, queue_offset, physical, sys_flag, born_ts, store_ts, reconsume,
                   prepared, body_len, topic, props, buf[body_at : body_at + body_len],
                   _host(buf, at + 48, sys_flag & BORNHOST_V6))  # fmt: skip


def _host(buf: Buffer, at: int, v6: int) -> str:
    """The host at `at`: 4 (IPv4) or 16 (IPv6) address bytes, then the port as an int."""
    width = 16 if v6 else 4
    address = ipaddress.ip_address(bytes(buf[at : at + width]))
    port = _INT.unpack_from(buf, at + width)[0]
    return f"[{address}]:{port}" if v6 else f"{address}:{port}"


def _all_zero(buf: Buffer, start: int, end: int, chunk: int = 1 << 20) -> bool:
    return all(not buf[i : min(i + chunk, end)].strip(b"\0") for i in range(start, end, chunk))


def _being_written(buf: Buffer, at: int, size: int, magic: int) -> bool:
    """A record whose head is written (its size, and its magic code or not yet) and nothing after it: the
    broker is still copying its bytes in."""
    return (
        magic in (MAGIC_V1, MAGIC_V2, 0) and MIN_SIZE <= size <= len(buf) - at and _all_zero(buf, at + size, len(buf))
    )


def _resync(buf: Buffer, start: int, base: int, keep_body: frozenset[str], within: int | None = None) -> int | None:
    """The next position after `start` (before `start + within`, if given) where a whole record decodes."""
    magic_bytes = (_INT.pack(MAGIC_V1), _INT.pack(MAGIC_V2))
    at, end = start + 1, len(buf) if within is None else min(len(buf), start + within)
    while True:
        found = [i for i in (buf.find(m, at + 4, end + 4) for m in magic_bytes) if i >= 0]
        if not found:
            return None
        candidate = min(found) - 4
        with memoryview(buf) as view:
            if isinstance(_decode(buf, view, candidate, base, keep_body), Message):
                return candidate
        at = candidate + 1


def scan(
    buf: Buffer, base: int, start: int = 0, keep_body: frozenset[str] = frozenset()
) -> Generator[Entry, None, None]:
    """Walk a commit-log file's bytes (`base` is the file's first physical offset) from `start`.

    Ends with `FileEnd` (the blank record), `DataEnd` (zeros: nothing written yet; or a last record whose
    bytes are still arriving, with only zeros behind it) or the end of the buffer (`DataEnd` too). A
    corrupt record, or a span of zeros with a record after it, is reported and the walk resumes at the next
    record that decodes.
    """
    at, end = start, len(buf)
    with memoryview(buf) as view:  # released when the walk ends or its consumer closes it
        while at + 8 <= end:
            size, magic = _SIZE_MAGIC.unpack_from(buf, at)
            if magic == BLANK_MAGIC and size == end - at:  # the broker sizes it to the file's end
                yield FileEnd(at + base)
                return
            if size == 0 and magic == 0:
                # Zeros: the end of what was written, unless a record follows soon after them (a page lost in
                # the middle). Looking no further keeps a run from reading a whole preallocated file of zeros.
                resume = _resync(buf, at, base, keep_body, within=ZERO_SPAN)
                if resume is None:
                    yield DataEnd(at + base)
                    return
                # Zeros with records after them: a page lost in the middle, not the end of what was written.
                yield Corrupt(at + base, f"{resume - at} zero bytes before the next record", resume + base)
                at = resume
                continue
            decoded = "bad blank record" if magic == BLANK_MAGIC else _decode(buf, view, at, base, keep_body)
            if isinstance(decoded, Message):
                yield decoded
                at += decoded.size
                continue
            resume = _resync(buf, at, base, keep_body)
            if resume is None and _being_written(buf, at, size, magic):
                yield DataEnd(at + base, incomplete=True)  # the next run reads it whole
                return
            yield Corrupt(at + base, decoded, None if resume is None else resume + base)
            if resume is None:
                return
            at = resume
        yield DataEnd(at + base)
