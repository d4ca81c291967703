"""Fast JSON Lines encoding of records given as tuples in schema field order.

`line_encoder(schema)` compiles one f-string per schema from precomputed key fragments and the
values (strings quoted and escaped by the json module's C routine), leaving null optional fields out
as the landing contract allows. It is about three times faster than json.dumps on a dict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from json.encoder import encode_basestring
from typing import Any

from schemas.model import Schema

# Per type: the value as an f-string replacement field, and as a str expression (for nullable fields).
_VALUE = {
    "string": ("_q(r[{i}])", "_q(r[{i}])"),
    "int": ("r[{i}]", "str(r[{i}])"),
    "long": ("r[{i}]", "str(r[{i}])"),
    "double": ("_float(r[{i}])", "_float(r[{i}])"),
    "boolean": ("T if r[{i}] else F", "(T if r[{i}] else F)"),
    "strings": ("_list(r[{i}])", "_list(r[{i}])"),
}


def line_encoder(schema: Schema) -> Callable[[Sequence[Any]], str]:
    """A function mapping a record tuple to one JSON object (no newline)."""
    if schema.fields[0].nullable:
        raise ValueError(f"schema {schema.name!r}: the first field must be required to lead the object")
    namespace: dict[str, Any] = {
        "_q": encode_basestring, "_list": _json_list, "_float": _json_float, "T": "true", "F": "false", "E": "",
    }  # fmt: skip
    parts = []
    for i, f in enumerate(schema.fields):
        if f.type not in _VALUE:
            raise ValueError(f"schema {schema.name!r}: field {f.name!r} of type {f.type} has no JSON encoding")
        namespace[f"K{i}"] = ("{" if i == 0 else ",") + encode_basestring(f.name) + ":"
        field, text = (t.format(i=i) for t in _VALUE[f.type])
        parts.append(f"{{E if r[{i}] is None else K{i} + {text}}}" if f.nullable else f"{{K{i}}}{{{field}}}")
    source = "def encode(r):\n    return f'" + "".join(parts) + "}}'\n"
    exec(compile(source, f"<jsonl encoder for {schema.name}>", "exec"), namespace)
    encode: Callable[[Sequence[Any]], str] = namespace["encode"]
    return encode


def _json_float(value: float) -> str:
    return repr(float(value))


def _json_list(values: Sequence[str]) -> str:
    return "[" + ",".join(map(encode_basestring, values)) + "]"
