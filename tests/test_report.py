"""The dashboard's aggregates over Spark: counts over time, for a whole table and per consumer group, and the
tables of findings."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections import Counter
from typing import Any

import pytest
from prometheus_client import generate_latest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dashboard.charts import bucket_ms
from jobs import catalog, report
from jobs.catalog import create_table
from jobs.config import Config
from jobs.ingest import Tally, record_run
from jobs.report import _listed, _over_time, _over_time_by
from jobs.session import jobs_started
from jobs.web import Metrics
from schemas import LANDING
from schemas.bronze import INGEST_RUNS
from schemas.reconciled import BROKER_WINDOWS
from schemas.spark import to_struct
from tests.test_ingest import fresh_db
from transforms.frames import gathered

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
    [found] = gathered(_over_time_by(df, F.col("store_timestamp"), "status", "consumer_group"))
    found = {g: {"bucket_ms": v["bucket_ms"], "counts": sorted(v["counts"])} for g, v in found.items()}
    by_group = {g: [r for r in ROWS if r[0] == g] for g in ("g1", "g2")}
    assert found == {g: expected(rows) for g, rows in by_group.items()}  # g3 has no time: no chart data
    assert found["g1"]["bucket_ms"] != found["g2"]["bucket_ms"]
    # Given the spans a pass made anyway found (g3: none with a time), the same in one pass.
    times = {g: [ts for gg, ts, _ in ROWS if gg == g and ts is not None] for g in ("g1", "g2", "g3")}
    spans = {g: (min(ts, default=None), max(ts, default=None)) for g, ts in times.items()}
    [given] = gathered(_over_time_by(df, F.col("store_timestamp"), "status", "consumer_group", spans=spans))
    assert {g: {"bucket_ms": v["bucket_ms"], "counts": sorted(v["counts"])} for g, v in given.items()} == found
    [whole] = gathered(_over_time(df, F.col("store_timestamp"), "status"))
    assert {**whole, "counts": sorted(whole["counts"])} == expected(ROWS)
    span = (min(t for _, t, _ in ROWS if t is not None), max(t for _, t, _ in ROWS if t is not None))
    [again] = gathered(_over_time(df, F.col("store_timestamp"), "status", span))
    assert {**again, "counts": sorted(again["counts"])} == expected(ROWS)
    assert gathered(_over_time(df.where("store_timestamp IS NULL"), F.col("store_timestamp"), "status")) == [{
        "bucket_ms": 1000, "counts": []}]  # fmt: skip


KEYED = "anomaly_id string, anomaly_type string, broker_name string, uniq_key string, consumer_group string, " \
        "topic string, queue_id int, event_ts long, detail string, producer_group string, real_topic string, " \
        "state string, reason string"  # fmt: skip


def finding(anomaly_id: str, kind: str, at: int, broker: str = "b1", group: str | None = None,
            queue: int | None = None, **detail: object) -> tuple[object, ...]:  # fmt: skip
    return (anomaly_id, kind, broker, f"K-{anomaly_id}", group, "t" if group else None, queue, at, json.dumps(detail),
            "pg", "rt", "PENDING", None)  # fmt: skip


def test_every_table_of_findings_keeps_its_own_order_and_limit(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(report.LISTED, "stuck_oldest", dataclasses.replace(report.LISTED["stuck_oldest"], limit=2))
    rows = [
        finding("s1", "STUCK_HALF", 10, age_ms=5_000, check_times=1),
        finding("s2", "STUCK_HALF", 20, age_ms=90_000, check_times=7),
        finding("s3", "STUCK_HALF", 30, age_ms=60_000, check_times=4),
        finding("d1", "DISCARDED_EXPIRED", 100),
        finding("d2", "DISCARDED_AFTER_MAX_CHECKS", 300),
        finding("d3", "DISCARDED_AFTER_MAX_CHECKS", 300),
        finding("r1", "OFFSET_REGRESSION", 50, "b2", "cg", 0, from_offset=9, to_offset=1),
        finding("r2", "OFFSET_REGRESSION", 50, "b1", "cg", 1, from_offset=8, to_offset=2),
        finding("r3", "OFFSET_REGRESSION", 40, "b1", "cg", 1, from_offset=7, to_offset=3),
        finding("x1", "CHECK_ANSWER_LOST", 70),  # a finding no table lists
    ]
    [listed] = gathered(_listed(spark.createDataFrame(rows, KEYED)))
    assert set(listed) == set(report.LISTED)
    # The oldest stuck halves first, two of them; the age a number, the detail's fields strings.
    assert [(r["anomaly_id"], r["age_ms"], r["check_times"]) for r in listed["stuck_oldest"]] == [
        ("s2", 90_000, "7"), ("s3", 60_000, "4")]  # fmt: skip
    assert list(listed["stuck_oldest"][0]) == [c.removeprefix("detail.") for c in report.LISTED["stuck_oldest"].columns]
    # Both kinds of discard, the latest first, a tie by id.
    assert [r["anomaly_id"] for r in listed["discarded"]] == ["d2", "d3", "d1"]
    # Regressions by queue (group, topic, broker, queue id), then time.
    assert [(r["anomaly_id"], r["from_offset"]) for r in listed["regressions"]] == [
        ("r3", "7"), ("r2", "8"), ("r1", "9")]  # fmt: skip
    assert all(rows == [] for name, rows in listed.items() if name not in ("stuck_oldest", "discarded", "regressions"))


LIFE = "state string, born_ts long, first_copy_ts long, first_commit_ts long, resolved_ts long"
AS_OF = 1_000_000
Life = tuple[str, int, int | None, int | None, int | None]  # a row of LIFE


def states_by_bucket(rows: list[Life]) -> dict[str, object]:
    """The states' chart of lifecycle `rows` (LIFE): by first copy, else first commit."""
    seen = [(copy if copy is not None else commit, state) for state, _, copy, commit, _ in rows]
    times = [t for t, _ in seen if t is not None]
    width = bucket_ms(min(times), max(times))
    counts = Counter((t // width * width, state) for t, state in seen if t is not None)
    return {"bucket_ms": width, "counts": sorted((b, s, n) for (b, s), n in counts.items())}


def test_the_lifecycle_charts_count_states_and_the_largest_op_lag_per_bucket(spark: SparkSession) -> None:
    rows: list[Life] = [
        ("COMMITTED", 0, 100_000, 120_000, 160_000),  # an op 40 s after the commit
        ("COMMITTED", 0, None, 300_000, 840_000),  # no copy: charted by its commit
        ("COMMITTED", 0, 400_000, 410_000, 400_000),  # its op stored before its commit: no lag shown
        ("ROLLED_BACK", 0, 250_000, None, 270_000),
        ("PENDING", 10_000, 900_000, None, None),  # pending 990 s at AS_OF
        ("PENDING", 950_000, None, None, None),  # pending 50 s, and nothing to chart it by
    ]
    [(lags, figures, states)] = gathered(report._lifecycle_charts(spark.createDataFrame(rows, LIFE), AS_OF))
    shown = [(c, r - c) for _, _, _, c, r in rows if c is not None and r is not None and r >= c]
    width = bucket_ms(min(c for c, _ in shown), max(c for c, _ in shown))
    most: dict[int, int] = {}
    for commit, lag in shown:
        most[commit // width * width] = max(most.get(commit // width * width, 0), lag)
    assert lags == {"bucket_ms": width, "rows": sorted(most.items())} and width > 1000
    assert {**states, "counts": sorted(states["counts"])} == states_by_bucket(rows)
    assert figures["pending"] == {"1m": 1, "10m": 1, "1h": 0, "1d": 0}
    assert figures["op_lag_seconds"]["1"] == 540 and figures["op_lag_seconds"]["0.5"] == 40
    # Copies and no op yet: states to chart, no lag; nothing at all: neither.
    [(lags, _, states)] = gathered(report._lifecycle_charts(spark.createDataFrame(rows[3:], LIFE), AS_OF))
    assert lags == {"bucket_ms": 1000, "rows": []}
    assert {**states, "counts": sorted(states["counts"])} == states_by_bucket(rows[3:])
    [(lags, figures, states)] = gathered(report._lifecycle_charts(spark.createDataFrame([], LIFE), AS_OF))
    assert (lags, states) == ({"bucket_ms": 1000, "rows": []}, {"bucket_ms": 1000, "counts": []})
    assert figures == {"op_lag_seconds": {}, "pending": {"1m": 0, "10m": 0, "1h": 0, "1d": 0}}


def test_the_latest_ingest_runs_are_what_the_table_sums_and_stay_known_behind_a_run(
    spark: SparkSession, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run's rows (one per stream) summed, the latest LATEST_RUNS runs by start: as a query over the whole table
    finds them, when an older run is among the latest rows only in part, and known without a Spark job after a
    run this process recorded."""
    monkeypatch.setattr(report, "LATEST_RUNS", 2)  # read: the latest 2 x 8 rows
    cfg = fresh_db(spark, config, "t_report_runs")
    table = create_table(spark, cfg, INGEST_RUNS)
    start = dt.datetime(2026, 12, 1, 12)

    def run(n: int, streams: int) -> None:
        tallies = {s: Tally(files=n, read=10 * n + i, inserted=10 * n, duplicates=i, started=start + dt.timedelta(
            minutes=n, seconds=i)) for i, s in enumerate(list(LANDING)[:streams])}  # fmt: skip
        record_run(spark, cfg, f"run-{n}", tallies)

    def whole_table() -> list[dict[str, Any]]:  # the runs as a query over every row finds them
        per_run = spark.table(table).groupBy("run_id").agg(
            F.min("started_at").alias("started_at"), F.max("finished_at").alias("finished_at"),
            *[F.sum(c).alias(c) for c in report.INGEST_SUMS],
        )  # fmt: skip
        return [r.asDict() for r in per_run.orderBy(F.desc("started_at")).limit(2).collect()]

    for n, streams in ((1, 8), (2, 8), (3, 2)):
        run(n, streams)
    catalog._LATEST.clear()  # as a process that did not record them finds them
    assert [r["run_id"] for r in report._ingest_runs(spark, table)] == ["run-3", "run-2"]
    run(4, 2)  # the latest 16 rows: runs 4, 3 and 2 whole, run 1 in part
    known = jobs_started(spark)
    found = report._ingest_runs(spark, table)
    assert jobs_started(spark) == known
    assert found == whole_table() and [r["run_id"] for r in found] == ["run-4", "run-3"]
    assert found[0]["inserted"] == 2 * 40 and found[0]["duplicates"] == 0 + 1
    catalog._LATEST.clear()
    assert report._ingest_runs(spark, table) == found


def test_the_brokers_writes_chart_and_the_last_whole_window_the_metric_shows(
    spark: SparkSession, config: Config
) -> None:
    """broker_windows' running totals (a window's rows summed) per bucket for the chart, and per broker in the last
    window that ended by the data time, which `txn_recon_broker_writes` exports from the same read."""
    cfg = fresh_db(spark, config, "t_report_brokers")
    window = cfg.thresholds.idle_window_ms
    rows = [("a", 8 * window, 5), ("a", 9 * window, 3), ("a", 9 * window, 4), ("b", 9 * window, 2),
            ("b", 10 * window, 7)]  # fmt: skip
    spark.createDataFrame(rows, to_struct(BROKER_WINDOWS)).writeTo(create_table(spark, cfg, BROKER_WINDOWS)).append()
    as_of = 10 * window + 5_000  # in the eleventh window, still filling: the tenth is the last whole one
    [got] = gathered(report._brokers(spark, cfg, as_of))
    assert sorted((r["broker_name"], r["messages"]) for r in got["last_window"]) == [("a", 7), ("b", 2)]
    assert sum(n for _, _, n in got["broker_writes"]["counts"]) == sum(n for _, _, n in rows)
    metrics = Metrics()
    metrics._show({"findings": [], "as_of": as_of, "trace": {"discard_causes": [], "groups": []},
                   "op_lag_seconds": {}, "pending": {}, "deliveries": [], "ongoing": [],
                   "last_window": got["last_window"]})  # fmt: skip
    text = generate_latest(metrics.registry).decode()
    assert sorted(re.findall(r'^txn_recon_broker_writes\{broker="(\w+)"\} (\S+)$', text, re.M)) == [
        ("a", "7.0"), ("b", "2.0")]  # fmt: skip
