"""fastjson's output (RocketMQ's `RemotingSerializable.toJson`, its config files and admin answers) read as
JSON. It is JSON except for map keys that are not strings: integers are written bare
(`{"brokerAddrs":{0:"127.0.0.1:10911"}}`) and objects as objects (`ConsumerRunningInfo.mqTable`:
`{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{...}}`). Pure.
"""

from __future__ import annotations

import json
import re
from typing import Any

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")
_BLANK = re.compile(r"[ \t\r\n]*")
_LITERALS = {"true": True, "false": False, "null": None}


class FastjsonError(ValueError):
    """The text is not fastjson output."""


def loads(text: str) -> Any:
    """Parse `text`. A bare integer key becomes its digits; an object key becomes its JSON text with sorted
    keys (`object_key` builds the same from a dict)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise FastjsonError("nested too deeply") from None
    except ValueError:
        pass
    try:
        value, end = _value(text, _skip(text, 0))
    except RecursionError:
        raise FastjsonError("nested too deeply") from None
    except (IndexError, ValueError) as e:
        raise FastjsonError(str(e) or "unexpected end") from None
    if _skip(text, end) != len(text):
        raise FastjsonError(f"extra data at {end}")
    return value


def object_key(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


def _skip(text: str, i: int) -> int:
    return _BLANK.match(text, i).end()  # type: ignore[union-attr]


def _value(text: str, i: int) -> tuple[Any, int]:
    c = text[i]
    if c == "{":
        return _object(text, i + 1)
    if c == "[":
        out: list[Any] = []
        i = _skip(text, i + 1)
        if text[i] == "]":
            return out, i + 1
        while True:
            item, i = _value(text, _skip(text, i))
            out.append(item)
            i = _skip(text, i)
            if text[i] == "]":
                return out, i + 1
            _expect(text, i, ",")
            i += 1
    if c == '"':
        return _string(text, i)
    for word, literal in _LITERALS.items():
        if text.startswith(word, i):
            return literal, i + len(word)
    m = _NUMBER.match(text, i)
    if not m:
        raise ValueError(f"unexpected {c!r} at {i}")
    return (float(m.group()) if m.group(1) or m.group(2) else int(m.group())), m.end()


def _object(text: str, i: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    i = _skip(text, i)
    if text[i] == "}":
        return out, i + 1
    while True:
        key: Any
        if text[i] == '"':
            key, i = _string(text, i)
        elif text[i] == "{":
            raw, i = _object(text, i + 1)
            key = object_key(raw)
        else:
            m = _NUMBER.match(text, i)
            if not m:
                raise ValueError(f"unexpected {text[i]!r} at {i} where a key should be")
            key, i = m.group(), m.end()
        i = _skip(text, i)
        _expect(text, i, ":")
        out[key], i = _value(text, _skip(text, i + 1))
        i = _skip(text, i)
        if text[i] == "}":
            return out, i + 1
        _expect(text, i, ",")
        i = _skip(text, i + 1)


def _string(text: str, i: int) -> tuple[str, int]:
    m = _STRING.match(text, i)
    if not m:
        raise ValueError(f"unterminated string at {i}")
    return json.loads(m.group()), m.end()


def _expect(text: str, i: int, char: str) -> None:
    if text[i] != char:
        raise ValueError(f"expected {char!r} at {i}, found {text[i]!r}")
