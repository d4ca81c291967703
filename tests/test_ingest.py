"""Ingest on real Delta tables: counts, idempotency, incremental files, bad input, out of order."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import itertools
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

import jobs.ingest as ingest_job
from broker.landing import LandingWriter
from broker.profiles import PROFILES
from broker.simulation import simulate
from jobs.catalog import create_table
from jobs.cli import main
from jobs.config import Config
from jobs.ingest import Tally, ingest_landing
from jobs.reconcile import latest_event
from jobs.session import jobs_started
from schemas import LANDING
from schemas.bronze import BOOKKEEPING, EVENT_TIME, INGEST_FILES
from schemas.landing import HALF, HALF_TOPIC, ROCKSDB_HALF_TOPIC
from schemas.model import Schema
from schemas.spark import to_struct
from sources.collector import BrokerRun, write_runs
from tests.fuzz import apply, random_edits

pytestmark = pytest.mark.spark
NOW = dt.datetime(2026, 11, 20, 12, 0, 0)


def make_landing(
    out: Path, n: int = 120, seed: int = 1, fmt: str = "jsonl", per_file: int = 400, drain_ms: int = 360_000
) -> dict[str, Any]:
    writer = LandingWriter(out, fmt, per_file)
    profile = dataclasses.replace(PROFILES["chaos"], txn_per_second=20.0, drain_ms=drain_ms)
    summary = simulate(n, seed, profile, writer)
    writer.close(summary, {})
    meta: dict[str, Any] = json.loads((out / "_truth/meta.json").read_text())
    return meta


def fresh_db(spark: SparkSession, config: Config, name: str) -> Config:
    cfg = dataclasses.replace(config, database=name)
    spark.sql(f"DROP DATABASE IF EXISTS {name} CASCADE")
    spark.sql(f"CREATE DATABASE {name}")
    return cfg


def ingest(spark: SparkSession, cfg: Config, landing: Path, run: str) -> dict[str, Tally]:
    tallies = ingest_landing(spark, cfg, landing, run, NOW)
    for t in tallies.values():
        assert t.read == t.inserted + t.duplicates + t.quarantined
    return tallies


def rows(spark: SparkSession, cfg: Config, stream: str) -> list[dict[str, Any]]:
    """A bronze table's records as landed: null fields left out, and so is a field that holds its default
    (test_a_field_added_later_keeps_old_records_repeatable asserts that bronze stores it)."""
    df = spark.table(cfg.table(f"{stream}_events")).select(*LANDING[stream].names)
    defaults = LANDING[stream].defaults
    return sorted(({k: v for k, v in r.asDict().items() if v is not None and v != defaults.get(k)}
                   for r in df.collect()), key=json.dumps)  # fmt: skip


def landed(folder: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]
    return sorted(lines, key=json.dumps)


def version(spark: SparkSession, cfg: Config, table: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {cfg.table(table)}").agg(F.max("version")).collect()[0][0])


def files_of(spark: SparkSession, table: str, column: str | Column) -> list[Any]:
    """Per file of `table`: its rows ("n") and the least and greatest `column` ("first", "last"), ordered by
    the least (a file whose `column` is null throughout first)."""
    per_file = spark.table(table).groupBy(F.input_file_name())
    stats = per_file.agg(F.count(F.lit(1)).alias("n"), F.min(column).alias("first"), F.max(column).alias("last"))
    return stats.orderBy(F.col("first").asc_nulls_first()).collect()


def test_end_to_end_incremental_and_idempotent(
    spark: SparkSession, config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = fresh_db(spark, config, "t_ingest_e2e")
    landing = tmp_path / "landing"
    meta = make_landing(landing)
    monkeypatch.setattr(ingest_job, "FILE_ROWS", 40)

    first = ingest(spark, cfg, landing, "run-1")
    for stream in LANDING:
        assert first[stream].inserted == meta["records"][stream] > 0
        assert first[stream].files == meta["files"][stream]
        assert rows(spark, cfg, stream) == landed(landing / stream)
    # A batch (here one landing file, one task) is written in files of at most FILE_ROWS rows that do not
    # overlap in (broker, store time): a lookup of a stretch of time reads the files that hold it.
    files = files_of(spark, cfg.table("real_events"), F.struct("broker_name", "store_timestamp"))
    assert meta["files"]["real"] == 1 and len(files) == -(-meta["records"]["real"] // 40) > 1
    assert all(f["n"] <= 40 for f in files) and all(a["last"] <= b["first"] for a, b in itertools.pairwise(files))
    bronze = spark.table(cfg.table("half_events"))
    assert bronze.where("_run_id != 'run-1' OR _source_file NOT LIKE '%/half/part-%.jsonl'").count() == 0
    # Each file records the latest event of its batch, so the default as_of is read from one small table.
    latest = {s: max(r[EVENT_TIME[s]] for r in landed(landing / s)) for s in LANDING}
    recorded = spark.table(cfg.table("ingest_files")).groupBy("stream").agg(F.max("events_until")).collect()
    assert dict(map(tuple, recorded)) == latest

    # Again: nothing new, no bronze commit. What this process recorded it knows: the one Spark job is the run's
    # row in ingest_runs, no lookup of ingest_files.
    versions = {s: version(spark, cfg, f"{s}_events") for s in LANDING}
    jobs_before = jobs_started(spark)
    again = ingest(spark, cfg, landing, "run-2")
    assert jobs_started(spark) - jobs_before == 1
    assert all(t.files == 0 and t.read == 0 for t in again.values())
    assert {s: version(spark, cfg, f"{s}_events") for s in LANDING} == versions
    # A file that another writer recorded since is looked up in the table, not taken for new.
    other = landing / "half" / "x-elsewhere.jsonl"
    other.write_text(json.dumps(landed(landing / "half")[-1]) + "\n")
    stat = other.stat()
    row = ("half", str(other.resolve()), stat.st_size, int(stat.st_mtime * 1000), "ingested", "elsewhere", None)
    spark.createDataFrame([row], to_struct(INGEST_FILES)).writeTo(cfg.table("ingest_files")).append()
    assert all(t.files == 0 for t in ingest(spark, cfg, landing, "run-2b").values())

    # One more file: only its rows are added.
    extra = [dict(r, broker_name="broker-z") for r in landed(landing / "half")[:3]]
    (landing / "half" / "late.jsonl").write_text("".join(json.dumps(r) + "\n" for r in extra))
    third = ingest(spark, cfg, landing, "run-3")
    assert (third["half"].files, third["half"].inserted) == (1, 3)
    assert all(third[s].files == 0 for s in ("op", "real", "offset"))
    added = spark.table(cfg.table("half_events")).where("_run_id = 'run-3'")
    assert added.count() == 3 and added.where("broker_name = 'broker-z'").count() == 3

    # The same file under a second name, and a record conflicting with a stored one.
    shutil.copy(landing / "op" / "part-00000.jsonl", landing / "op" / "resent.jsonl")
    changed = dict(landed(landing / "real")[0], body_size=123_456, store_timestamp=max(latest.values()) + 1)
    (landing / "real" / "changed.jsonl").write_text(json.dumps(changed) + "\n")
    fourth = ingest(spark, cfg, landing, "run-4")
    op_lines = len((landing / "op" / "part-00000.jsonl").read_text().splitlines())
    assert (fourth["op"].inserted, fourth["op"].duplicates) == (0, op_lines)
    assert (fourth["real"].inserted, fourth["real"].quarantined) == (0, 1)
    [q] = spark.table(cfg.table("quarantine")).where("run_id = 'run-4'").collect()
    assert q["stream"] == "real" and q["reason"] == "conflicts with the stored record of the same natural key"
    assert json.loads(q["raw"]) == changed and q["source_file"].endswith("/real/changed.jsonl")
    # A quarantined record is not an event: the data time stays the latest stored one.
    [until] = spark.table(cfg.table("ingest_files")).where("path LIKE '%/changed.jsonl'").collect()
    assert until["events_until"] == 0
    frames = {s: spark.table(cfg.table(f"{s}_events")) for s in LANDING}
    assert latest_event(spark, cfg, frames) == max(latest.values())

    history = spark.table(cfg.table("ingest_runs")).where("stream = 'op'").orderBy("started_at", "run_id").collect()
    assert [(r["run_id"], r["inserted"], r["duplicates"]) for r in history] == [
        ("run-1", meta["records"]["op"], 0), ("run-2", 0, 0), ("run-2b", 0, 0), ("run-3", 0, 0),
        ("run-4", 0, op_lines)]  # fmt: skip


def test_archive_moves_each_recorded_file_out_of_the_landing(
    spark: SparkSession, config: Config, tmp_path: Path
) -> None:
    """With ingest.archive a run moves every file it recorded, a collect pass's accounting too, to the same
    path below _ingested/<run id>/, and a later run looks up only what the landing still holds: new files, and
    a recorded one that a run which died before moving it left behind (moved now, not ingested again)."""
    cfg = fresh_db(spark, config, "t_ingest_archive")
    cfg = dataclasses.replace(cfg, ingest=dataclasses.replace(cfg.ingest, archive=True))
    landing = tmp_path / "landing"
    meta = make_landing(landing, n=40)
    write_runs(landing / "_collect", "collect-1", [BrokerRun("broker-a", "127.0.0.1:10911", NOW)])
    sources = [landing / s for s in LANDING] + [landing / "_collect" / "runs"]
    landed_files = {p.relative_to(landing): p.read_bytes() for folder in sources for p in folder.iterdir()}

    first = ingest(spark, cfg, landing, "run-1")
    archived = landing / "_ingested" / "run-1"
    assert {p.relative_to(archived): p.read_bytes() for p in archived.rglob("*") if p.is_file()} == landed_files
    assert not [p for folder in sources for p in folder.iterdir()]
    for stream in LANDING:
        assert first[stream].inserted == meta["records"][stream] > 0
        assert rows(spark, cfg, stream) == landed(archived / stream)
    collected = spark.table(cfg.table("collect_runs")).select("run_id", "broker_name").collect()
    assert [tuple(r) for r in collected] == [("collect-1", "broker-a")]

    # A run that died after recording put back: its files are recorded, so they are moved and not read.
    for name in ("half/part-00000.jsonl", "_collect/runs/collect-1.jsonl"):
        shutil.copy2(archived / name, landing / name)  # the same path, size and modification time
    extra = [dict(r, broker_name="broker-z") for r in landed(archived / "half")[:3]]
    (landing / "half" / "late.jsonl").write_text("".join(json.dumps(r) + "\n" for r in extra))
    second = ingest(spark, cfg, landing, "run-2")
    assert (second["half"].files, second["half"].inserted, second["half"].duplicates) == (1, 3, 0)
    assert all(second[s].files == 0 for s in LANDING if s != "half")
    again = landing / "_ingested" / "run-2"
    assert sorted(str(p.relative_to(again)) for p in again.rglob("*") if p.is_file()) == [
        "_collect/runs/collect-1.jsonl", "half/late.jsonl", "half/part-00000.jsonl"]  # fmt: skip
    assert not [p for folder in sources for p in folder.iterdir()]
    assert spark.table(cfg.table("collect_runs")).count() == 1
    recorded = spark.table(cfg.table("ingest_files")).where("run_id = 'run-2'").select("path").collect()
    assert [r["path"] for r in recorded] == [str((landing / "half" / "late.jsonl").resolve())]


def test_bronze_tables_have_change_data_feed_clustering_and_few_checkpoints(
    spark: SparkSession, config: Config
) -> None:
    cfg = fresh_db(spark, config, "t_ingest_props")
    from jobs.ingest import ensure_tables

    ensure_tables(spark, cfg)
    detail = spark.sql(f"DESCRIBE DETAIL {cfg.table('real_events')}").collect()[0]
    assert detail["properties"]["delta.enableChangeDataFeed"] == "true"
    assert detail["properties"]["delta.checkpointInterval"] == "100"  # conf/base.yaml's default for new tables
    assert detail["clusteringColumns"] == ["broker_name", "store_timestamp"]
    columns = spark.table(cfg.table("real_events")).columns
    assert columns[-4:] == ["_record_hash", "_source_file", "_ingested_at", "_run_id"]


def test_parquet_and_jsonl_land_the_same_rows(spark: SparkSession, config: Config, tmp_path: Path) -> None:
    from_json = fresh_db(spark, config, "t_ingest_json")
    from_parquet = fresh_db(spark, config, "t_ingest_parquet")
    make_landing(tmp_path / "j", n=60, seed=4)
    make_landing(tmp_path / "p", n=60, seed=4, fmt="parquet")
    ingest(spark, from_json, tmp_path / "j", "run-j")
    tallies = ingest(spark, from_parquet, tmp_path / "p", "run-p")
    assert all(t.quarantined == 0 for t in tallies.values())
    for stream in LANDING:
        assert rows(spark, from_parquet, stream) == rows(spark, from_json, stream)

    # A Parquet record conflicting with a stored one reaches quarantine with its content as raw text.
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "p/real/part-00000.parquet").slice(0, 1)
    changed = table.set_column(table.schema.get_field_index("body_size"), "body_size",
                               [[table.column("body_size")[0].as_py() + 1]])  # fmt: skip
    pq.write_table(changed.cast(table.schema), tmp_path / "p/real/changed.parquet")
    assert ingest(spark, from_parquet, tmp_path / "p", "run-p2")["real"].quarantined == 1
    [q] = spark.table(from_parquet.table("quarantine")).collect()
    assert json.loads(q["raw"])["body_size"] == table.column("body_size")[0].as_py() + 1
    assert q["reason"] == "conflicts with the stored record of the same natural key"


GOOD_HALF = {
    "broker_name": "b", "queue_id": 0, "queue_offset": 1, "commit_log_offset": 100, "store_timestamp": 1000,
    "born_timestamp": 990, "uniq_key": "K1", "producer_group": "pg", "real_topic": "orders", "real_queue_id": 2,
}  # fmt: skip
GOOD_REAL = {
    "broker_name": "b", "topic": "orders", "queue_id": 2, "queue_offset": 0, "commit_log_offset": 300,
    "store_timestamp": 1010, "born_timestamp": 990, "uniq_key": "K1", "sys_flag": 8, "transactional": True,
}  # fmt: skip


def op_record(offset: int, body: str) -> dict[str, Any]:
    return {"broker_name": "b", "queue_id": 0, "queue_offset": offset, "commit_log_offset": 200 + offset,
            "store_timestamp": 1005, "born_timestamp": 1005, "tag": "d", "body": body}  # fmt: skip


def test_bad_input_is_quarantined_with_reasons(spark: SparkSession, config: Config, tmp_path: Path) -> None:
    cfg = fresh_db(spark, config, "t_ingest_bad")
    landing = tmp_path / "landing"
    for stream in LANDING:
        (landing / stream).mkdir(parents=True)
    half_lines = [
        json.dumps(GOOD_HALF),
        json.dumps(dict(GOOD_HALF, queue_offset=2, uniq_key="K2", check_times=1)),
        json.dumps(GOOD_HALF),  # an exact repeat
        '{"broker_name": "b", "queue_id": 0,',  # malformed JSON
        json.dumps({k: v for k, v in dict(GOOD_HALF, queue_offset=3).items() if k != "uniq_key"}),
        json.dumps(dict(GOOD_HALF, queue_offset=4, queue_id="abc")),
        json.dumps(dict(GOOD_HALF, queue_offset=-5)),
        json.dumps(dict(GOOD_HALF, queue_offset=6, store_timestamp=-1)),
    ]
    (landing / "half" / "mixed.jsonl").write_text("\n".join(half_lines) + "\n")
    (landing / "half" / "notes.txt").write_text("not a landing file\n")
    (landing / "op" / "ops.jsonl").write_text("\n".join(json.dumps(r) for r in [
        op_record(0, "1,2,"), op_record(1, "1,x"), op_record(2, "3"), op_record(3, "")]) + "\n")  # fmt: skip
    (landing / "offset" / "empty.jsonl").write_text("")
    snapshot = {"snapshot_ts": 1, "consumer_group": "g", "topic": "t"}
    facts: list[dict[str, object]] = [
        {"kind": "subscription", "client_id": "c1", "expression": "*"},  # a member's own: no broker
        {"kind": "subscription", "broker_name": "b", "expression": "*"},  # the broker's table
        {"kind": "queue", "client_id": "c1", "broker_name": "b", "queue_id": 0},  # no offset yet
        {"kind": "subscription", "expression": "*"},  # a table, but whose?
        {"kind": "queue", "client_id": "c1", "queue_id": 1, "offset": 4},
    ]
    (landing / "consumer" / "snap.jsonl").write_text("".join(json.dumps(snapshot | r) + "\n" for r in facts))
    with gzip.open(landing / "real" / "good.jsonl.gz", "wt") as f:
        f.write(json.dumps(GOOD_REAL) + "\n")
    whole = gzip.compress(("".join(json.dumps(dict(GOOD_REAL, queue_offset=i)) + "\n" for i in range(1, 400))).encode())
    (landing / "real" / "truncated.jsonl.gz").write_bytes(whole[: len(whole) // 2])

    tallies = ingest(spark, cfg, landing, "run-bad")

    assert (tallies["half"].inserted, tallies["half"].duplicates, tallies["half"].quarantined) == (2, 1, 6)
    assert (tallies["half"].files, tallies["half"].files_failed) == (2, 1)
    assert (tallies["op"].inserted, tallies["op"].quarantined) == (2, 2)
    assert (tallies["real"].inserted, tallies["real"].files_failed) == (1, 1)
    assert (tallies["offset"].files, tallies["offset"].read) == (1, 0)
    assert (tallies["consumer"].inserted, tallies["consumer"].quarantined) == (3, 2)
    assert rows(spark, cfg, "half") == sorted([GOOD_HALF, dict(GOOD_HALF, queue_offset=2, uniq_key="K2",
                                                               check_times=1)], key=json.dumps)  # fmt: skip
    assert rows(spark, cfg, "real") == [GOOD_REAL]

    reasons = {(r["stream"], r["reason"]) for r in spark.table(cfg.table("quarantine")).collect()}
    assert {
        ("half", "malformed JSON: not one JSON object per line"),
        ("half", "missing required field 'uniq_key'"),
        ("half", "field 'queue_id' is not int: abc"),
        ("half", "negative queue_offset: -5"),
        ("half", "negative store_timestamp: -1"),
        ("op", "op body is not a list of offsets: 1,x"),
        ("op", "op body is not a list of offsets: "),
        ("consumer", "missing field 'broker_name', required when kind is queue or client_id is null"),
    } < reasons
    unsupported = [r for s, r in reasons if s == "half" and r.startswith("unsupported file type")]
    assert len(unsupported) == 1
    assert ("real", "unreadable file: EOFException: Unexpected end of input stream") in reasons
    assert len(reasons) == 10  # both consumer rows lack their broker
    failed = spark.table(cfg.table("ingest_files")).where("status = 'failed'").select("path").collect()
    assert sorted(Path(r["path"]).name for r in failed) == ["notes.txt", "truncated.jsonl.gz"]

    # Nothing changes on a rerun: the failed files are not retried until they change.
    again = ingest(spark, cfg, landing, "run-bad-2")
    assert all(t.files == 0 for t in again.values())
    assert spark.table(cfg.table("quarantine")).count() == 11


def test_mutated_landing_files_land_every_record_as_a_row_or_a_quarantine(spark: SparkSession, config: Config,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    """Issue 45, ingest's validation fuzzed: the model's JSON Lines of every stream, each line edited as
    tests/fuzz.py edits bytes (flips, cuts, inserts, 4-byte fields, dropped tails; seeded), and Parquet files
    with bytes flipped. Whatever the bytes, every line is read and becomes a row or a quarantine row with
    its reason, and a file that cannot be read at all is one quarantine row: nothing lost, no failure."""
    rng = random.Random(45)
    landing = tmp_path / "landing"
    make_landing(landing, n=60, per_file=100_000)
    lines: dict[str, int] = {}
    for stream in LANDING:
        for path in sorted((landing / stream).glob("*.jsonl")):
            edited = []
            for line in path.read_bytes().splitlines():
                if rng.random() < 0.5:
                    line = apply(line, random_edits(rng)).replace(b"\n", b" ").replace(b"\r", b" ")
                edited.append(line)
            path.write_bytes(b"\n".join(edited) + b"\n")
            lines[stream] = lines.get(stream, 0) + len(edited)
    parquet = tmp_path / "parquet"
    make_landing(parquet, n=20, fmt="parquet")
    broken = []
    for stream in ("half", "real"):
        for path in sorted((parquet / stream).glob("*.parquet"))[:1]:
            target = landing / stream / f"broken-{path.name}"
            target.write_bytes(apply(path.read_bytes(), random_edits(rng, most=3)))
            broken.append(target.name)

    cfg = fresh_db(spark, config, "t_ingest_fuzz")
    tallies = ingest(spark, cfg, landing, "run-fuzz")
    for stream, n in lines.items():  # (ingest() checks read = inserted + duplicates + quarantined)
        t = tallies[stream]
        # Every line is read; a broken Parquet file adds its rows, or one quarantine row if it cannot be read.
        assert t.read == n if stream not in ("half", "real") else t.read > n, (stream, t, n)
    assert sum(t.quarantined for t in tallies.values()) > 0
    reasons = spark.table(cfg.table("quarantine")).select("stream", "reason").collect()
    assert all(r["reason"] for r in reasons)
    assert sum(t.inserted for t in tallies.values()) > 0


def test_an_op_may_arrive_before_its_half(spark: SparkSession, config: Config, tmp_path: Path) -> None:
    cfg = fresh_db(spark, config, "t_ingest_order")
    landing = tmp_path / "landing"
    (landing / "op").mkdir(parents=True)
    (landing / "op" / "early.jsonl").write_text(json.dumps(op_record(0, "1,")) + "\n")
    assert ingest(spark, cfg, landing, "run-a")["op"].inserted == 1
    (landing / "half").mkdir()
    (landing / "half" / "late.jsonl").write_text(json.dumps(GOOD_HALF) + "\n")
    tallies = ingest(spark, cfg, landing, "run-b")
    assert (tallies["half"].inserted, tallies["op"].files) == (1, 0)
    assert rows(spark, cfg, "op") == [op_record(0, "1,")]


def test_a_field_added_later_keeps_old_records_repeatable(spark: SparkSession, config: Config, tmp_path: Path) -> None:
    """A bronze table an older version wrote, before half records had `topic` (RIP-82), is migrated in
    place: its rows get the default, a record landed again still repeats itself, and a RIP-82 half at the
    same queue offset of the other half topic is a new record, not a conflict."""
    cfg = fresh_db(spark, config, "t_ingest_migrate")
    old = Schema("half", tuple(f for f in HALF.fields if f.name != "topic"))
    create_table(spark, cfg, Schema("half_events", old.fields + BOOKKEEPING))
    stored = spark.createDataFrame([tuple(GOOD_HALF.get(n) for n in old.names)], to_struct(old))
    stored.select(
        "*", F.sha2(F.to_json(F.struct(*old.names)), 256).alias("_record_hash"),
        F.lit("old.jsonl").alias("_source_file"), F.lit(NOW).alias("_ingested_at"), F.lit("run-old").alias("_run_id"),
    ).writeTo(cfg.table("half_events")).append()  # fmt: skip
    # Its record of files predates `events_until`.
    files = Schema("ingest_files", tuple(f for f in INGEST_FILES.fields if f.name != "events_until"))
    create_table(spark, cfg, files)
    spark.createDataFrame([("half", "old.jsonl", 1, 1, "ingested", "run-old")], to_struct(files)).writeTo(
        cfg.table("ingest_files")
    ).append()
    landing = tmp_path / "landing"
    (landing / "half").mkdir(parents=True)
    rip_82 = dict(GOOD_HALF, uniq_key="K9", topic=ROCKSDB_HALF_TOPIC, store_timestamp=1005)
    (landing / "half" / "again.jsonl").write_text(json.dumps(GOOD_HALF) + "\n" + json.dumps(rip_82) + "\n")

    tallies = ingest(spark, cfg, landing, "run-new")

    assert (tallies["half"].inserted, tallies["half"].duplicates, tallies["half"].quarantined) == (1, 1, 0)
    topics = {r["uniq_key"]: r["topic"] for r in spark.table(cfg.table("half_events")).collect()}
    assert topics == {"K1": HALF_TOPIC, "K9": ROCKSDB_HALF_TOPIC}
    # The old file is given its stream's latest event then; the new one its batch's.
    recorded = spark.table(cfg.table("ingest_files")).select("path", "events_until").collect()
    assert {Path(r["path"]).name: r["events_until"] for r in recorded} == {
        "old.jsonl": GOOD_HALF["store_timestamp"], "again.jsonl": rip_82["store_timestamp"]}  # fmt: skip


def test_an_engine_failure_quarantines_nothing_and_the_next_run_lands_everything(
    spark: SparkSession, config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    cfg = fresh_db(spark, config, "t_ingest_engine")
    landing = tmp_path / "landing"
    meta = make_landing(landing)
    conf = tmp_path / "db.yaml"
    conf.write_text(f"database: {cfg.database}\n")
    read_files = ingest_job.read_files

    def out_of_memory(session: SparkSession, stream: str, files: list[Any]) -> Any:
        if stream == "op":  # a real java.lang.OutOfMemoryError in the driver's JVM, which lives on
            jvm = session.sparkContext._jvm
            assert jvm is not None
            jvm.java.lang.reflect.Array.newInstance(jvm.java.lang.Long.TYPE, 2**31 - 16)
        return read_files(session, stream, files)

    monkeypatch.setattr(ingest_job, "read_files", out_of_memory)
    code = main(["ingest", "--landing", str(landing), "--warehouse", cfg.warehouse, "--conf", str(conf)])
    err = capsys.readouterr().err
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("txn-recon ingest: failed: Spark failed while ingesting op files (OutOfMemoryError: ")
    assert spark.table(cfg.table("quarantine")).count() == 0
    assert spark.table(cfg.table("op_events")).count() == 0
    assert spark.table(cfg.table("ingest_files")).where("stream = 'op'").count() == 0
    assert rows(spark, cfg, "half") == landed(landing / "half")  # a stream ingested beside the failing one is in

    monkeypatch.undo()
    rerun = ingest(spark, cfg, landing, "run-after-failure")
    assert rerun["op"].inserted == meta["records"]["op"] > 0 and rerun["half"].files == 0
    for stream in LANDING:
        assert rows(spark, cfg, stream) == landed(landing / stream)
    assert spark.table(cfg.table("quarantine")).count() == 0
