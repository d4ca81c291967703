"""`jobs.errors.first_line` on errors that real Spark raises: one line, the innermost cause and its first line."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from jobs.errors import first_line

pytestmark = pytest.mark.spark


def failure(spark: SparkSession, query: str) -> Exception:
    with pytest.raises(Exception) as raised:
        spark.sql(query).collect()
    return raised.value


def test_a_spark_error_is_one_line_without_the_plan_or_the_sql(spark: SparkSession) -> None:
    # Spark's messages go on after their first line: the unresolved plan, the SQL with a caret under it.
    missing = first_line(failure(spark, "SELECT * FROM no_such_table_anywhere"))
    assert missing.startswith("ExtendedAnalysisException: [TABLE_OR_VIEW_NOT_FOUND] The table or view")
    assert "\n" not in missing and "UnresolvedRelation" not in missing
    raised = first_line(failure(spark, "SELECT assert_true(1 = 2, 'first\\nsecond')"))
    assert raised == "SparkRuntimeException: [USER_RAISED_EXCEPTION] first"


def test_a_python_error_keeps_its_type_and_first_line() -> None:
    assert first_line(ValueError("\n  bad value\nmore")) == "ValueError: bad value"
    assert first_line(ConnectionRefusedError()) == "ConnectionRefusedError"
