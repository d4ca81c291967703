"""Real Delta tables through the session factory: create from a schema constant, append, time travel."""

from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from jobs.catalog import (
    appended,
    change_ranges,
    compact,
    create_table,
    ensure_view,
    history,
    latest_row,
    latest_rows,
    may_have_rows,
    table_exists,
    table_schema,
    table_version,
)
from jobs.config import Config
from jobs.session import jobs_started
from schemas import OFFSET
from schemas.spark import to_struct
from transforms.frames import ranges

pytestmark = pytest.mark.spark

ROWS = [
    ("broker-a", "g1", "orders", 0, 100, 1_700_000_000_000, "10.0.0.1@1", 0),
    ("broker-a", "g1", "orders", 0, 40, 1_700_000_000_500, None, None),  # optional fields null
]


def test_session_is_local_delta_and_offline(spark: SparkSession, config: Config) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.master") == "local[2]"
    assert conf.get("spark.ui.enabled") == "false"
    assert conf.get("spark.jars.packages", None) is None  # nothing is resolved at start-up
    jars = (conf.get("spark.jars") or "").split(",")
    assert {j.rsplit("/", 1)[1] for j in jars} == {"delta-spark_4.1_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"}
    assert conf.get("spark.sql.catalogImplementation") == "hive"
    assert f"databaseName={config.warehouse}/metastore_db" in (
        conf.get("spark.hadoop.javax.jdo.option.ConnectionURL") or ""
    )
    assert spark.catalog.databaseExists(config.database)


def test_create_append_read_and_time_travel(spark: SparkSession, config: Config) -> None:
    name = create_table(
        spark, config, OFFSET, name="offset_roundtrip", properties={"delta.enableChangeDataFeed": "true"}
    )
    assert name == "txn_recon.offset_roundtrip"
    # Creating again is a no-op, not an error.
    create_table(spark, config, OFFSET, name="offset_roundtrip")

    detail = spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]
    assert detail["format"] == "delta"
    assert detail["properties"]["delta.enableChangeDataFeed"] == "true"
    table_schema = spark.table(name).schema
    assert [(f.name, f.dataType, f.nullable) for f in table_schema] == [
        (f.name, f.dataType, f.nullable) for f in to_struct(OFFSET)
    ]

    assert table_version(spark, name) == 0
    spark.createDataFrame(ROWS, to_struct(OFFSET)).write.format("delta").mode("append").saveAsTable(name)
    assert table_version(spark, name) == 1

    back = sorted(tuple(r) for r in spark.table(name).collect())
    assert back == sorted(ROWS)
    assert spark.read.option("versionAsOf", 0).table(name).count() == 0
    assert spark.sql(f"SELECT count(*) FROM {name} VERSION AS OF 1").collect()[0][0] == 2
    history = [r["operation"] for r in spark.sql(f"DESCRIBE HISTORY {name}").orderBy("version").collect()]
    assert history == ["CREATE TABLE", "WRITE"]
    listed = spark.sql(f"SHOW TABLES IN {config.database}").where("tableName = 'offset_roundtrip'").count()
    assert listed == 1


def test_compaction_joins_small_files_and_keeps_every_row(spark: SparkSession, config: Config) -> None:
    name = create_table(spark, config, OFFSET, name="offset_compacted")
    for row in [*ROWS, *ROWS]:  # four appends: four small files
        spark.createDataFrame([row], to_struct(OFFSET)).writeTo(name).append()
    before = sorted(spark.table(name).collect())
    assert compact(spark, name) == (4, 1)
    assert sorted(spark.table(name).collect()) == before
    assert spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first()["operation"] == "OPTIMIZE"  # type: ignore[index]
    assert compact(spark, name) == (0, 0)  # one file left: nothing to join
    # The session's own setting is left as it was.
    assert spark.conf.get("spark.databricks.delta.optimize.minFileSize", None) is None


def test_not_null_column_rejects_a_null(spark: SparkSession, config: Config) -> None:
    name = create_table(spark, config, OFFSET, name="offset_not_null")
    bad = spark.sql(
        "SELECT 'b' AS broker_name, 'g' AS consumer_group, 't' AS topic, 0 AS queue_id, "
        "CAST(NULL AS BIGINT) AS offset, 1L AS commit_timestamp, "
        "CAST(NULL AS STRING) AS client_id, CAST(NULL AS BIGINT) AS seq"
    )
    with pytest.raises(Exception, match=r"DELTA_NOT_NULL_CONSTRAINT_VIOLATED|NOT NULL"):
        bad.write.format("delta").mode("append").saveAsTable(name)
    assert spark.table(name).count() == 0


def test_unknown_table_is_one_line_and_exit_2(
    spark: SparkSession, config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    from jobs.cli import main

    code = main(["sql", "--warehouse", config.warehouse, "SELECT * FROM txn_recon.nope"])
    err = capsys.readouterr().err
    assert code == 2
    errors = [ln for ln in err.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("txn-recon sql: error: [TABLE_OR_VIEW_NOT_FOUND]")


def test_a_table_without_rows_is_told_apart_without_a_spark_job(spark: SparkSession, config: Config) -> None:
    from jobs.reconcile import _pinned

    name = create_table(spark, config, OFFSET, name="offset_emptiness")
    before = jobs_started(spark)
    assert not may_have_rows(spark, name) and not may_have_rows(spark, name, 0)
    assert jobs_started(spark) == before
    assert _pinned(spark, name, 0).collect() == []
    spark.createDataFrame(ROWS, to_struct(OFFSET)).write.format("delta").mode("append").saveAsTable(name)
    assert may_have_rows(spark, name)
    assert may_have_rows(spark, name, 0)  # not the current version: its checksum is not at hand, so maybe
    assert sorted(tuple(r) for r in _pinned(spark, name, 1).collect()) == sorted(ROWS)
    spark.sql(f"DELETE FROM {name}")
    assert _pinned(spark, name, table_version(spark, name)).collect() == []


def test_the_latest_row_is_read_once_per_version(spark: SparkSession, config: Config, tmp_path: Path) -> None:
    """A run table's latest row is queried when the table is at a version not seen before, and known without a
    Spark job when it is as it was last read, or as `appended` left it; a table made again is read again."""
    name = create_table(spark, config, OFFSET, name="offset_latest")
    order = "commit_timestamp"
    assert latest_row(spark, name, order) is None
    spark.createDataFrame(ROWS, to_struct(OFFSET)).write.insertInto(name)
    before = jobs_started(spark)
    assert tuple(latest_row(spark, name, order) or ()) == ROWS[1]  # the greater commit_timestamp
    read = jobs_started(spark)
    assert read > before
    assert tuple(latest_row(spark, name, order) or ()) == ROWS[1] and jobs_started(spark) == read
    newer = (*ROWS[0][:5], ROWS[1][5] + 1, *ROWS[0][6:])
    spark.createDataFrame([newer], to_struct(OFFSET)).write.insertInto(name)
    appended(spark, name, [Row(**dict(zip(OFFSET.names, newer, strict=True)))], order)
    noted = jobs_started(spark)
    assert tuple(latest_row(spark, name, order) or ()) == newer and jobs_started(spark) == noted
    spark.createDataFrame([ROWS[0]], to_struct(OFFSET)).write.insertInto(name)  # written elsewhere: read again
    assert tuple(latest_row(spark, name, order) or ()) == newer and jobs_started(spark) > noted
    assert table_version(spark, name) == 3
    saved = tmp_path / "saved"  # the table's folder copied back to a version read, then written again
    folder = location(spark, name)
    shutil.copytree(folder, saved)
    appended_row = (*ROWS[0][:5], ROWS[1][5] + 2, *ROWS[0][6:])
    spark.createDataFrame([appended_row], to_struct(OFFSET)).write.insertInto(name)
    appended(spark, name, [Row(**dict(zip(OFFSET.names, appended_row, strict=True)))], order)
    shutil.rmtree(folder)
    shutil.copytree(saved, folder)
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # type: ignore[union-attr]
    spark.createDataFrame([ROWS[0]], to_struct(OFFSET)).write.insertInto(name)
    assert table_version(spark, name) == 4
    assert tuple(latest_row(spark, name, order) or ()) == newer
    spark.sql(f"DROP TABLE {name}")
    create_table(spark, config, OFFSET, name="offset_latest")  # made again, to the version last read
    for _ in range(table_version(spark, name), 4):
        spark.createDataFrame([ROWS[0]], to_struct(OFFSET)).write.insertInto(name)
    assert tuple(latest_row(spark, name, order) or ()) == ROWS[0]


def test_the_latest_rows_stay_known_behind_a_row_appended(spark: SparkSession, config: Config) -> None:
    """The latest rows read once are known, without a Spark job, with each row this process appends at the next
    commit in front of them; fewer asked for are known too, and more only when the table held fewer."""
    name = create_table(spark, config, OFFSET, name="offset_recent")
    order = "commit_timestamp"

    def row(i: int) -> tuple[Any, ...]:
        return (*ROWS[0][:5], ROWS[0][5] + i, *ROWS[0][6:])

    spark.createDataFrame([row(i) for i in range(3)], to_struct(OFFSET)).write.insertInto(name)
    assert [r[order] for r in latest_rows(spark, name, order, 5)] == [row(i)[5] for i in (2, 1, 0)]  # all it holds
    for i in (3, 4, 5):
        spark.createDataFrame([row(i)], to_struct(OFFSET)).write.insertInto(name)
        appended(spark, name, [Row(**dict(zip(OFFSET.names, row(i), strict=True)))], order)
    known = jobs_started(spark)
    assert [r[order] for r in latest_rows(spark, name, order, 5)] == [row(i)[5] for i in (5, 4, 3, 2, 1)]
    assert tuple(latest_row(spark, name, order) or ()) == row(5) and jobs_started(spark) == known
    assert [r[order] for r in latest_rows(spark, name, order, 6)] == [row(i)[5] for i in (5, 4, 3, 2, 1, 0)]
    assert jobs_started(spark) > known  # six asked of the five known: read again
    spark.createDataFrame([row(7)], to_struct(OFFSET)).write.insertInto(name)  # written elsewhere
    spark.createDataFrame([row(6)], to_struct(OFFSET)).write.insertInto(name)
    appended(spark, name, [Row(**dict(zip(OFFSET.names, row(6), strict=True)))], order)  # two commits after
    again = jobs_started(spark)
    assert [r[order] for r in latest_rows(spark, name, order, 2)] == [row(i)[5] for i in (7, 6)]
    assert jobs_started(spark) > again


def test_history_is_what_describe_history_says(spark: SparkSession, config: Config) -> None:
    name = create_table(spark, config, OFFSET, name="offset_history")
    df = spark.createDataFrame(ROWS, to_struct(OFFSET))
    df.write.insertInto(name)
    df.write.insertInto(name, overwrite=True)
    spark.sql(f"OPTIMIZE {name}")
    described = spark.sql(f"DESCRIBE HISTORY {name}").select("version", "operation", "operationParameters")
    for since in range(-1, 4):
        expected = [r.asDict() for r in described.where(F.col("version") > since).collect()]
        before = jobs_started(spark)
        assert history(spark, name, since) == expected
        assert jobs_started(spark) == before  # read from the commit files in the driver
    assert [h["operation"] for h in history(spark, name, 0)] == ["OPTIMIZE", "WRITE", "WRITE"]
    # A commit whose file the log's cleanup removed (its state kept by a checkpoint) is told as unknown.
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location(spark, name))  # type: ignore[union-attr]
    log.checkpoint()
    (Path(location(spark, name)) / "_delta_log" / f"{1:020d}.json").unlink()
    assert [h["operation"] for h in history(spark, name, 0)] == ["OPTIMIZE", "WRITE", None]


def test_the_ranges_of_a_change_are_read_from_its_files_statistics(spark: SparkSession, config: Config) -> None:
    """What a change set's lookup is bounded by, from the log's statistics of the files the commits added: the
    changed rows' own ranges when the files hold only them, a file's ranges around a row a merge rewrote,
    nothing from a compaction; no Spark job."""
    stats = ("broker_name", "queue_id", "offset", "commit_timestamp", "seq")
    name = create_table(spark, config, OFFSET, name="offset_ranges", stats_columns=stats,
                        properties={"delta.enableChangeDataFeed": "true"})  # fmt: skip
    later = [("broker-b", "g1", "orders", 3, 7, 1_700_000_009_000, None, None),
             ("broker-a", "g2", "orders", 1, 900, 1_700_000_001_000, "10.0.0.2@1", None)]  # fmt: skip
    for rows in (ROWS, later):  # versions 1 and 2, a file each
        spark.createDataFrame(rows, to_struct(OFFSET)).coalesce(1).write.insertInto(name)
    columns = [*stats, "client_id", "topic"]  # the last two without statistics: left out

    def feed(since: int, version: int) -> DataFrame:
        return (spark.read.option("readChangeFeed", "true").option("startingVersion", since + 1)
                .option("endingVersion", version).table(name).where("_change_type != 'update_preimage'"))  # fmt: skip

    before = jobs_started(spark)
    both, one = change_ranges(spark, name, 0, 2, columns), change_ranges(spark, name, 1, 2, columns)
    assert jobs_started(spark) == before
    assert both == (ranges(feed(0, 2), stats), 4)
    assert one == (ranges(feed(1, 2), stats), 2)
    assert one[0]["seq"] == (None, None)  # no value among the changed rows: nothing can share one
    # A merge rewrites the file of the row it updates: the ranges hold that row, within the file's.
    spark.sql(f"UPDATE {name} SET offset = 5 WHERE consumer_group = 'g2'")
    found = change_ranges(spark, name, 2, 3, columns)
    assert found is not None and found[1] == 2
    updated = feed(2, 3).where("_change_type = 'update_postimage'").first()
    assert updated is not None
    assert all(lo <= updated[c] <= hi for c, (lo, hi) in found[0].items() if updated[c] is not None)
    assert found[0] == ranges(spark.table(name).where("broker_name = 'broker-b' OR consumer_group = 'g2'"), stats)
    # A compaction changes no row: no range (a lookup within them finds nothing), no row.
    compact(spark, name)
    assert change_ranges(spark, name, 3, 4, columns) == ({c: (None, None) for c in columns}, 0)
    assert change_ranges(spark, name, 1, 4, columns) == ({**one[0], "offset": (5, 900)}, 4)
    # Not known: up to a version before the current one, across a commit gone from the log (its state kept by
    # a checkpoint), or across a change of the table's properties (there, no change data was recorded).
    assert change_ranges(spark, name, 1, 2, columns) is None
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location(spark, name)).checkpoint()  # type: ignore[union-attr]
    (Path(location(spark, name)) / "_delta_log" / f"{1:020d}.json").unlink()
    assert change_ranges(spark, name, 0, 4, columns) is None
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')")
    spark.createDataFrame(ROWS, to_struct(OFFSET)).write.insertInto(name)
    assert change_ranges(spark, name, 5, 6, columns) is None


def test_the_catalog_is_asked_as_spark_asks_it(spark: SparkSession, config: Config) -> None:
    """`table_exists` and `table_schema` answer as `spark.catalog` and a query on the table do, for permanent
    tables and views."""
    name = create_table(spark, config, OFFSET, name="offset_asked")
    view = config.table("offset_asked_view")
    spark.sql(f"CREATE OR REPLACE VIEW {view} AS SELECT consumer_group FROM {name}")
    missing = (config.table("offset_never"), "no_such_database.offset_asked")
    for table in (name, view, *missing):
        assert table_exists(spark, table) == spark.catalog.tableExists(table) == (table in (name, view))
    columns = table_schema(spark, name)
    assert columns == spark.table(name).schema and tuple(columns.names) == OFFSET.names
    spark.sql(f"ALTER TABLE {name} ADD COLUMNS (added string)")
    columns = table_schema(spark, name)
    assert columns == spark.table(name).schema and tuple(columns.names) == (*OFFSET.names, "added")


def test_a_view_is_replaced_only_when_its_query_changed(
    spark: SparkSession, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = create_table(spark, config, OFFSET, name="offset_viewed")
    view = config.table("offset_groups")
    statements: list[str] = []
    run = spark.sql

    def recorded(text: str, *args: Any, **kwargs: Any) -> DataFrame:
        statements.append(text)
        return run(text, *args, **kwargs)

    monkeypatch.setattr(spark, "sql", recorded)
    query = f"""SELECT consumer_group
        FROM {name}"""
    ensure_view(spark, view, query)
    ensure_view(spark, view, query)  # as it was: left alone
    assert len(statements) == 1 and spark.table(view).columns == ["consumer_group"]
    ensure_view(spark, view, f"SELECT consumer_group, topic FROM {name}")
    assert len(statements) == 2 and spark.table(view).columns == ["consumer_group", "topic"]


def test_the_proxies_py4j_keeps_in_cycles_are_released(spark: SparkSession) -> None:
    """A proxy of a JVM object whose method was called refers to itself through that method's proxy: only
    Python's cyclic collector frees it, and with it the JVM object, and `release_java_objects` runs it."""
    from jobs.session import release_java_objects

    gc.disable()  # so that nothing but the release frees the proxy
    try:
        jdf = spark.range(3)._jdf
        assert jdf.count() == 3
        proxy = weakref.ref(jdf)
        del jdf
        assert proxy() is not None, "no longer held in a cycle: the release is not needed"
        release_java_objects()
        assert proxy() is None
    finally:
        gc.enable()


def location(spark: SparkSession, table: str) -> str:
    return spark.sql(f"DESCRIBE DETAIL {table}").first()["location"].removeprefix("file:")  # type: ignore[index]
