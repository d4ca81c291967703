"""Data quality: the suites pass on the model's data, catch data broken on purpose, validate only what
changed, and record every result in dq_results and every run in quality_runs."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs import quality
from jobs.catalog import create_table, table_version
from jobs.cli import main
from jobs.config import Config
from jobs.quality import (
    EXIT_BLOCKING,
    Batch,
    _local,
    _validate,
    check_quality,
    quality_dir,
    read_latest_results,
    recorded_validations,
    validations_in,
)
from jobs.reconcile import reconcile
from jobs.report import gather_quality
from jobs.session import jobs_started
from schemas.bronze import BRONZE
from schemas.quality import QUALITY_RUNS, suites
from schemas.spark import to_struct
from tests.test_ingest import fresh_db, ingest, make_landing, op_record
from transforms.lifecycle import DISCARD_TOPIC
from transforms.quality import GROUP_FINDINGS, changed_rows, gained, lifecycle_gains, lifecycle_totals

NOW = dt.datetime(2026, 11, 21, 3, 0, 0)


def test_contracts_follow_the_schemas() -> None:
    by_name = {s.name: s for s in suites(check_max=15)}
    for stream, schema in BRONZE.items():
        labels = {e.label for e in by_name[schema.name].expectations}
        assert {f"expect_column_values_to_not_be_null({c})" for c in schema.required} <= labels
        unique = "expect_column_values_to_be_unique" if len(schema.key) == 1 else "expect_compound_columns_to_be_unique"
        assert f"{unique}({'+'.join(schema.key) if len(schema.key) > 1 else schema.key[0]})" in labels, stream
    assert "expect_column_values_to_be_between(queue_offset)" in {e.label for e in by_name["half_events"].expectations}


@pytest.mark.spark
def test_changed_rows_are_the_rows_a_change_left_in_the_table(spark: SparkSession) -> None:
    table = spark.createDataFrame([("a", 1), ("a", 2), ("b", 3), ("c", 4)], "k string, v int")
    # A change feed: ("a", 2) added, ("c", 9) added and rewritten since to ("c", 4), ("d", 5) added and gone.
    changed = spark.createDataFrame([("a", 2), ("c", 9), ("c", 4), ("d", 5)], "k string, v int")
    keyed = sorted(tuple(r) for r in changed_rows(table, changed, ["k"]).collect())
    assert keyed == [("a", 1), ("a", 2), ("c", 4)]  # every row sharing a key, so ("a", 1) meets its duplicate
    # A few changed keys are broadcast, even where Spark would not choose to: the same rows, without a shuffle.
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        few, many = changed_rows(table, changed, ["k"], few=True), changed_rows(table, changed, ["k"])
        assert sorted(tuple(r) for r in few.collect()) == keyed
        plans = [df._jdf.queryExecution().executedPlan().toString() for df in (few, many)]
    finally:
        spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")
    assert "BroadcastHashJoin" in plans[0] and "BroadcastHashJoin" not in plans[1], plans
    assert sorted(tuple(r) for r in changed_rows(table, changed, []).collect()) == [("a", 2), ("c", 4)]


@pytest.mark.spark
def test_the_totals_gained_agree_per_transaction(spark: SparkSession) -> None:
    """Between two checks, each transaction's half copies and commits gained in bronze are those gained in
    silver, and new discard evidence leaves a discard in silver (looked up when its row did not change: a
    second discard); silver gains a discard only with new evidence. The offset commits agree in all."""
    bronze = "broker string, uniq_key string, topic string, sys_flag int, transactional boolean, _sign int"
    half = spark.createDataFrame([("b", "k1", "T", 0, None, 1), ("b", "k2", "T", 0, None, 1)], bronze)
    real = spark.createDataFrame(
        [("b", "k3", "T", 8, None, 1)] + [("b", k, DISCARD_TOPIC, 0, None, 1) for k in ("k4", "k5", "k6")], bronze
    ).withColumnRenamed("broker", "broker_name")
    half = half.withColumnRenamed("broker", "broker_name")
    life = "broker_name string, uniq_key string, copies int, commit_count int, discard_ts long, half_topic string"
    changes = spark.createDataFrame([
        ("b", "k1", 1, 0, None, "H", "insert", 3),
        ("b", "k3", 1, 0, None, "H", "update_preimage", 3), ("b", "k3", 1, 1, None, "H", "update_postimage", 3),
        ("b", "k4", 2, 0, None, "H", "update_preimage", 3), ("b", "k4", 2, 0, 50, "H", "update_postimage", 3),
        ("b", "k7", 3, 0, None, "H", "update_preimage", 3), ("b", "k7", 3, 0, 60, "H", "update_postimage", 3),
    ], f"{life}, _change_type string, _commit_version long")  # fmt: skip
    stored = spark.createDataFrame([("b", "k5", 2, 0, 40, "H"), ("b", "k6", 2, 0, None, "H")], life)
    offsets = spark.createDataFrame([(1,), (1,)], "_sign int")
    commits = spark.createDataFrame([("insert",)], "_change_type string")

    view = lifecycle_gains(stored, changes, commits, half, real, offsets, 100, 200)
    rows = {(r["check"], r["transaction"]): (r["bronze"], r["silver"], r["problem"]) for r in view.collect()}
    problems = {k: p for k, (_, _, p) in rows.items() if p is not None}
    assert set(problems) == {("half copies", "b/k2"), ("transactions with discard evidence", "b/k6"),
                             ("transactions with discard evidence", "b/k7"), ("offset commits", None)}  # fmt: skip
    assert problems[("half copies", "b/k2")] == "half copies of b/k2 gained from 100 to 200: 1 in bronze, 0 in silver"
    assert problems[("transactions with discard evidence", "b/k6")].endswith(
        "new discard evidence in bronze, no discard in silver"
    )
    assert problems[("transactions with discard evidence", "b/k7")].endswith("discarded in silver without new evidence")
    assert rows[("offset commits", None)][:2] == (2, 1)
    assert rows[("half copies", "b/k1")] == (1, 1, None) and rows[("commits", "b/k3")] == (1, 1, None)
    assert rows[("transactions with discard evidence", "b/k4")] == (1, 1, None)
    assert rows[("transactions with discard evidence", "b/k5")] == (1, 0, None)  # its second discard: looked up


@pytest.mark.spark
def test_the_version_validated_last_is_the_latest_runs_not_the_largest(spark: SparkSession, config: Config) -> None:
    """A table reconcile rebuilt (new columns) starts again from version 0: the largest version validated
    would then skip it, or validate it whole, until it caught up. The last row of quality_runs says; a
    warehouse an older version wrote has only dq_results, which then says the same."""
    rows = [("deliveries", NOW, 25, "dq-1"), ("deliveries", NOW + dt.timedelta(hours=1), 3, "dq-2"),
            ("group_findings", NOW, None, "dq-1")]  # fmt: skip
    spark.createDataFrame(rows, "suite string, validated_at timestamp, table_version long, run_id string"
                          ).createOrReplaceTempView("dq_old")  # fmt: skip
    runs_table = create_table(spark, config, QUALITY_RUNS, name="quality_runs_latest")
    expected = {"deliveries": ("dq-2", 3), "group_findings": ("dq-1", None)}
    assert recorded_validations(spark, runs_table) is None
    assert validations_in(spark, "dq_old") == expected
    held = {"as_of": 5, "tables": {"half": ["id", 2]}}
    runs = [
        ("dq-2", NOW, NOW, 1, 0, 0, "deliveries", json.dumps({"deliveries": ["dq-2", 3]}), json.dumps(held)),
        ("dq-3", NOW, NOW + dt.timedelta(hours=2), 1, 1, 0, "deliveries", json.dumps({"deliveries": ["dq-3", 0]}),
         None),
    ]  # fmt: skip
    spark.createDataFrame(runs, to_struct(QUALITY_RUNS)).write.insertInto(runs_table)
    assert recorded_validations(spark, runs_table) == ({"deliveries": ("dq-3", 0)}, None)  # the totals failed last
    spark.createDataFrame(runs[:1], to_struct(QUALITY_RUNS)).write.insertInto(runs_table, overwrite=True)
    assert recorded_validations(spark, runs_table) == ({"deliveries": ("dq-2", 3)}, held)


def _results(spark: SparkSession, cfg: Config, run_id: str) -> list[dict[str, Any]]:
    rows = spark.table(cfg.table("dq_results")).where(F.col("run_id") == run_id).collect()
    return [r.asDict() for r in rows]


def _failed(results: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["suite"], r["expectation"]): r for r in results if not r["success"]}


@pytest.mark.spark
def test_clean_data_passes_and_broken_data_fails(
    spark: SparkSession, config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(quality, "KEPT_RESULTS", 1)
    cfg = fresh_db(spark, config, "t_quality")
    make_landing(tmp_path / "landing", n=150, seed=4)
    ingest(spark, cfg, tmp_path / "landing", "run-1")
    reconcile(spark, cfg)

    clean = check_quality(spark, cfg, "dq-1", NOW)
    recorded = _results(spark, cfg, "dq-1")
    assert len(recorded) == len(clean.results) > 100
    assert [k for k, r in _failed(recorded).items()] == []
    assert {r["suite"] for r in recorded} == {s.name for s in suites(cfg.broker.check_max)}
    assert {r["scope"] for r in recorded} == {"full"}
    assert clean.docs.is_file() and "half_events" in clean.docs.read_text()

    # Nothing changed: nothing is validated again.
    again = check_quality(spark, cfg, "dq-2", NOW)
    assert again.results == [] and _results(spark, cfg, "dq-2") == []
    assert dict(again.skipped)["half_events"].startswith("unchanged since version")

    # Break the data straight in bronze: a second record under an existing half key, an op listing an
    # offset no half has, a negative consumer offset.
    half = spark.table(cfg.table("half_events"))
    committed = spark.table(cfg.table("real_events")).select(F.col("prepared_transaction_offset").alias("_p"))
    # A half no commit points at: the forged copy then breaks the key alone, not the commit references.
    uncommitted = half.join(committed, half["commit_log_offset"] == committed["_p"], "left_anti")
    victim = uncommitted.orderBy("queue_offset").limit(1).select(*half.columns)
    victim.withColumn("uniq_key", F.lit("FORGED")).write.insertInto(cfg.table("half_events"))
    op = spark.table(cfg.table("op_events"))
    top = op.agg(F.max("queue_offset")).collect()[0][0]
    stray = (
        op.orderBy("queue_offset")
        .limit(1)
        .withColumn("queue_offset", F.lit(top + 1))
        .withColumn("body", F.lit("987654,"))
    )
    stray.write.insertInto(cfg.table("op_events"))
    offset = spark.table(cfg.table("offset_events"))
    offset.limit(1).withColumn("offset", F.lit(-5)).withColumn("_record_hash", F.lit("forged")).write.insertInto(
        cfg.table("offset_events")
    )

    code = main(["quality", "--warehouse", cfg.warehouse, "--conf", str(_conf(tmp_path, cfg))])
    out = capsys.readouterr().out
    assert code == EXIT_BLOCKING
    run_id = re.search(r"quality (quality-\S+):", out).group(1)  # type: ignore[union-attr]
    broken = _results(spark, cfg, run_id)
    failed = _failed(broken)
    key_dup = failed[("half_events", "expect_compound_columns_to_be_unique(broker_name+topic+queue_id+queue_offset)")]
    assert key_dup["unexpected_count"] == 2 and key_dup["blocking"] and key_dup["scope"] == "incremental"
    assert key_dup["element_count"] == 2  # the forged row and the one it collides with, not the whole table
    negative = failed[("offset_events", "expect_column_values_to_be_between(offset)")]
    assert negative["unexpected_count"] == 1 and "-5" in negative["unexpected_sample"]
    dangling = failed[("op_references", "expect_column_values_to_be_null(problem)")]
    assert dangling["unexpected_count"] == 1 and "987654" in dangling["unexpected_sample"]
    assert not dangling["blocking"]
    assert set(failed) == {
        ("half_events", key_dup["expectation"]),
        ("offset_events", negative["expectation"]),
        ("op_references", dangling["expectation"]),
        ("lifecycle_totals", "expect_column_values_to_be_null(problem)"),  # bronze grew, silver did not
    }
    # Silver and gold did not change, so only bronze and the cross views ran; no commit arrived, so the
    # commit references were not checked again, and the op references only for the op that arrived; no
    # finding changed, so no group finding was checked.
    assert {r["suite"] for r in broken} == {"half_events", "op_events", "offset_events", "op_references",
                                            "lifecycle_totals"}  # fmt: skip
    assert dangling["element_count"] == 1 and dangling["scope"] == "incremental"
    assert "skipped commit_references: no new rows in real_events" in out
    assert "skipped group_findings: no new rows in anomalies" in out
    assert "FAILED  half_events" in out and "warning op_references" in out and "Data Docs:" in out

    # GE keeps the latest KEPT_RESULTS results per suite for Data Docs (dq_results keeps them all).
    gx = quality_dir(cfg) / "gx" / "uncommitted"
    kept = sorted(p.relative_to(gx / "validations") for p in (gx / "validations" / "half_events").rglob("*.json"))
    assert [p.parts[1] for p in kept] == [run_id]
    pages = (gx / "data_docs" / "local_site" / "validations" / "half_events").rglob("*.html")
    assert sorted(p.relative_to(gx / "data_docs" / "local_site" / "validations") for p in pages) == [
        k.with_suffix(".html") for k in kept
    ]
    index = clean.docs.read_text()
    assert f"validations/half_events/{run_id}/" in index and "validations/half_events/dq-1/" not in index


@pytest.mark.spark
def test_silver_and_gold_are_validated_by_what_changed(spark: SparkSession, config: Config, tmp_path: Path) -> None:
    """A merge's changes reach the suites through the tables' change feed: the rows it rewrote, and the
    rows sharing a key with them, are validated, not the whole table; a table no run changed is skipped."""
    cfg = fresh_db(spark, config, "t_quality_changes")
    make_landing(tmp_path / "landing", n=150, seed=4)
    ingest(spark, cfg, tmp_path / "landing", "run-1")
    reconcile(spark, cfg)
    check_quality(spark, cfg, "dq-changes-1", NOW)

    life, found = cfg.table("txn_lifecycle"), cfg.table("anomalies")
    victim, state_was = spark.table(life).orderBy("uniq_key").select("uniq_key", "state").first()  # type: ignore[misc]
    spark.sql(f"UPDATE {life} SET state = 'LIMBO' WHERE uniq_key = '{victim}'")
    # A second row under an existing anomaly_id, and a group finding without its group (the first is none).
    twin = spark.table(found).where(~F.col("anomaly_type").isin(*GROUP_FINDINGS)).orderBy("anomaly_id").limit(1)
    twin = twin.withColumn("anomaly_type", F.lit("STRANDED_QUEUE"))
    twin.withColumn("consumer_group", F.lit(None).cast("string")).write.insertInto(found)
    # A commit of a negative offset: offset_commits has no key, so its rows are looked for by their ranges.
    commits = cfg.table("offset_commits")
    spark.table(commits).limit(1).withColumn("offset", F.lit(-1).cast("long")).write.insertInto(commits)
    # A message landed twice, as an ingest that bypassed its key would store it: found among the files of its
    # store time, beside the one row before it.
    real = cfg.table("real_events")
    spark.table(real).orderBy("store_timestamp").limit(1).write.insertInto(real)

    check_quality(spark, cfg, "dq-changes-2", NOW)
    results = _results(spark, cfg, "dq-changes-2")
    assert {r["suite"] for r in results if r["layer"] in ("silver", "gold")} == {
        "txn_lifecycle", "anomalies", "offset_commits"
    }  # fmt: skip
    failed = _failed(results)
    state = failed[("txn_lifecycle", "expect_column_values_to_be_in_set(state)")]
    assert (state["scope"], state["element_count"], state["unexpected_count"]) == ("incremental", 1, 1)
    assert "LIMBO" in state["unexpected_sample"]
    twice = failed[("anomalies", "expect_column_values_to_be_unique(anomaly_id)")]
    assert (twice["scope"], twice["element_count"], twice["unexpected_count"]) == ("incremental", 2, 2)
    groupless = failed[("group_findings", "expect_column_values_to_be_null(problem)")]
    assert (groupless["scope"], groupless["element_count"], groupless["unexpected_count"]) == ("incremental", 1, 1)
    assert "no consumer group" in groupless["unexpected_sample"]
    negative = failed[("offset_commits", "expect_column_values_to_be_between(offset)")]
    assert (negative["scope"], negative["element_count"], negative["unexpected_count"]) == ("incremental", 1, 1)
    landed = failed[("real_events", "expect_compound_columns_to_be_unique(broker_name+topic+queue_id+queue_offset)")]
    assert (landed["scope"], landed["element_count"], landed["unexpected_count"]) == ("incremental", 2, 2)
    assert {k[0] for k in failed} - {"lifecycle_totals"} == {"txn_lifecycle", "anomalies", "group_findings",
                                                             "offset_commits", "real_events"}  # fmt: skip
    # Each run records what every suite was validated by last; the dashboard shows those runs' results.
    runs = spark.table(cfg.table("quality_runs")).orderBy("finished_at").collect()
    assert [r["run_id"] for r in runs] == ["dq-changes-1", "dq-changes-2"]
    latest = json.loads(runs[-1]["latest"])
    assert latest["txn_lifecycle"][0] == latest["anomalies"][0] == "dq-changes-2"
    assert latest["half_events"][0] == latest["deliveries"][0] == "dq-changes-1"
    shown = gather_quality(spark, cfg)["dq_latest"]
    assert {(r["suite"], r["run_id"]) for r in shown} == {(suite, run) for suite, (run, _) in latest.items()}
    assert len(shown) == len({(r["suite"], r["expectation"]) for r in shown}) > 100
    assert ("txn_lifecycle", "expect_column_values_to_be_in_set(state)", False) in {
        (r["suite"], r["expectation"], r["success"]) for r in shown
    }
    # A warehouse an older version wrote has no quality_runs: its first run, with nothing to validate, records
    # what dq_results says, and the dashboard shows the same.
    spark.sql(f"DROP TABLE {cfg.table('quality_runs')}")
    check_quality(spark, cfg, "dq-changes-upgraded", NOW)
    [upgraded] = spark.table(cfg.table("quality_runs")).collect()
    assert (json.loads(upgraded["latest"]), upgraded["expectations"]) == (latest, 0)
    assert gather_quality(spark, cfg)["dq_latest"] == shown

    # A table that kept no change data (one made by an older version) is validated whole.
    spark.sql(f"ALTER TABLE {life} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')")
    spark.sql(f"UPDATE {life} SET state = '{state_was}' WHERE uniq_key = '{victim}'")
    check_quality(spark, cfg, "dq-changes-3", NOW)
    whole = [r for r in _results(spark, cfg, "dq-changes-3") if r["suite"] == "txn_lifecycle"]
    assert {r["scope"] for r in whole} == {"full"} and all(r["success"] for r in whole)
    states = next(r for r in whole if r["expectation"] == "expect_column_values_to_be_in_set(state)")
    assert states["element_count"] == spark.table(life).count()
    # The dashboard read the tables above; what this process showed then and appended since is what it shows
    # now, without a Spark job (a service's dashboard after its quality run, every cycle): as the tables say.
    before = jobs_started(spark)
    known = gather_quality(spark, cfg)
    assert jobs_started(spark) == before
    tables = (cfg.table("dq_results"), cfg.table("quality_runs"))
    read = read_latest_results(spark, *tables)
    assert (known["dq_latest"], known["dq_runs"]) == (read.latest, read.runs)
    assert [r["run_id"] for r in known["dq_runs"]] == ["dq-changes-3", "dq-changes-upgraded"]
    assert {r["run_id"] for r in known["dq_latest"] if r["suite"] == "txn_lifecycle"} == {"dq-changes-3"}


@pytest.mark.spark
def test_what_a_count_gained_after_one_that_saw_every_row_is_its_change_feed(
    spark: SparkSession, config: Config
) -> None:
    """A count up to 100 at a version that held no row after 100 (`saw_all`): what a count up to 200 now gained,
    a late row at or before 100, one after it, and one taken away, is the change feed's alone, as the table
    and the change feed together say."""
    table = fresh_db(spark, config, "t_quality_gained").table("gains")
    spark.sql(f"CREATE TABLE {table} (k STRING, t LONG) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    rows = "k string, t long"
    spark.createDataFrame([("a", 50), ("b", 90)], rows).write.insertInto(table)
    counted = table_version(spark, table)
    spark.createDataFrame([("c", 150), ("d", 250), ("e", 80)], rows).write.insertInto(table)
    spark.sql(f"DELETE FROM {table} WHERE k = 'a'")
    changes = (
        spark.read.option("readChangeFeed", "true").option("startingVersion", counted + 1)
        .option("endingVersion", table_version(spark, table)).table(table)
    )  # fmt: skip

    def found(saw_all: bool) -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in gained(spark.table(table), changes, "t", 100, 200, saw_all).collect())

    assert found(True) == found(False) == [("a", 50, -1), ("c", 150, 1), ("e", 80, 1)]


@pytest.mark.spark
def test_the_totals_are_checked_from_where_they_last_held(spark: SparkSession, config: Config, tmp_path: Path) -> None:
    """lifecycle_totals reads what changed since the run they last held at: what reconcile added after its
    as_of, found as the whole tables find it; a transaction silver lost count of is named. After a failure
    (or with no such run) the tables are read whole."""
    cfg = fresh_db(spark, config, "t_quality_totals")
    make_landing(tmp_path / "landing", n=150, seed=6)
    ingest(spark, cfg, tmp_path / "landing", "run-1")
    first, last = spark.table(cfg.table("half_events")).agg(F.min("store_timestamp"), F.max("store_timestamp")).first()  # type: ignore[misc]
    reconcile(spark, cfg, as_of=(first + last) // 2)
    check_quality(spark, cfg, "dq-totals-1", NOW)

    def totals(run_id: str) -> tuple[str, int, bool]:
        [r] = [r for r in _results(spark, cfg, run_id) if r["suite"] == "lifecycle_totals"]
        return r["scope"], r["element_count"], r["success"]

    def held() -> Any:
        last_run = spark.table(cfg.table("quality_runs")).orderBy(F.desc("finished_at")).first()
        return json.loads(last_run["totals"]) if last_run["totals"] else None  # type: ignore[index]

    assert totals("dq-totals-1") == ("full", 5, True) and held()["as_of"] == (first + last) // 2
    assert held()["saw_all"] is False  # bronze holds events after that as_of
    reconcile(spark, cfg)
    check_quality(spark, cfg, "dq-totals-2", NOW)
    scope, gains, ok = totals("dq-totals-2")
    assert (scope, ok) == ("incremental", True) and gains > 5  # a row per count a transaction gained, and more
    assert held()["saw_all"] is True  # as of the latest event: the next check reads bronze's change feed alone
    t = {n: spark.table(cfg.table(n)) for n in ("txn_lifecycle", "offset_commits", "half_events", "real_events",
                                                "offset_events")}  # fmt: skip
    whole = lifecycle_totals(t["txn_lifecycle"], t["offset_commits"], t["half_events"], t["real_events"],
                             t["offset_events"], held()["as_of"])  # fmt: skip
    assert whole.where(F.col("problem").isNotNull()).count() == 0

    # Silver loses count of one transaction's copy.
    life = cfg.table("txn_lifecycle")
    victim = spark.table(life).where("copies > 1").orderBy("uniq_key").first()["uniq_key"]  # type: ignore[index]
    spark.sql(f"UPDATE {life} SET copies = copies - 1 WHERE uniq_key = '{victim}'")
    check_quality(spark, cfg, "dq-totals-3", NOW)
    [failed] = _failed(_results(spark, cfg, "dq-totals-3")).values()
    assert (failed["suite"], failed["scope"], failed["unexpected_count"]) == ("lifecycle_totals", "incremental", 1)
    assert "half copies of " in failed["unexpected_sample"] and victim in failed["unexpected_sample"]
    assert held() is None
    spark.sql(f"UPDATE {life} SET copies = copies + 1 WHERE uniq_key = '{victim}'")
    check_quality(spark, cfg, "dq-totals-4", NOW)
    assert totals("dq-totals-4") == ("full", 5, True) and held() is not None


@pytest.mark.spark
def test_the_driver_and_spark_give_a_batch_the_same_results(
    spark: SparkSession, config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A small batch is validated by GE's pandas engine in the driver, a large one in Spark: the same rows get
    the same verdict, count and sample from each (pandas holds a nullable int as a float, a null as NaN)."""
    cfg = fresh_db(spark, config, "t_quality_engines")
    make_landing(tmp_path / "landing", n=40, seed=9)
    ingest(spark, cfg, tmp_path / "landing", "run-1")
    half = spark.table(cfg.table("half_events")).orderBy("queue_offset")
    first = half.limit(3).collect()
    broken = spark.createDataFrame([
        first[0].asDict() | {"uniq_key": "FORGED"},  # a second row under the first one's key
        first[1].asDict() | {"queue_offset": -1},
        first[2].asDict() | {"queue_offset": 10**9, "check_times": 99},
    ], half.schema)  # fmt: skip
    suite = next(s for s in suites(cfg.broker.check_max) if s.name == "half_events")
    batch = Batch(suite, half.unionByName(broken), None, "incremental")

    caplog.set_level(logging.INFO, logger="jobs.quality")
    in_driver = _validate(quality_dir(cfg), batch, _local(batch), "engines-1", NOW, ())
    monkeypatch.setattr(quality, "DRIVER_ROWS", -1)
    in_spark = _validate(quality_dir(cfg), batch, _local(batch), "engines-2", NOW, ())
    assert "rows in the driver" in caplog.text and "rows in Spark" in caplog.text

    def verdicts(rows: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
        def key(value: Any) -> str:
            return json.dumps(value, sort_keys=True)

        return {
            r["expectation"]: (r["success"], r["element_count"], r["unexpected_count"],
                               sorted(json.loads(r["unexpected_sample"] or "[]"), key=key))
            for r in rows
        }  # fmt: skip

    assert verdicts(in_driver) == verdicts(in_spark)
    failed = {k: v for k, v in verdicts(in_driver).items() if not v[0]}
    assert failed["expect_column_values_to_be_between(check_times)"][2:] == (1, [99])
    assert failed["expect_column_values_to_be_between(queue_offset)"][2:] == (1, [-1])
    assert failed["expect_compound_columns_to_be_unique(broker_name+topic+queue_id+queue_offset)"][2] == 2
    assert len(failed) == 3


def _conf(tmp_path: Path, cfg: Config) -> Path:
    path = tmp_path / "db.yaml"
    path.write_text(f"database: {cfg.database}\n")
    return path


@pytest.mark.spark
def test_op_bodies_of_any_length_pass_ingest_and_the_op_suite(
    spark: SparkSession, config: Config, tmp_path: Path
) -> None:
    """Java's regex engine recursed once per offset of "[0-9]+(,[0-9]+)*": a body of 80,000 characters
    overflowed an executor's stack and took the JVM down. Ingest's check and the suite must hold for any
    body the contract allows, and still catch one it does not."""
    cfg = fresh_db(spark, config, "t_quality_op_body")
    landing = tmp_path / "landing"
    (landing / "op").mkdir(parents=True)
    longest = "".join(f"{n}," for n in range(100_000))  # 588,890 characters
    bodies = [longest, "17", "17,18,20,", "0,", "", ",", "17,,18", "a", "17;18", "-1", "1,2,,"]
    lines = [json.dumps(op_record(n, body)) + "\n" for n, body in enumerate(bodies)]
    (landing / "op" / "ops.jsonl").write_text("".join(lines))

    tallies = ingest(spark, cfg, landing, "run-bodies")
    assert (tallies["op"].inserted, tallies["op"].quarantined) == (4, 7)
    stored = [r["body"] for r in spark.table(cfg.table("op_events")).orderBy("queue_offset").collect()]
    assert stored == bodies[:4]
    quarantined = {r["raw"] for r in spark.table(cfg.table("quarantine")).collect()}
    assert {json.loads(raw)["body"] for raw in quarantined} == set(bodies[4:])

    # The suite's own check, on bronze as it is and after a body with an empty item is forced into it.
    passed = check_quality(spark, cfg, "dq-bodies-1", NOW)
    assert not [r for r in passed.failures if r["suite"] == "op_events"]
    _op_row(spark, cfg, 20, "5,,6")
    failed = check_quality(spark, cfg, "dq-bodies-2", NOW)
    [empty_item] = [r for r in failed.failures if r["suite"] == "op_events"]
    assert empty_item["expectation"] == "expect_column_values_to_not_match_regex(body)"
    assert empty_item["unexpected_count"] == 1 and "5,,6" in empty_item["unexpected_sample"]


def _op_row(spark: SparkSession, cfg: Config, offset: int, body: str) -> None:
    """Write an op record straight into bronze, past ingest's check."""
    row = spark.table(cfg.table("op_events")).limit(1)
    row.withColumn("queue_offset", F.lit(offset)).withColumn("body", F.lit(body)).withColumn(
        "_record_hash", F.lit("forged")
    ).write.insertInto(cfg.table("op_events"))
