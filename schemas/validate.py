"""Check one record (a dict from a landing file) against its schema, in plain Python."""

from __future__ import annotations

from typing import Any

from schemas.model import Schema

_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31,
    "long": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63,
    "boolean": lambda v: isinstance(v, bool),
    "double": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def problems(schema: Schema, record: dict[str, Any]) -> list[str]:
    """Every way `record` breaks `schema`: unknown fields, missing required ones, wrong types."""
    out = [f"unknown field {k!r}" for k in record if k not in schema.names]
    for f in schema.fields:
        value = record.get(f.name)
        if value is None:
            if not f.nullable:
                out.append(f"missing required field {f.name!r}")
            elif f.required_in(record):
                out.append(f"missing field {f.name!r}, required when {f.required_when_text}")
        elif not _CHECKS[f.type](value):
            out.append(f"field {f.name!r} should be {f.type}, got {type(value).__name__} {value!r}")
    return out
