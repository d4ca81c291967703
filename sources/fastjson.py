"""fastjson's output (RocketMQ's `RemotingSerializable.toJson`, its config files and admin answers) read as
JSON. It is JSON except that integer map keys are bare: `{"brokerAddrs":{0:"127.0.0.1:10911"}}`. Pure."""

from __future__ import annotations

import json
from typing import Any


class FastjsonError(ValueError):
    """The text is not fastjson output."""


def loads(text: str) -> Any:
    """Parse `text`; bare keys are quoted outside string literals only."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':  # copy a string literal whole, escapes included
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif c in "{," and (k := _bare_key_end(text, i + 1)) is not None:
            out.append(f'{c}"{text[i + 1 : k].strip()}"')
            i = k
        else:
            out.append(c)
            i += 1
    try:
        return json.loads("".join(out))
    except ValueError as e:
        raise FastjsonError(str(e)) from None


def _bare_key_end(text: str, i: int) -> int | None:
    """Where the ':' after a bare integer key starting at `i` (after blanks) is, if there is one."""
    n = len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    digits = i + (i < n and text[i] == "-")
    j = digits
    while j < n and text[j].isdigit():
        j += 1
    if j == digits:
        return None
    while j < n and text[j] in " \t\r\n":
        j += 1
    return j if j < n and text[j] == ":" else None
