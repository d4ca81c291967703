from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from schemas import HALF, LANDING, OFFSET, REAL
from schemas.arrow import to_arrow
from schemas.model import Field, Schema
from schemas.spark import to_ddl, to_struct


def test_landing_streams_and_keys() -> None:
    assert set(LANDING) == {"half", "op", "real", "offset"}
    assert HALF.key == ("broker_name", "queue_id", "queue_offset")
    assert REAL.key == ("broker_name", "topic", "queue_id", "queue_offset")
    assert "check_times" in HALF.names and HALF.field("check_times").nullable
    assert not HALF.field("uniq_key").nullable


def test_spark_struct_matches_definition() -> None:
    struct = to_struct(OFFSET)
    assert struct.fieldNames() == list(OFFSET.names)
    assert struct["queue_id"].dataType == T.IntegerType()
    assert struct["offset"].dataType == T.LongType() and not struct["offset"].nullable
    assert struct["client_id"].nullable


def test_ddl_marks_required_columns() -> None:
    ddl = to_ddl(OFFSET)
    assert "`offset` BIGINT NOT NULL" in ddl
    assert "`client_id` STRING," in ddl
    assert ddl.count("NOT NULL") == len(OFFSET.required)


def test_arrow_schema_matches_definition() -> None:
    schema = to_arrow(REAL)
    assert schema.names == list(REAL.names)
    assert schema.field("transactional").type == pa.bool_()
    assert schema.field("queue_id").type == pa.int32()
    assert schema.field("uniq_key").nullable and not schema.field("topic").nullable


def test_schema_rejects_bad_definitions() -> None:
    with pytest.raises(ValueError, match="unknown type"):
        Field("x", "varchar")
    with pytest.raises(ValueError, match="duplicate"):
        Schema("s", (Field("a", "int"), Field("a", "long")))
    with pytest.raises(ValueError, match="key columns"):
        Schema("s", (Field("a", "int"),), key=("b",))


def test_core_schemas_do_not_import_spark_or_arrow() -> None:
    code = "import sys, schemas; assert not {'pyspark', 'pyarrow'} & set(sys.modules), sys.modules.keys()"
    subprocess.run([sys.executable, "-c", code], check=True)
