"""Small helpers shared by transforms and jobs."""

import contextlib
import functools
import json
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Observation, Row
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import _create_converter_to_pandas

T = TypeVar("T")
# A computation that asks Spark some queries at a time (yields them) and is sent their rows, until it returns.
Asking = Generator[list[DataFrame], list[list[Row]], T]


def union_all(frames: list[DataFrame]) -> DataFrame:
    """Frames with the same columns, stacked (matched by name)."""
    return functools.reduce(DataFrame.unionByName, frames)


def any_of(conditions: Iterable[Column]) -> Column:
    """Whether any of the (at least one) conditions holds, with SQL's OR: null where none holds and one is null."""
    return functools.reduce(lambda a, b: a | b, conditions)


def differing(recomputed: DataFrame, stored: DataFrame, key: Sequence[str]) -> DataFrame:
    """The recomputed rows no stored row equals, each with `_new`: whether no stored row has its key (nulls
    equal throughout). Compared with the stored rows sharing their keys only, in one pass: a write of those
    alone reads and rewrites less, and most recomputed rows are as they were."""
    names, values = recomputed.columns, [c for c in recomputed.columns if c not in key]
    keys = F.broadcast(recomputed.select(*key)).alias("k")
    # As many as the recomputed rows at most: joined to them by a sort in the same job, where Spark broadcast
    # them (sized by the table), a job more.
    same = stored.alias("s").join(keys, on=_all_equal("s", "k", key), how="left_semi").hint("merge")
    pairs = recomputed.alias("r").join(same.select(*names, F.lit(True).alias("_stored")).alias("s"),
                                       on=_all_equal("r", "s", key), how="left")  # fmt: skip
    new = F.col("s._stored").isNull()
    return pairs.where(new | ~_all_equal("r", "s", values)).select(*[F.col(f"r.{c}") for c in names], new.alias("_new"))


def change_counts(column: str) -> list[Column]:
    """Metrics for `kept` of `differing` rows: how many are new ("added") and how many change a stored row
    ("updated"), and the least `column` of those ("earliest_updated") and of all ("earliest")."""
    new = F.col("_new")
    return [
        F.count_if(new).alias("added"), F.count_if(~new).alias("updated"),
        F.min(F.when(~new, F.col(column))).alias("earliest_updated"), F.min(column).alias("earliest"),
    ]  # fmt: skip


def _all_equal(left: str, right: str, columns: Sequence[str]) -> Column:
    """Every one of `columns` equal between the aliased frames `left` and `right`, nulls equal."""
    equal = [F.col(f"{left}.{c}").eqNullSafe(F.col(f"{right}.{c}")) for c in columns]
    return functools.reduce(lambda a, b: a & b, equal, F.lit(True))


def ranges(df: DataFrame, columns: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """The least and greatest value of each of `columns` in `df`: one small aggregate (an action)."""
    row = df.agg(*_bounds(columns)).first()
    assert row is not None  # an aggregate without grouping has one row
    return _ranges_of(row.asDict(), columns)


def kept(df: DataFrame, *metrics: Column) -> tuple[DataFrame, dict[str, Any]]:
    """`df` checkpointed (kept by the executors, its lineage cut) and `metrics`, named aggregates of its rows,
    observed in the pass that writes the checkpoint: they cost no job of their own. Its columns are new ones: a
    checkpoint keeps its source's column ids, and without adaptive execution Spark cannot resolve a join of the
    two (a table's rows with the kept keys of some of them)."""
    if metrics:
        seen = Observation()
        rows, got = df.observe(seen, *metrics).localCheckpoint(), seen.get
    else:
        rows, got = df.localCheckpoint(), {}
    return rows.select(*(F.col(c).alias(c) for c in rows.columns)), got


@contextlib.contextmanager
def cached_frames() -> Iterator[Callable[[DataFrame], DataFrame]]:
    """A `persist` for frames that several later jobs read: each is cached by the first job that reads it, where
    a checkpoint (`kept`) costs a Spark job of its own; all are unpersisted on leaving. Not for a frame whose
    metrics a plan waits for, nor one joined again with what it came from: a cached frame keeps its source's
    column ids, where a checkpoint's are new (cached so, the consumer queues' commits, joined again with the
    stored ones, left a warehouse whose next merge met repeated keys)."""
    held: list[DataFrame] = []

    def cache(df: DataFrame) -> DataFrame:
        held.append(df.persist())
        return held[-1]

    try:
        yield cache
    finally:
        for df in held:
            df.unpersist()


def kept_with_ranges(df: DataFrame, columns: Sequence[str]) -> tuple[DataFrame, dict[str, tuple[Any, Any]]]:
    """`df` kept, and its `ranges` of `columns` observed on the way."""
    rows, bounds, _ = kept_with_size(df, columns)
    return rows, bounds


def kept_with_size(df: DataFrame, columns: Sequence[str]) -> tuple[DataFrame, dict[str, tuple[Any, Any]], int]:
    """`df` kept, and its `ranges` of `columns` and its number of rows observed on the way."""
    rows, got = kept(df, row_count(), *_bounds(columns))
    return rows, _ranges_of(got, columns), got["rows"]


def row_count() -> Column:
    """A metric for `kept`: how many rows, as "rows"."""
    return F.count(F.lit(1)).alias("rows")


def _bounds(columns: Sequence[str]) -> list[Column]:
    return [f(c).alias(f"_{f.__name__}_{i}") for i, c in enumerate(columns) for f in (F.min, F.max)]


def _ranges_of(bounds: Mapping[str, Any], columns: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    return {c: (bounds[f"_min_{i}"], bounds[f"_max_{i}"]) for i, c in enumerate(columns)}


def within(df: DataFrame, bounds: Mapping[str, tuple[Any, Any]]) -> DataFrame:
    """The rows of `df` whose columns lie within `bounds` (`ranges` of some rows, by column name): all that
    can equal one of those rows on those columns, which is what a join on them keeps. The bounds are
    literals, so Delta skips the files whose statistics lie outside them (and Parquet its row groups): a
    few new keys are looked up in the recent files of a large table, not in all of it. No bound (the rows
    had no value there) keeps nothing, as no equality would."""
    if any(low is None for low, _ in bounds.values()):
        return df.where(F.lit(False))
    return df.where(functools.reduce(lambda a, b: a & b, [F.col(c).between(lo, hi) for c, (lo, hi) in bounds.items()],
                                     F.lit(True)))  # fmt: skip


def folds_empty(df: DataFrame) -> bool:
    """Whether Spark's optimizer reduces `df` to a relation without rows (a table without rows is read as one):
    its part of a plan runs no job. Checkpointed, it would be an RDD every plan using it reads or broadcasts."""
    plan = df._jdf.queryExecution().optimizedPlan()
    return bool(plan.getClass().getSimpleName() == "LocalRelation" and plan.data().isEmpty())


def detail_json(detail: Column) -> Column:
    """A detail struct as a JSON object, null fields included (a null says something here)."""
    return F.to_json(detail, {"ignoreNullFields": "false"})


def gathered(*asking: Asking[Any]) -> list[Any]:
    """What each of `asking` returns, run side by side (`together`), each round's queries collected in one Spark
    job: a query per action cost a job each, the gathering of the dashboard some twenty of them."""
    run = together(*asking)
    try:
        queries = next(run)
        while True:
            queries = run.send(collected(queries))
    except StopIteration as done:
        return list(done.value)
    finally:
        run.close()


def together(*asking: Asking[Any]) -> Asking[list[Any]]:
    """`asking` as one computation: each round asks what every one not done yet asks, and it returns what each
    returned."""
    results: list[Any] = [None] * len(asking)
    sent: dict[int, list[list[Row]] | None] = dict.fromkeys(range(len(asking)))
    try:
        while sent:
            asked: dict[int, list[DataFrame]] = {}
            for i, rows in sent.items():
                try:
                    asked[i] = asking[i].send(rows)  # type: ignore[arg-type]  # None first: a generator's start
                except StopIteration as done:
                    results[i] = done.value
            if not asked:
                break
            answers = iter((yield [q for queries in asked.values() for q in queries]))
            sent = {i: [next(answers) for _ in queries] for i, queries in asked.items()}
    finally:  # one failed: the others end too, releasing what they hold (a kept frame)
        for a in asking:
            a.close()
    return results


def collected(queries: list[DataFrame]) -> list[list[Row]]:
    """The rows of each of `queries`, in one Spark job: each row travels as JSON beside its query's number (its
    columns by position, so that names may repeat), and comes back as a Row of the query's columns: what
    `collect` gives, but that a nested row is a dict and a timestamp a string (a query asked alone is
    collected as it is)."""
    if len(queries) <= 1:
        return [q.collect() for q in queries]
    positional = [q.toDF(*[f"_{k}" for k in range(len(q.columns))]) for q in queries]
    packed = [
        q.select(F.lit(i), F.to_json(F.struct("*"), {"ignoreNullFields": "false"})) for i, q in enumerate(positional)
    ]
    out: list[list[Row]] = [[] for _ in queries]
    shapes = [Row(*q.columns) for q in queries]
    for i, row in functools.reduce(DataFrame.union, packed).collect():
        out[i].append(shapes[i](*json.loads(row).values()))
    return out


def to_pandas_together(queries: list[DataFrame], limit: int) -> list[Any]:
    """`toPandas` of each of `queries`, at most `limit` rows of each, in one Spark job: each query's rows travel
    as a struct column of their own beside the query's number, through Arrow, and each frame is converted as
    `toPandas` converts it (with Arrow; without, each query is fetched alone)."""
    spark = queries[0].sparkSession if queries else None
    if spark is None or len(queries) == 1 or spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") != "true":
        return [q.limit(limit).toPandas() for q in queries]
    positional = [q.toDF(*[f"_{k}" for k in range(len(q.columns))]) for q in queries]
    branches = [
        q.limit(limit).select(F.lit(i).alias("_q"), *[
            F.struct("*").alias(f"_{j}") if j == i else F.lit(None).cast(p.schema).alias(f"_{j}")
            for j, p in enumerate(positional)
        ])
        for i, q in enumerate(positional)
    ]  # fmt: skip
    # Arrow batches as toPandas gets them: `toArrow` casts to the union's schema, where a struct's fields may
    # not be null, which they are in the rows of the other queries.
    batches = functools.reduce(DataFrame.union, branches)._collect_as_arrow()  # type: ignore[operator]
    table = pa.Table.from_batches(batches) if batches else None
    timezone = spark.conf.get("spark.sql.session.timeZone")
    return [
        _as_pandas(None if table is None else table.filter(pc.equal(table["_q"], i)).column(f"_{i}"), q, timezone)
        for i, q in enumerate(queries)
    ]


def _as_pandas(rows: Any, query: DataFrame, timezone: str | None) -> Any:
    """A query's rows, an Arrow struct array, as `toPandas` (Arrow enabled, pyspark 4.1) gives them: no row gives
    untyped empty columns; else each column as Arrow converts it, then as Spark converts that for its type."""
    import pandas as pd

    if rows is None or len(rows) == 0:
        frame = pd.DataFrame(columns=query.columns)
    else:
        flat = pa.Table.from_struct_array(rows.combine_chunks())
        frame = flat.rename_columns([f"col_{k}" for k in range(flat.num_columns)]).to_pandas(
            date_as_object=True, coerce_temporal_nanoseconds=True
        )
        frame.columns = query.columns
    if not len(frame.columns):
        return frame
    mode = query.sparkSession.conf.get("spark.sql.execution.pandas.structHandlingMode")
    convert = [
        _create_converter_to_pandas(f.dataType, f.nullable, timezone=timezone,
                                    struct_in_pandas="dict" if mode == "legacy" else mode,
                                    error_on_duplicated_field_names=mode == "legacy")
        for f in query.schema.fields
    ]  # fmt: skip
    return pd.concat([c(column) for c, (_, column) in zip(convert, frame.items(), strict=True)], axis="columns")
