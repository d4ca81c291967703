from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from schemas import CONSUMER, HALF, LANDING, OFFSET, REAL, TOPOLOGY, TRACE
from schemas.arrow import to_arrow
from schemas.model import Field, Schema
from schemas.spark import to_struct


def test_landing_streams_and_keys() -> None:
    assert set(LANDING) == {"half", "op", "real", "offset", "consumer", "copy", "topology", "trace"}
    assert HALF.key == ("broker_name", "topic", "queue_id", "queue_offset")  # two half topics since RIP-82
    assert HALF.defaults == {"topic": "RMQ_SYS_TRANS_HALF_TOPIC"} and HALF.field("topic").nullable
    assert REAL.key == ("broker_name", "topic", "queue_id", "queue_offset")
    assert "check_times" in HALF.names and HALF.field("check_times").nullable
    assert not HALF.field("uniq_key").nullable
    # A topology row needs what its kind says: a member its cluster and address, a table or topic row its broker.
    assert TOPOLOGY.field("address").required_in({"kind": "broker"}) and not TOPOLOGY.field("address").required_in(
        {"kind": "topic"}
    )
    assert TOPOLOGY.field("broker_name").required_in({"kind": "table"})
    assert not TOPOLOGY.field("broker_name").required_in({"kind": "route"})  # a topic with no route has none
    # A trace context is one record of its message; a decoded one needs its type and key, a malformed one neither.
    assert TRACE.key == ("broker_name", "topic", "queue_id", "queue_offset", "context_index")
    assert TRACE.field("uniq_key").required_in({"malformed": None})
    assert not TRACE.field("uniq_key").required_in({"malformed": "unknown trace type 'X'"})


def test_spark_struct_matches_definition() -> None:
    struct = to_struct(OFFSET)
    assert struct.fieldNames() == list(OFFSET.names)
    assert struct["queue_id"].dataType == T.IntegerType()
    assert struct["offset"].dataType == T.LongType() and not struct["offset"].nullable
    assert struct["client_id"].nullable


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


def test_line_encoder_round_trips_and_omits_nulls() -> None:
    from schemas.jsonl import line_encoder
    from schemas.truth import TRUTH_TRANSACTION

    half = ("b", 0, 7, 99, 1, 2, 'u"\\\n\u00e9', "t", "g", "orders", 3, None, None, 5, None, "k", 10, None)
    line = line_encoder(HALF)(half)
    assert json.loads(line) == {k: v for k, v in zip(HALF.names, half, strict=True) if v is not None}
    assert "check_times" not in line and "\n" not in line
    truth = ("b", "u", "g", "t", 1, 2, "PENDING", None, None, 0, 0, False, True, ["lost_end", 'q"'])
    assert json.loads(line_encoder(TRUTH_TRANSACTION)(truth))["faults"] == ["lost_end", 'q"']
    assert json.loads(line_encoder(TRUTH_TRANSACTION)(truth))["discarded"] is True


def test_line_encoder_needs_a_required_first_field() -> None:
    from schemas.jsonl import line_encoder

    with pytest.raises(ValueError, match="first field must be required"):
        line_encoder(Schema("s", (Field("a", "int", nullable=True),)))


def test_validate_names_every_problem() -> None:
    from schemas.validate import problems

    rec = {"broker_name": "b", "consumer_group": "g", "topic": "t", "queue_id": True, "offset": "5",
           "commit_timestamp": 1, "extra": 1}  # fmt: skip
    assert problems(OFFSET, rec) == [
        "unknown field 'extra'",
        "field 'queue_id' should be int, got bool True",
        "field 'offset' should be long, got str '5'",
    ]
    assert problems(OFFSET, {}) == [f"missing required field {n!r}" for n in OFFSET.required]


def test_a_field_can_be_required_by_the_record_it_is_in() -> None:
    from schemas.validate import problems

    table = {"snapshot_ts": 1, "consumer_group": "g", "kind": "subscription", "topic": "t"}
    assert problems(CONSUMER, dict(table, client_id="c1")) == []  # a member's own subscription
    whose = "missing field 'broker_name', required when kind is queue or client_id is null"
    assert problems(CONSUMER, table) == [whose]  # the broker's table, but which broker's?
    queue = dict(table, kind="queue", broker_name="b")
    assert problems(CONSUMER, queue) == [
        "missing field 'client_id', required when kind is queue",
        "missing field 'queue_id', required when kind is queue",
    ]
    with pytest.raises(ValueError, match="required_when only makes sense on a nullable field"):
        Field("a", "int", required_when=(("b", "x"),))
