"""Tables in the catalog database, created from `schemas` constants (never inferred)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import Column, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.config import Config
from schemas.model import Schema
from schemas.spark import to_struct

log = logging.getLogger(__name__)


def tables_in(spark: SparkSession, database: str) -> set[str]:
    """The names of the database's tables and views, in one catalog listing (temporary views left out)."""
    # Filtered here, not in Spark: a filter on the listing costs a Spark job.
    return {r["tableName"] for r in spark.sql(f"SHOW TABLES IN {database}").collect() if not r["isTemporary"]}


def create_table(
    spark: SparkSession,
    config: Config,
    schema: Schema,
    name: str | None = None,
    properties: Mapping[str, str] | None = None,
    cluster_by: tuple[str, ...] = (),
    stats_columns: tuple[str, ...] = (),
) -> str:
    """Create the Delta table for `schema` if it does not exist; return its catalog name."""
    table = config.table(name or schema.name)
    if table_exists(spark, table):  # a catalog lookup: Delta's create-if-missing reads the table's log too
        return table
    builder = DeltaTable.createIfNotExists(spark).tableName(table).addColumns(to_struct(schema))
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    if stats_columns:  # min/max statistics on every column cost a big write about a third of its time
        builder = builder.property("delta.dataSkippingStatsColumns", ",".join(stats_columns))
    if cluster_by:  # liquid clustering: OPTIMIZE lays the files out by these columns
        builder = builder.clusterBy(*cluster_by)
    builder.execute()
    return table


def ensure_view(spark: SparkSession, view: str, query: str) -> None:
    """Create the view, or replace it when it holds another query: replacing one costs about 0.4 s, mostly in
    resolving its query again, and a run that finds it as it was asks the metastore once."""
    catalog, identifier = _session_catalog(spark), _identifier(spark, view)
    if catalog.tableExists(identifier) and catalog.getTableMetadata(identifier).viewText().getOrElse(None) == query:
        return
    spark.sql(f"CREATE OR REPLACE VIEW {view} AS {query}")


def add_new_fields(spark: SparkSession, table: str, schema: Schema) -> list[str]:
    """Bring a table an older version wrote up to `schema`: the fields added since (nullable ones only),
    each stored as its default in the rows that predate it; their names are returned. For bronze, the
    record of what was landed: it is migrated in place, never rebuilt."""
    have = set(table_schema(spark, table).names)
    new = [f for f in to_struct(schema).fields if f.name not in have]
    if not new:
        return []
    log.warning("%s: adding the column(s) %s of this version", table, ", ".join(f.name for f in new))
    spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({', '.join(f'{f.name} {f.dataType.simpleString()}' for f in new)})")
    filled: dict[str, str | Column] = {f.name: F.lit(schema.defaults[f.name]) for f in new if f.name in schema.defaults}
    if filled:
        DeltaTable.forName(spark, table).update(set=filled)
    return [f.name for f in new]


def table_version(spark: SparkSession, table: str) -> int:
    """The Delta table's current version: its log brought up to date, as every query on it does. A run asks
    a few dozen times; reading the last history entry instead costs a Spark job each (about 0.15 s)."""
    return int(_snapshot(spark, table).version())


def table_identity(spark: SparkSession, table: str) -> tuple[str, int]:
    """The Delta table's id and current version: a table dropped and made again has another id, whatever its
    version."""
    table_id, version, _ = table_commit(spark, table)
    return table_id, version


def table_commit(spark: SparkSession, table: str) -> tuple[str, int, int]:
    """The table's id, version and that version's commit time: a version's rows never change, and a table
    copied back to an earlier version and written again reaches the same version by another commit."""
    snapshot = _snapshot(spark, table)
    return str(snapshot.metadata().id()), int(snapshot.version()), int(snapshot.timestamp())


# A run table -> (its latest commit, `table_commit`; the column its rows are ordered by; how many of the rows with
# the greatest values there were asked for, and those rows, greatest first: all of the table's when it held fewer).
_LATEST: dict[str, tuple[tuple[str, int, int], str, int, list[Row]]] = {}


def latest_rows(spark: SparkSession, table: str, order: str, n: int) -> list[Row]:
    """The `n` rows of a run table (rows appended per run) with the greatest `order`, greatest first. Without a
    Spark job when the table is as this process last read it or `appended` to it: a service reads the latest
    reconcile and quality runs every cycle, and its dashboard lists the latest runs (some three to five jobs and
    half a second each), and it wrote the latest itself."""
    state = table_commit(spark, table)
    known = _LATEST.get(table)
    if known is not None and known[:2] == (state, order) and (known[2] >= n or len(known[3]) < known[2]):
        return known[3][:n]
    pinned = spark.sql(f"SELECT * FROM {table} VERSION AS OF {state[1]}")
    rows = pinned.orderBy(F.desc(order)).limit(n).collect()
    _LATEST[table] = (state, order, n, rows)
    return rows


def latest_row(spark: SparkSession, table: str, order: str) -> Row | None:
    """The row of a run table with the greatest `order` (`latest_rows`); None when it has none."""
    rows = latest_rows(spark, table, order, 1)
    return rows[0] if rows else None


def follows(state: tuple[str, int, int], before: tuple[str, int, int]) -> bool:
    """Whether `state` (`table_commit`) is the commit right after `before`, of the same table: no other came between."""
    return state[0] == before[0] and state[1] == before[1] + 1


def appended(spark: SparkSession, table: str, rows: list[Row], order: str) -> None:
    """Note `rows`, which the caller appended with the table's latest commit holding the warehouse (no other
    writer), among the latest rows of `table` by `order` known at the commit before: they stay known with them.
    Known at an earlier commit or by another order, they are not known any more."""
    state = table_commit(spark, table)
    known = _LATEST.pop(table, None)
    if known is not None and known[1] == order and follows(state, known[0]):
        latest = sorted([*rows, *known[3]], key=lambda r: r[order], reverse=True)
        _LATEST[table] = (state, order, known[2], latest[: known[2]])


def may_have_rows(spark: SparkSession, table: str, version: int | None = None) -> bool:
    """False when the Delta table holds no data file by the checksum of its version (the current one, or
    `version` when that is current), which Delta writes with some commits, a table's creation among them; True
    otherwise. No Spark job: counting its files from the log would run some, which a query on the table then
    could not reuse."""
    checksum = _checksum(spark, table, version)
    return checksum is None or int(checksum.numFiles()) > 0


def stored_bytes(spark: SparkSession, table: str, version: int) -> int | None:
    """The bytes of the Delta table's data files at `version` by its checksum, when that is the current
    version and has one; else None. No Spark job."""
    checksum = _checksum(spark, table, version)
    return None if checksum is None else int(checksum.tableSizeBytes())


def _checksum(spark: SparkSession, table: str, version: int | None) -> Any:
    """The checksum Delta wrote with the table's current version, if it did and that is `version` (when given)."""
    snapshot = _snapshot(spark, table)
    checksum = snapshot.checksumOpt()
    if not checksum.isDefined() or (version is not None and int(snapshot.version()) != version):
        return None
    return checksum.get()


def table_schema(spark: SparkSession, table: str) -> T.StructType:
    """The Delta table's columns, from its log: resolving a query on it costs several metastore lookups more."""
    return _schema(_snapshot(spark, table))


def _schema(snapshot: Any) -> T.StructType:
    return T.StructType.fromJson(json.loads(snapshot.schema().json()))


def table_exists(spark: SparkSession, table: str) -> bool:
    """Whether the catalog holds the table or view (not a temporary view): one metastore lookup, about a fifth
    of what `spark.catalog.tableExists` costs, which also loads a Delta table through its connector."""
    return bool(_session_catalog(spark).tableExists(_identifier(spark, table)))


def history(spark: SparkSession, table: str, since: int) -> list[dict[str, Any]]:
    """The Delta table's commits after version `since`, latest first: version, operation and its parameters,
    as DESCRIBE HISTORY gives them, each read from its commit file in the log: no Spark job, where that query
    runs two. A commit whose file is gone (the log cleaned up) or holds no commit info has operation None."""
    snapshot = _snapshot(spark, table)
    log = snapshot.deltaLog()
    conf = log.newDeltaHadoopConf()
    return [_commit(spark, log, conf, version) for version in range(int(snapshot.version()), since, -1)]


# Column types whose statistics Delta stores as their values (a long string's as bounds of it).
_RANGED = (T.StringType, T.IntegerType, T.LongType, T.ShortType, T.ByteType)


def change_ranges(
    spark: SparkSession, table: str, since: int, version: int, columns: Sequence[str]
) -> tuple[dict[str, tuple[Any, Any]], int] | None:  # fmt: skip
    """Ranges of some of `columns` (as `transforms.frames.ranges` gives them) that hold every row the commits
    after version `since` up to `version`, the current one, added or rewrote (what their change data feed
    inserts or updates), and a number of rows at least theirs: from the statistics of the files those commits
    added, read from the log with no Spark job. They are the whole files' ranges (a merge rewrites a file with
    its other rows), wider than the changed rows' own, which a lookup within them only reads a little more of.
    A column some file has no statistics on, or of another type than a string or an integer, is left out: any
    value may be changed there. With no file added, every column has no range, as with no changed row.

    None when the feed of those commits cannot be read (the table does not record change data, or a commit
    changed its properties or columns), a commit is gone from the log, or `version` is not the current one."""
    snapshot = _snapshot(spark, table)
    recording = snapshot.metadata().configuration().get("delta.enableChangeDataFeed")
    if int(snapshot.version()) != version or not (recording.isDefined() and recording.get().lower() == "true"):
        return None
    fields = {f.name: f.dataType for f in _schema(snapshot).fields}
    bounded = {c for c in columns if isinstance(fields.get(c), _RANGED)}
    log = snapshot.deltaLog()
    conf = log.newDeltaHadoopConf()
    store, as_java = log.store(), spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava  # type: ignore[union-attr]
    low: dict[str, Any] = dict.fromkeys(columns)
    high: dict[str, Any] = dict.fromkeys(columns)
    rows = 0
    for v in range(since + 1, version + 1):
        path = spark._jvm.org.apache.spark.sql.delta.util.FileNames.unsafeDeltaFile(log.logPath(), v)  # type: ignore[union-attr]
        if not path.getFileSystem(conf).exists(path):
            return None
        for line in as_java(store.read(path, conf)):
            action = json.loads(line)
            if "metaData" in action:
                return None
            add = action.get("add")
            if add is None or not add.get("dataChange", True):
                continue  # a compaction's files hold no change
            stats = json.loads(add.get("stats") or "{}")
            if "numRecords" not in stats:
                return None
            rows += stats["numRecords"]
            for c in list(bounded):
                lo, hi = stats.get("minValues", {}).get(c), stats.get("maxValues", {}).get(c)
                if stats.get("nullCount", {}).get(c) == stats["numRecords"]:
                    continue  # no value in this file: no bound from it
                if lo is None or hi is None:
                    bounded.discard(c)
                    continue
                low[c] = lo if low[c] is None else min(low[c], lo)
                high[c] = hi if high[c] is None else max(high[c], hi)
    return {c: (low[c], high[c]) for c in columns if c in bounded}, rows


def _commit(spark: SparkSession, log: Any, conf: Any, version: int) -> dict[str, Any]:
    """One commit as `history` lists it."""
    jvm: Any = spark._jvm
    delta = jvm.org.apache.spark.sql.delta
    path = delta.util.FileNames.unsafeDeltaFile(log.logPath(), version)
    info = (
        delta.DeltaHistoryManager.getCommitInfoOpt(log.store(), path, conf)
        if path.getFileSystem(conf).exists(path)
        else None
    )
    if info is None or info.isEmpty():
        return {"version": version, "operation": None, "operationParameters": {}}
    # Stored JSON-encoded ("\"[]\""), decoded as DESCRIBE HISTORY shows them.
    parameters = delta.actions.CommitInfo.getLegacyPostDeserializationOperationParameters(
        info.get().operationParameters()
    )
    as_java = jvm.scala.jdk.javaapi.CollectionConverters.asJava
    return {"version": version, "operation": info.get().operation(), "operationParameters": dict(as_java(parameters))}


def _snapshot(spark: SparkSession, table: str) -> Any:
    log, _ = _log(spark, table)
    none = spark._jvm.scala.Option.empty()  # type: ignore[union-attr]
    return log.update(False, none, none)  # update(stalenessAcceptable, checkIfUpdatedSinceTs, table)


def _log(spark: SparkSession, table: str) -> tuple[Any, Any]:
    """The table's Delta log and catalog entry, found from one metastore lookup: `DeltaTable.forName` makes
    some four (about 85 ms against 18)."""
    metadata = _session_catalog(spark).getTableMetadata(_identifier(spark, table))
    return spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, metadata), metadata  # type: ignore[union-attr]


def _session_catalog(spark: SparkSession) -> Any:
    return spark._jsparkSession.sessionState().catalog()


def _identifier(spark: SparkSession, table: str) -> Any:
    return spark._jsparkSession.sessionState().sqlParser().parseTableIdentifier(table)


# A file below this size is small: compaction joins such files and leaves larger ones as they are.
SMALL_FILE_BYTES = 1024 * 1024


def compact(spark: SparkSession, table: str) -> tuple[int, int]:
    """Join the table's small files (OPTIMIZE; on a clustered table it also lays the new ones out by the
    clustering columns); return the files removed and added. Every row stays as it was, so reconcile and
    quality go on incrementally across it."""
    key = "spark.databricks.delta.optimize.minFileSize"
    before = spark.conf.get(key, None)
    spark.conf.set(key, str(SMALL_FILE_BYTES))
    try:
        metrics = spark.sql(f"OPTIMIZE {table}").select("metrics.numFilesRemoved", "metrics.numFilesAdded").first()
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    return (0, 0) if metrics is None else (int(metrics[0]), int(metrics[1]))
