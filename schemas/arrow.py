"""Arrow types derived from `schemas` constants."""

import pyarrow as pa

from schemas.model import Schema

_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "boolean": pa.bool_(),
    "double": pa.float64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "strings": pa.list_(pa.string()),
}


def to_arrow(schema: Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, _ARROW_TYPES[f.type], nullable=f.nullable) for f in schema.fields])
