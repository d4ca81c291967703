"""Spark types derived from `schemas` constants."""

from pyspark.sql import types as T

from schemas.model import Schema

_SPARK_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(),
    "int": T.IntegerType(),
    "long": T.LongType(),
    "boolean": T.BooleanType(),
    "double": T.DoubleType(),
    "timestamp": T.TimestampType(),
    "strings": T.ArrayType(T.StringType(), containsNull=False),
}


def to_struct(schema: Schema) -> T.StructType:
    return T.StructType([T.StructField(f.name, _SPARK_TYPES[f.type], f.nullable) for f in schema.fields])
