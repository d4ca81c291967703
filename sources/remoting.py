"""RocketMQ's remoting protocol (apache/rocketmq 5.3.3, `remoting/.../protocol/RemotingCommand.java`), as
bytes in and out. No I/O: `sources.client` does the sockets.

A frame is `total length (4) | serialize type (1) and header length (3) | header | body`, big-endian. We
send JSON headers; a broker answers in its own configured type, JSON (the default) or ROCKETMQ's binary
one (`RocketMQSerializable`), and both are decoded. Header fields travel as strings in `extFields`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# RequestCode.java
PULL_MESSAGE = 11
GET_ALL_TOPIC_CONFIG = 21
VIEW_MESSAGE_BY_ID = 33
GET_ALL_CONSUMER_OFFSET = 43
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
GET_CONSUMER_CONNECTION_LIST = 203
GET_CONSUMER_RUNNING_INFO = 307
QUERY_CONSUME_QUEUE = 321
# ResponseCode.java and RemotingSysResponseCode.java
SUCCESS = 0
SYSTEM_ERROR = 1
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
SUBSCRIPTION_GROUP_NOT_EXIST = 26
CONSUMER_NOT_ONLINE = 206

JSON_TYPE, ROCKETMQ_TYPE = 0, 1  # SerializeType.java
RESPONSE_FLAG = 1  # RemotingCommand.RPC_TYPE bit: 0 request, 1 response
VERSION = 479  # MQVersion.Version.V5_3_3.ordinal(): the protocol level we speak
MAX_FRAME = 64 << 20  # a sanity bound: pull answers are a few hundred KiB (maxTransferBytesOnMessageInMemory)
_LEN = struct.Struct(">i")
_BINARY_HEAD = struct.Struct(">hbhii")  # code, language, version, opaque, flag


class ProtocolError(ValueError):
    """Bytes that are not a remoting frame."""


@dataclass(frozen=True)
class Command:
    code: int
    opaque: int
    fields: dict[str, str] = field(default_factory=dict)  # extFields
    body: bytes = b""
    remark: str | None = None
    flag: int = 0

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)


@dataclass(frozen=True)
class Credentials:
    """An ACL access key and secret (SessionCredentials); `repr` never shows the secret."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)


def sign(fields: Mapping[str, str], body: bytes, creds: Credentials) -> dict[str, str]:
    """The fields with AccessKey (and SecurityToken) added and signed as AclClientRPCHook does: HMAC-SHA1,
    keyed by the secret, of every field's value in key order, then the body; base64 (AclUtils, AclSigner)."""
    signed = dict(fields, AccessKey=creds.access_key)
    if creds.security_token is not None:
        signed["SecurityToken"] = creds.security_token
    content = "".join(signed[k] for k in sorted(signed) if k != "Signature").encode("utf-8") + body
    digest = hmac.new(creds.secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    signed["Signature"] = base64.b64encode(digest).decode("ascii")
    return signed


def encode(code: int, opaque: int, fields: Mapping[str, Any], body: bytes = b"",
           creds: Credentials | None = None) -> bytes:  # fmt: skip
    """A request frame with a JSON header; `fields` values become strings, as Java's header encoder makes them."""
    ext = {k: _text(v) for k, v in fields.items() if v is not None}
    if creds is not None:
        ext = sign(ext, body, creds)
    header = json.dumps({"code": code, "language": "PYTHON", "version": VERSION, "opaque": opaque, "flag": 0,
                         "extFields": ext, "serializeTypeCurrentRPC": "JSON"},
                        separators=(",", ":")).encode("utf-8")  # fmt: skip
    return _LEN.pack(4 + len(header) + len(body)) + _LEN.pack(len(header)) + header + body


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def frame_length(prefix: bytes) -> int:
    """The length after the 4-byte prefix of a frame."""
    (length,) = _LEN.unpack(prefix)
    if not 4 <= length <= MAX_FRAME:
        raise ProtocolError(f"bad frame length {length}")
    return length


def decode(frame: bytes) -> Command:
    """A frame without its 4-byte length prefix."""
    if len(frame) < 4:
        raise ProtocolError("frame shorter than its header length")
    (marked,) = _LEN.unpack_from(frame)
    kind, header_len = (marked >> 24) & 0xFF, marked & 0xFFFFFF
    header, body = frame[4 : 4 + header_len], frame[4 + header_len :]
    if len(header) != header_len:
        raise ProtocolError(f"header length {header_len} exceeds the frame")
    if kind == JSON_TYPE:
        try:
            doc = json.loads(header)
            ext = doc.get("extFields") or {}
            remark = doc.get("remark")
            if remark is not None and not isinstance(remark, str):
                raise TypeError(f"remark {remark!r} is not text")
            return Command(int(doc["code"]), int(doc.get("opaque", 0)), {str(k): str(v) for k, v in ext.items()},
                           body, remark, int(doc.get("flag", 0)))  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise ProtocolError(f"bad JSON header ({type(e).__name__}: {e})") from None
    if kind == ROCKETMQ_TYPE:
        return _decode_binary(header, body)
    raise ProtocolError(f"unknown serialize type {kind}")


def _decode_binary(header: bytes, body: bytes) -> Command:
    """RocketMQSerializable.rocketMQProtocolDecode: fixed fields, remark, then key/value pairs."""
    try:
        code, _, _, opaque, flag = _BINARY_HEAD.unpack_from(header)
        p = _BINARY_HEAD.size
        remark, p = _string(header, p, 4)
        (ext_len,) = _LEN.unpack_from(header, p)
        p, end, ext = p + 4, p + 4 + max(ext_len, 0), {}
        while p < end:
            key, p = _string(header, p, 2)
            value, p = _string(header, p, 4)
            ext[key or ""] = value or ""
    except (struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"bad binary header ({e})") from None
    return Command(code, opaque, ext, body, remark, flag)


def _string(buf: bytes, p: int, width: int) -> tuple[str | None, int]:
    n = struct.unpack_from(">h" if width == 2 else ">i", buf, p)[0]
    p += width
    if n <= 0:
        return None, p
    if p + n > len(buf):
        raise struct.error("string runs past the header")
    return buf[p : p + n].decode("utf-8"), p + n
