"""The dashboard's aggregates over Spark: counts over time, for a whole table and per consumer group."""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dashboard.charts import bucket_ms
from jobs.report import _over_time, _over_time_by

pytestmark = pytest.mark.spark

ROWS = [
    ("g1", 1_000, "CONSUMED"), ("g1", 1_500, "CONSUMED"), ("g1", 3_000, "PENDING"),
    ("g2", 0, "CONSUMED"), ("g2", 7_000_000, "UNDELIVERED"), ("g2", 7_200_000, "UNDELIVERED"),
    ("g3", None, "PENDING"),
]  # fmt: skip


def expected(rows: list[tuple[str, int | None, str]]) -> dict[str, object]:
    times = [ts for _, ts, _ in rows if ts is not None]
    width = bucket_ms(min(times), max(times))
    counts = Counter((ts // width * width, status) for _, ts, status in rows if ts is not None)
    return {"bucket_ms": width, "counts": sorted((b, s, n) for (b, s), n in counts.items())}


def test_counts_over_time_per_group_size_each_groups_buckets_to_its_own_span(spark: SparkSession) -> None:
    df = spark.createDataFrame(ROWS, "consumer_group string, store_timestamp long, status string")
    found = _over_time_by(df, F.col("store_timestamp"), "status", "consumer_group")
    found = {g: {"bucket_ms": v["bucket_ms"], "counts": sorted(v["counts"])} for g, v in found.items()}
    by_group = {g: [r for r in ROWS if r[0] == g] for g in ("g1", "g2")}
    assert found == {g: expected(rows) for g, rows in by_group.items()}  # g3 has no time: no chart data
    assert found["g1"]["bucket_ms"] != found["g2"]["bucket_ms"]
    whole = _over_time(df, F.col("store_timestamp"), "status")
    assert {**whole, "counts": sorted(whole["counts"])} == expected(ROWS)
    assert _over_time(df.where("store_timestamp IS NULL"), F.col("store_timestamp"), "status") == {
        "bucket_ms": 1000, "counts": []}  # fmt: skip
