"""A commit-log record encoder laid out as reference §4.1 says, written apart from the decoder it tests, for
hand-built test stores and the export benchmark."""

from __future__ import annotations

import struct
import zlib

MAGIC_V1, MAGIC_V2, BLANK_MAGIC = -626843481, -626843477, -875286124
_HEAD = struct.Struct(">iiiiiqqiq")


def encode(topic: str, props: dict[str, str], *, position: int = 0, body: bytes = b"x", queue_offset: int = 0,
           sys_flag: int = 0, prepared: int = 0, ipv6: bool = False, v2: bool = False, born: int = 1_000,
           store: int = 2_000, queue_id: int = 0) -> bytes:  # fmt: skip
    """One commit-log record laid out as reference §4.1 says, independently of the decoder."""
    host = (b"\0" * 15 + b"\1" if ipv6 else b"\x7f\0\0\1") + struct.pack(">i", 10911)
    flag = sys_flag | (0x30 if ipv6 else 0)
    text = "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()
    name = topic.encode()
    tail = (struct.pack(">i", len(body)) + body + (struct.pack(">h", len(name)) if v2 else bytes([len(name)])) + name
            + struct.pack(">h", len(text)) + text)  # fmt: skip
    head_len = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + len(host) + 8 + len(host) + 4 + 8
    size = head_len + len(tail)
    head = _HEAD.pack(size, MAGIC_V2 if v2 else MAGIC_V1, zlib.crc32(body) & 0x7FFFFFFF, queue_id, 0,
                      queue_offset, position, flag, born)  # fmt: skip
    return head + host + struct.pack(">q", store) + host + struct.pack(">iq", 0, prepared) + tail


def blank(remaining: int) -> bytes:
    """The end-of-file record: the rest of the file is unused."""
    return struct.pack(">ii", remaining, BLANK_MAGIC) + bytes(remaining - 8)
