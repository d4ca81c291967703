"""`txn-recon ingest --landing DIR`: landing files into bronze Delta tables, incrementally and idempotently.

Each stream folder is listed and compared with the `ingest_files` table, so a run reads only files it
has not processed (a changed file counts as new). New files are read in batches with the explicit
schemas, validated (transforms.landing), classified against bronze by natural key, and appended:
typed rows to `<stream>_events`, bad ones to `quarantine`. Then the files are recorded (the streams' last
batches together, in one commit). A run that dies between those writes is simply repeated by the next one:
rows already stored classify as duplicates and quarantine rows are keyed, so the tables end the same as after
one clean run. With `ingest.archive`, recorded files then leave the landing for `_ingested/` (`archive`), and
only those still in it are looked up.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F

from jobs.catalog import add_new_fields, appended, create_table, follows, may_have_rows, table_commit, tables_in
from jobs.config import Config
from jobs.errors import EngineError, TxnReconError, first_line, is_unreadable_file
from jobs.lock import warehouse_lock
from jobs.runs import new_run_id
from jobs.session import OPTIMIZING_JIT, build_session, with_jit
from schemas import LANDING
from schemas.bronze import (
    BRONZE,
    CLUSTER_BY,
    COLLECT_RUNS,
    EVENT_TIME,
    INGEST_FILES,
    INGEST_RUNS,
    QUARANTINE,
    STATS_COLUMNS,
)
from schemas.spark import to_struct
from transforms.frames import kept, kept_with_ranges, union_all, within
from transforms.landing import (
    DUPLICATE,
    INSERT,
    QUARANTINED,
    check_typed_rows,
    classify_batch,
    key_facts,
    parse_json_lines,
    with_record_hash,
)

log = logging.getLogger(__name__)

COLLECT_RUNS_DIR = Path("_collect") / "runs"  # where `txn-recon collect` leaves its accounting rows
JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
PARQUET_SUFFIXES = (".parquet",)
SMALL_BATCH_BYTES = 64 * 1024 * 1024  # up to about a million keys to broadcast (Parquet; fewer as JSON)
BROADCAST_KEYS = 250_000  # key facts up to this many rows (some tens of MiB) go to every task
# Bronze files hold at most this many rows, in the order of the table's clustering (broker, then time): a
# lookup of a stretch of store time reads the few files that hold it. A large backfill written as two files
# of half a million rows each was read whole by every such lookup.
FILE_ROWS = 100_000
FATES = (INSERT, DUPLICATE, QUARANTINED)
# `ingest_files` rows: (stream, path, size, modified_ms, status, run_id, events_until).
Recorded = list[tuple[str, str, int, int, str, str, int | None]]
Seen = tuple[str, str, int, int]  # (stream, path, size, modified_ms) of a landing file `ingest_files` records
# `ingest_files` -> its commit (`catalog.table_commit`) when this process last read or wrote it, and what it
# recorded of the landing's files then: a query of it costs a Delta listing and a Spark job every cycle.
_RECORDED: dict[str, tuple[tuple[str, int, int], set[Seen]]] = {}
_NOTING = threading.Lock()  # two streams record files side by side
# Streams are ingested two at a time. A quarantine write reads the table it appends to, so two at once could
# conflict: they go one at a time. The files' records are blind appends, which Delta commits side by side.
_SHARED_WRITE = threading.Lock()


@dataclass(frozen=True)
class LandingFile:
    path: Path
    size: int
    modified_ms: int

    @property
    def kind(self) -> str:
        name = self.path.name
        if name.endswith(JSON_SUFFIXES):
            return "json"
        return "parquet" if name.endswith(PARQUET_SUFFIXES) else "unsupported"


@dataclass
class Tally:
    files: int = 0
    files_failed: int = 0
    read: int = 0
    inserted: int = 0
    duplicates: int = 0
    quarantined: int = 0
    events_until: int | None = None  # the latest EVENT_TIME of the records read, inserted or already stored
    started: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    def add(self, other: Tally) -> None:
        for name in ("files", "files_failed", "read", "inserted", "duplicates", "quarantined"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.events_until = max((t for t in (self.events_until, other.events_until) if t is not None), default=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--landing", type=Path, required=True, help="landing root with half/ op/ real/ offset/")


def validate_landing(landing: Path) -> None:
    if not landing.is_dir():
        raise TxnReconError(f"--landing {landing} is not a folder")
    if not any((landing / s).is_dir() for s in LANDING) and not (landing / COLLECT_RUNS_DIR).is_dir():
        raise TxnReconError(f"--landing {landing} has none of the stream folders {', '.join(LANDING)}")


def run(args: argparse.Namespace, config: Config) -> int:
    landing: Path = args.landing
    validate_landing(landing)
    now = dt.datetime.now(dt.UTC)
    run_id = new_run_id(now)
    with warehouse_lock(config, "ingest"):
        spark = build_session(with_jit(config, OPTIMIZING_JIT))
        tallies = ingest_landing(spark, config, landing, run_id, now.replace(tzinfo=None))
    print(summary(run_id, tallies))
    return 0


def ingest_landing(
    spark: SparkSession, config: Config, landing: Path, run_id: str, ingested_at: dt.datetime
) -> dict[str, Tally]:
    """Ingest every stream folder present under `landing`; the run id and time come from the caller."""
    ensure_tables(spark, config)
    log.info("ingest %s from %s", run_id, landing)
    listed = {s: list_files(landing / s) for s in LANDING if (landing / s).is_dir()}
    seen = recorded_files(spark, config, [f for files in listed.values() for f in files])

    done: dict[str, tuple[Tally, Recorded]] = {}

    def stream(s: str) -> None:
        done[s] = ingest_stream(spark, config, landing, s, listed[s], run_id, ingested_at, seen)

    def record_last() -> None:
        """Each finished stream's last batch, recorded here with the others' in one commit: a cycle's streams are
        a batch each."""
        last = [r for _, recorded in done.values() for r in recorded]
        record_files(spark, config, last)
        if config.ingest.archive:
            archive(landing, [Path(r[1]) for r in last], run_id)

    # Two streams at a time, each into its own table: most of a small batch's time is the driver's (planning,
    # Delta's log and commit), so one stream's jobs run while the other's driver works.
    try:
        with ThreadPoolExecutor(2, "ingest") as pool:
            list(pool.map(stream, listed))
    except Exception:
        # What the streams that finished landed is recorded all the same, if the engine still can; the failure
        # to tell is the stream's (what is not recorded, the next run reads again).
        with contextlib.suppress(Exception):
            record_last()
        raise
    record_last()
    tallies = {s: done[s][0] for s in listed}
    record_run(spark, config, run_id, tallies)
    land_collect_runs(spark, config, landing, run_id)
    return tallies


def ensure_tables(spark: SparkSession, config: Config) -> None:
    """Create the bronze and bookkeeping tables that do not exist yet (one catalog listing)."""
    existing = tables_in(spark, config.database)
    for stream, schema in BRONZE.items():
        if schema.name not in existing:
            create_table(spark, config, schema, properties={"delta.enableChangeDataFeed": "true"},
                         cluster_by=CLUSTER_BY[stream], stats_columns=STATS_COLUMNS[stream])  # fmt: skip
        else:
            add_new_fields(spark, config.table(schema.name), schema)
    for schema in (QUARANTINE, INGEST_RUNS, INGEST_FILES):
        if schema.name not in existing:
            create_table(spark, config, schema)
        elif "events_until" in add_new_fields(spark, config.table(schema.name), schema):
            _events_until_of_earlier_files(spark, config)


def _events_until_of_earlier_files(spark: SparkSession, config: Config) -> None:
    """`ingest_files.events_until` for the files an older version ingested: its stream's latest event time,
    which bounds every record they brought (Delta answers each from its file statistics)."""
    table = DeltaTable.forName(spark, config.table(INGEST_FILES.name))
    for stream, column in EVENT_TIME.items():
        latest = spark.table(config.table(BRONZE[stream].name)).agg(F.max(column)).collect()[0][0]
        if latest is not None:
            table.update(F.expr(f"stream = '{stream}' AND status = 'ingested'"), {"events_until": F.lit(latest)})


def list_files(folder: Path) -> list[LandingFile]:
    """Every landing file below `folder`, in name order; hidden and temporary files are skipped."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not any(part.startswith((".", "_")) for part in path.relative_to(folder).parts):
            stat = path.stat()
            found.append(LandingFile(path.resolve(), stat.st_size, int(stat.st_mtime * 1000)))
    return found


def recorded_files(spark: SparkSession, config: Config, files: list[LandingFile]) -> set[Seen]:
    """`seen_files` of the landing's `files`: known to this process when `ingest_files` is as it last read or
    wrote it (a service's runs ask no Spark job), else read."""
    table = config.table(INGEST_FILES.name)
    state = table_commit(spark, table)
    known = _RECORDED.get(table)
    seen = known[1] if known is not None and known[0] == state else None
    if seen is None:
        # Archived files leave the landing: those still in it are new, or recorded by a run that died before it
        # moved them, so only theirs need looking up.
        seen = seen_files(spark, config, state[1], files if config.ingest.archive else None)
    paths = {str(f.path) for f in files}
    # Kept for the files still in the landing only. One that leaves it and comes back is read again (its records
    # are stored, and counted duplicates), as when a run dies before it records a batch.
    seen = {s for s in seen if s[1] in paths}
    _RECORDED[table] = (state, seen)
    return seen


def seen_files(spark: SparkSession, config: Config, version: int, among: list[LandingFile] | None = None) -> set[Seen]:
    """(stream, path, size, modified_ms) of every landing file recorded in `ingest_files` at `version`, or of
    those `among` the given files' paths only."""
    table = config.table(INGEST_FILES.name)
    recorded = spark.sql(f"SELECT stream, path, size, modified_ms FROM {table} VERSION AS OF {version}")
    if among is not None:
        if not among:
            return set()
        recorded = recorded.where(F.col("path").isin(sorted({str(f.path) for f in among})))
    return {(r["stream"], r["path"], r["size"], r["modified_ms"]) for r in recorded.collect()}


def new_files(stream: str, files: list[LandingFile], seen: set[Seen]) -> list[LandingFile]:
    return [f for f in files if (stream, str(f.path), f.size, f.modified_ms) not in seen]


def batches(files: list[LandingFile], max_bytes: int) -> Iterator[list[LandingFile]]:
    batch: list[LandingFile] = []
    size = 0
    for f in files:
        if batch and size + f.size > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append(f)
        size += f.size
    if batch:
        yield batch


def ingest_stream(
    spark: SparkSession,
    config: Config,
    landing: Path,
    stream: str,
    files: list[LandingFile],
    run_id: str,
    ingested_at: dt.datetime,
    seen: set[Seen],
) -> tuple[Tally, Recorded]:
    """The stream's new files ingested a batch at a time, each batch's files recorded (and archived) once
    it is in, but the last's: returned for the caller to record with the other streams'. A run that dies
    before it leaves that batch to the next, which finds its records stored and counts them duplicates."""
    todo = new_files(stream, files, seen)
    if config.ingest.archive:  # recorded by a run that died before it moved them
        new = set(todo)
        archive(landing, [f.path for f in files if f not in new], run_id)
    tally = Tally()
    if not todo:
        log.info("%s: no new files", stream)
        return tally, []
    parts = list(batches(todo, config.ingest.batch_bytes))
    recorded: Recorded = []
    for n, batch in enumerate(parts, 1):
        started = time.perf_counter()
        done, recorded = ingest_batch(spark, config, stream, batch, run_id, ingested_at)
        if n < len(parts):
            record_files(spark, config, recorded)
            if config.ingest.archive:
                archive(landing, [f.path for f in batch], run_id)
        tally.add(done)
        log.info("%s: batch %d/%d: %d files, %d records: %d inserted, %d duplicates, %d quarantined (%.1f s)",
                 stream, n, len(parts), done.files, done.read, done.inserted, done.duplicates, done.quarantined,
                 time.perf_counter() - started)  # fmt: skip
    return tally, recorded


def ingest_batch(
    spark: SparkSession, config: Config, stream: str, files: list[LandingFile], run_id: str, ingested_at: dt.datetime
) -> tuple[Tally, Recorded]:
    """Ingest a batch whole; if a file cannot be read, ingest its files one by one to isolate it. Returned with
    its tally: the `ingest_files` rows of its files, to record. A failure of the engine rather than of a file
    raises EngineError before anything is quarantined or recorded, so the next run reads the whole batch
    again."""
    readable = [f for f in files if f.kind != "unsupported"]
    failed = {f: "unsupported file type (expected .jsonl, .json, .jsonl.gz, .json.gz or .parquet)"
              for f in files if f.kind == "unsupported"}  # fmt: skip
    tally = Tally()
    try:
        if readable:
            tally = write_records(spark, config, stream, readable, run_id, ingested_at)
    except Exception as whole:  # a read error surfaces at the first action; nothing was written yet
        _unless_engine_failure(whole, stream)
        log.warning("%s: a file in this batch cannot be read (%s); reading its files one by one",
                    stream, first_line(whole))  # fmt: skip
        tally = Tally()
        for f in readable:
            try:
                tally.add(write_records(spark, config, stream, [f], run_id, ingested_at))
            except Exception as e:
                _unless_engine_failure(e, stream)
                failed[f] = f"unreadable file: {first_line(e)}"
    for f, reason in failed.items():
        log.warning("%s: quarantined %s: %s", stream, f.path, reason)
        write_quarantine(spark, config, _failed_file_row(spark, stream, f, reason), run_id, ingested_at)
    tally.files = len(files)
    tally.files_failed = len(failed)
    tally.read += len(failed)
    tally.quarantined += len(failed)
    return tally, file_rows(stream, files, set(failed), run_id, tally.events_until)


# Where `ingest.archive` moves the files a run recorded: <landing>/_ingested/<run id>/<path in the landing>.
# Its name starts with "_", so no stream folder listing enters it.
ARCHIVE = "_ingested"


def archive(landing: Path, files: list[Path], run_id: str) -> None:
    """Move recorded files out of the landing, each to the same path below the run's archive folder (a rename:
    a file is in one place or the other). Only after its record is committed: a run that dies in between
    leaves the file for the next run, which finds it recorded and moves it."""
    root = landing.resolve()
    for path in files:
        if not path.is_relative_to(root):  # a link to a file elsewhere: not ours to move
            continue
        target = root / ARCHIVE / run_id / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)


def _unless_engine_failure(e: Exception, stream: str) -> None:
    """Return when `e` is a file Spark could not read; raise EngineError for anything else."""
    if not is_unreadable_file(e):
        raise EngineError(f"Spark failed while ingesting {stream} files ({first_line(e)}); nothing was "
                          "quarantined for it, and the next run reads those files again") from e  # fmt: skip


def read_files(spark: SparkSession, stream: str, files: list[LandingFile]) -> DataFrame:
    """The files' records as typed rows with `_source_file`, `_raw` and `_problems`."""
    schema = LANDING[stream]
    frames = []
    json_paths = [str(f.path) for f in files if f.kind == "json"]
    parquet_paths = [str(f.path) for f in files if f.kind == "parquet"]
    if json_paths:
        text = spark.read.text(json_paths).select("value", _source_file())
        frames.append(text.transform(parse_json_lines(schema)))
    if parquet_paths:
        typed = spark.read.schema(to_struct(schema)).parquet(*parquet_paths).select("*", _source_file())
        frames.append(typed.transform(check_typed_rows(schema)))
    return union_all(frames).transform(with_record_hash(schema))


def write_records(
    spark: SparkSession, config: Config, stream: str, files: list[LandingFile], run_id: str, ingested_at: dt.datetime
) -> Tally:
    batch = read_files(spark, stream, files)
    # The key lookup, the key facts and the write each read the batch. JSON is parsed, checked and hashed once,
    # into the cache (100,000 transactions of JSON Lines: 65 s instead of 94). Parquet decodes faster than the
    # cache is built, so it is read again (1M transactions of Parquet: 79 s read three times, 82 s cached).
    cached = any(f.kind == "json" for f in files)
    if cached:
        batch = batch.persist()
    try:
        return _write_batch(spark, config, stream, batch, sum(f.size for f in files), run_id, ingested_at)
    finally:
        if cached:
            batch.unpersist()


def _write_batch(
    spark: SparkSession, config: Config, stream: str, batch: DataFrame, size: int, run_id: str,
    ingested_at: dt.datetime,
) -> Tally:  # fmt: skip
    bronze, table = BRONZE[stream], config.table(BRONZE[stream].name)
    stored = spark.table(table).select(*bronze.key, "_record_hash")
    if not may_have_rows(spark, table):
        # A first batch: no key stored to look up, and Spark folds the lookup of an empty relation away.
        stored = stored.limit(0)
    elif size <= SMALL_BATCH_BYTES:
        # A small batch against a large table: bronze cut down to the batch's keys, first to their ranges (so
        # Delta reads its recent files only, as a rule), then by broadcasting them, instead of shuffling every
        # stored key to join with a few new ones. The few left are then shuffled to the batch's keys, which are
        # grouped by key already: sized by the table, they were broadcast, a Spark job more.
        keys, bounds = kept_with_ranges(batch.select(*bronze.key).distinct(), bronze.key)
        stored = within(stored, bounds).join(F.broadcast(keys), on=list(bronze.key), how="left_semi").hint("merge")
    found, sizes = kept(
        key_facts(bronze.key, batch, stored), F.count(F.lit(1)).alias("keys"),
        F.count_if(F.col("_copies") > 1).alias("contested"),
    )  # fmt: skip
    # As a rule no key repeats or is stored: nothing to join, and the batch is written as it is read.
    facts = None
    if sizes["keys"]:
        facts = F.broadcast(found) if sizes["keys"] <= BROADCAST_KEYS else found  # broadcast: the batch unshuffled
    classified = batch.transform(classify_batch(bronze.key, facts, contested=sizes["contested"] > 0))
    # One pass writes the inserts and counts every fate on the way; quarantine rows are rare and are
    # computed again only when there are some.
    fates = Observation()
    event = F.when(F.col("_fate") != QUARANTINED, F.col(EVENT_TIME[stream]))
    latest = F.coalesce(F.max(event), F.lit(0)).alias("events_until")  # 0: no record, so no event
    counted = classified.observe(fates, *(F.count_if(F.col("_fate") == k).alias(k) for k in FATES), latest)
    counted.where(F.col("_fate") == INSERT).select(
        *LANDING[stream].names, "_record_hash", "_source_file",
        F.lit(ingested_at).alias("_ingested_at"), F.lit(run_id).alias("_run_id"),
    ).sortWithinPartitions(*CLUSTER_BY[stream]).writeTo(table).option(
        "maxRecordsPerFile", FILE_ROWS
    ).append()  # fmt: skip
    counts = fates.get
    if counts[QUARANTINED]:
        bad = classified.where(F.col("_fate") == QUARANTINED).select(
            F.lit(stream).alias("stream"), F.col("_source_file").alias("source_file"),
            F.coalesce("_raw", F.to_json(F.struct(*LANDING[stream].names))).alias("raw"),
            F.col("_reason").alias("reason"),
        )  # fmt: skip
        write_quarantine(spark, config, bad, run_id, ingested_at)
    inserted, duplicates, quarantined = (counts[k] for k in FATES)
    return Tally(read=inserted + duplicates + quarantined, inserted=inserted, duplicates=duplicates,
                 quarantined=quarantined, events_until=counts["events_until"])  # fmt: skip


def write_quarantine(
    spark: SparkSession, config: Config, bad: DataFrame, run_id: str, ingested_at: dt.datetime
) -> None:
    """Append quarantine rows not stored before (keyed by stream, file and raw text)."""
    keyed = bad.withColumn("raw_hash", F.sha2(F.coalesce("raw", "source_file"), 256)).dropDuplicates(
        list(QUARANTINE.key)
    )
    stored = spark.table(config.table(QUARANTINE.name)).select(*QUARANTINE.key)
    new = keyed.join(stored, on=list(QUARANTINE.key), how="left_anti").select(
        "stream", "source_file", "raw", "reason", "raw_hash",
        F.lit(run_id).alias("run_id"), F.lit(ingested_at).alias("ingested_at"),
    )  # fmt: skip
    with _SHARED_WRITE:
        new.write.format("delta").mode("append").saveAsTable(config.table(QUARANTINE.name))


def file_rows(
    stream: str, files: list[LandingFile], failed: set[LandingFile], run_id: str, events_until: int | None
) -> Recorded:
    """The `ingest_files` rows of a batch's files."""
    return [(stream, str(f.path), f.size, f.modified_ms, "failed" if f in failed else "ingested", run_id,
             None if f in failed else events_until) for f in files]  # fmt: skip


def record_files(spark: SparkSession, config: Config, rows: Recorded) -> None:
    if rows:
        table = config.table(INGEST_FILES.name)
        spark.createDataFrame(rows, to_struct(INGEST_FILES)).write.format("delta").mode("append").saveAsTable(table)
        _note_recorded(spark, table, rows)


def _note_recorded(spark: SparkSession, table: str, rows: Recorded) -> None:
    """Add `rows`, just appended by this process, to what it knows of `table` if it knew the commit before (no
    other writer came between); else it knows nothing of the table any more."""
    with _NOTING:
        state = table_commit(spark, table)
        known = _RECORDED.pop(table, None)
        if known is not None and follows(state, known[0]):
            _RECORDED[table] = (state, known[1] | {(r[0], r[1], r[2], r[3]) for r in rows})


def record_run(spark: SparkSession, config: Config, run_id: str, tallies: dict[str, Tally]) -> None:
    finished = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    rows = [
        (run_id, s, t.started.replace(tzinfo=None), finished, t.files, t.files_failed, t.read, t.inserted,
         t.duplicates, t.quarantined)
        for s, t in tallies.items()
    ]  # fmt: skip
    table = config.table(INGEST_RUNS.name)
    spark.createDataFrame(rows, to_struct(INGEST_RUNS)).write.format("delta").mode("append").saveAsTable(table)
    appended(spark, table, [Row(**dict(zip(INGEST_RUNS.names, r, strict=True))) for r in rows], "finished_at")


def land_collect_runs(spark: SparkSession, config: Config, landing: Path, run_id: str) -> int:
    """`txn-recon collect`'s accounting rows not landed yet: a file per collect pass, named by its run id."""
    folder = landing / COLLECT_RUNS_DIR
    if not folder.is_dir():
        return 0
    table = create_table(spark, config, COLLECT_RUNS)
    paths = sorted(folder.glob("*.jsonl"))
    landed = spark.table(table).select("run_id")
    if config.ingest.archive:  # the files of landed runs were moved away: look up the ids of those still here
        landed = landed.where(F.col("run_id").isin([p.stem for p in paths]))
    known = {r["run_id"] for r in landed.distinct().collect()}
    rows = []
    for path in paths:
        if path.stem in known:
            continue
        try:
            docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            rows += [tuple(_collect_value(doc[f.name], f.type) for f in COLLECT_RUNS.fields) for doc in docs]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TxnReconError(f"{path} is not a collect run file ({type(e).__name__}: {e}); move it away") from None
    if rows:
        spark.createDataFrame(rows, to_struct(COLLECT_RUNS)).write.format("delta").mode("append").saveAsTable(table)
        log.info("collect_runs: %d rows landed", len(rows))
    if config.ingest.archive:
        archive(landing, [p.resolve() for p in paths], run_id)
    return len(rows)


def _collect_value(value: Any, kind: str) -> Any:
    return dt.datetime.fromisoformat(value) if kind == "timestamp" and value is not None else value


def summary(run_id: str, tallies: dict[str, Tally]) -> str:
    lines = [f"ingest {run_id}", f"{'stream':<8} {'files':>6} {'failed':>6} {'read':>10} {'inserted':>10} "
             f"{'duplicates':>10} {'quarantined':>11}"]  # fmt: skip
    for s, t in tallies.items():
        lines.append(f"{s:<8} {t.files:>6} {t.files_failed:>6} {t.read:>10} {t.inserted:>10} {t.duplicates:>10} "
                     f"{t.quarantined:>11}")  # fmt: skip
    return "\n".join(lines)


def _source_file() -> F.Column:
    """`_metadata.file_path` ("file:/a%20b/x") as a plain local path ("/a b/x"); '+' stays '+'. Only a
    name with escapes is decoded: decoding every row of a big file costs as much as reading it."""
    uri = F.col("_metadata.file_path")
    path = (
        F.when(uri.startswith("file:///"), F.substring(uri, 8, 1 << 20))
        .when(uri.startswith("file:/"), F.substring(uri, 6, 1 << 20))
        .otherwise(uri)
    )
    decoded = F.url_decode(F.replace(path, F.lit("+"), F.lit("%2B")))
    return F.when(path.contains("%"), decoded).otherwise(path).alias("_source_file")


def _failed_file_row(spark: SparkSession, stream: str, f: LandingFile, reason: str) -> DataFrame:
    return spark.createDataFrame([(stream, str(f.path), None, reason)],
                                 "stream string, source_file string, raw string, reason string")  # fmt: skip


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["ingest", *sys.argv[1:]]))
