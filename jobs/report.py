"""`txn-recon report [--out FILE]`: the reconciliation dashboard, one self-contained HTML file built from
the gold, silver and data-quality tables (DESIGN §4).

Spark aggregates; only small results (counts per time bucket, the oldest or latest few hundred rows)
reach the driver, and the `dashboard` package turns them into HTML with no further Spark.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F

from dashboard import page
from dashboard.charts import bucket_ms
from jobs import quality
from jobs.catalog import latest_rows, may_have_rows, table_exists
from jobs.config import Config
from jobs.errors import TxnReconError
from jobs.lock import warehouse_lock
from jobs.quality import LATEST_RUNS  # runs listed per kind of run, the latest first, as for quality's
from jobs.session import build_session
from schemas import LANDING
from schemas.quality import DELIVERY_STATUSES
from schemas.reconciled import BROKER_WINDOWS
from transforms.consumers import holders, islands, snapshots, subscription_text
from transforms.frames import Asking, gathered, kept_with_ranges, together, within
from transforms.lifecycle import ID
from transforms.topology import last_whole_window, window_totals

log = logging.getLogger(__name__)

Span = tuple[Any, Any]  # the least and greatest time of some rows (None, None: no rows with a time)
ROWS = 500  # rows per table on the page; the header says when there are more
INGEST_SUMS = ("files", "files_failed", "records_read", "inserted", "duplicates", "quarantined")  # per run
# The lifecycle's columns the states' chart and the op lag read.
LIFECYCLE_CHARTED = ("state", "born_ts", "first_copy_ts", "first_commit_ts", "resolved_ts")
PENDING_AGES = {"1m": 60_000, "10m": 600_000, "1h": 3_600_000, "1d": 86_400_000}  # metric label: at least this old
STUCK_AGE_BINS = ((0, "< 5 min"), (300_000, "5-15 min"), (900_000, "15-60 min"), (3_600_000, "1-6 h"),
                  (21_600_000, "6-24 h"), (86_400_000, "1-3 d"), (259_200_000, "> 3 d"))  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="HTML file to write (default: <warehouse>/_report/dashboard.html)")


def run(args: argparse.Namespace, config: Config) -> int:
    with warehouse_lock(config, "report"):
        spark = build_session(config)
        path = write_report(spark, config, args.out)
    print(f"dashboard: {path}")
    return 0


def default_path(config: Config) -> Path:
    return Path(config.warehouse) / "_report" / "dashboard.html"


def write_report(
    spark: SparkSession, config: Config, out: Path | None = None, reconciled: dict[str, Any] | None = None
) -> Path:
    """Gather and write the dashboard; `reconciled`, when given, is `gather_reconciled`'s part gathered
    already (`txn-recon serve` gathers it while the quality suites run)."""
    started = time.perf_counter()
    data = (gather_reconciled(spark, config) if reconciled is None else reconciled) | gather_quality(spark, config)
    path = write_page(out or default_path(config), data)
    log.info("report written to %s (%.1f s)", path, time.perf_counter() - started)
    return path


def write_page(path: Path, data: dict[str, Any]) -> Path:
    """Render gathered data and replace the page at `path` at once: a reader never sees half a page."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(page.render(data), encoding="utf-8")
    tmp.replace(path)
    return path


def gather(spark: SparkSession, config: Config) -> dict[str, Any]:
    """Everything the dashboard shows, as plain Python values."""
    return gather_reconciled(spark, config) | gather_quality(spark, config)


def _tables(spark: SparkSession, config: Config, names: Sequence[str]) -> dict[str, DataFrame]:
    return {n: spark.table(config.table(n)) for n in names if table_exists(spark, config.table(n))}


def gather_quality(spark: SparkSession, config: Config) -> dict[str, Any]:
    """The data-quality part of the dashboard: the latest result of every expectation, the latest runs."""
    shown = quality.latest_results(spark, config)
    return {"dq_latest": shown.latest, "dq_runs": shown.runs}


def gather_reconciled(spark: SparkSession, config: Config) -> dict[str, Any]:
    """Everything else the dashboard shows: what reconcile, ingest and collect wrote. It does not read
    `dq_results`, so it can be gathered while the quality suites run."""
    names = ("txn_lifecycle", "anomalies", "ingest_runs", "reconcile_runs", "collect_runs", "consumer_events",
             "deliveries", "delivery_counts", "trace_events", "real_events")  # fmt: skip
    t, needed = _tables(spark, config, names), ("txn_lifecycle", "anomalies")
    if any(n not in t for n in needed):
        raise TxnReconError("no reconciled tables yet; run `txn-recon reconcile` (or `txn-recon run`) first")
    # A table without rows is left out as a missing one is: the queries on it (a warehouse that collects no
    # consumer groups or trace has several such) found nothing and cost Spark jobs.
    t = {n: df for n, df in t.items() if n in needed or may_have_rows(spark, config.table(n))}
    # The latest run first: its as_of is the data time of every table here.
    reconcile_runs = _reconcile_runs(spark, config.table("reconcile_runs")) if "reconcile_runs" in t else []
    as_of = reconcile_runs[0]["as_of"] if reconcile_runs else None
    life = t["txn_lifecycle"].select(*LIFECYCLE_CHARTED)
    # Anomalies are few next to transactions: keep them, with their transaction's group and topic, in memory. The
    # lifecycle is first cut down to the transactions with a finding, streamed past their keys: joined whole, every
    # transaction was shuffled to meet a few thousand findings. The findings are read once for both (each scan of
    # the table costs Delta a file listing, a Spark job).
    found = t["anomalies"].persist()
    named = found.where(F.col("uniq_key").isNotNull()).select(*ID)
    txn = t["txn_lifecycle"].select(*ID, "producer_group", "real_topic", "state").join(named, on=ID, how="left_semi")
    keyed = found.join(txn, on=ID, how="left").persist()
    counts, deliveries = t.get("delivery_counts"), t.get("deliveries")
    try:
        # Every part's queries asked together, a round at a time: a Spark job a round, not one a query.
        (
            (op_lag, lifecycle_figures, states), (sums, anomalies), listed, stuck_age_bins, findings, trace, brokers,
            groups, (delivered, deliveries_over_time),
        ) = gathered(
            _lifecycle_charts(life, as_of), _anomalies(keyed), _listed(keyed), _age_bins(keyed), _findings(keyed),
            _trace(keyed, t.get("trace_events"), t.get("real_events"), as_of), _brokers(spark, config, as_of),
            _groups(t.get("consumer_events")), _deliveries(counts, deliveries, as_of),
        )  # fmt: skip
    finally:
        keyed.unpersist()
        found.unpersist()
    data: dict[str, Any] = {
        "database": config.database,
        "generated_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "as_of": as_of,
        "states": _totals(states),
        "anomaly_counts": _totals(anomalies),
        "states_over_time": states,
        "anomalies_over_time": anomalies,
    }
    data |= _anomaly_tables(stuck_age_bins, data["anomaly_counts"], listed)
    data |= _group_findings(data["anomaly_counts"], listed, sums)
    data["op_lag"] = op_lag
    contradictions = data["anomaly_counts"].get("TRACE_CONTRADICTION", 0)
    data["trace"] = trace | {"contradictions": listed["contradictions"], "contradictions_total": contradictions}
    last_window = brokers.pop("last_window")
    data |= brokers | _cluster_findings(data["anomaly_counts"], listed)
    data["ingest_runs"] = _ingest_runs(spark, config.table("ingest_runs")) if "ingest_runs" in t else []
    data["reconcile_runs"] = reconcile_runs
    data["collect_runs"] = _collect_runs(t.get("collect_runs"))
    data |= groups
    data["deliveries"], data["deliveries_over_time"] = delivered, deliveries_over_time
    # What `txn-recon serve` exports as metrics, from the same reads: a cycle reads each table once.
    data["figures"] = {"as_of": data["as_of"], **findings, **lifecycle_figures, "deliveries": data["deliveries"],
                       "trace": data["trace"], "last_window": last_window}  # fmt: skip
    return data


LATENCY_WINDOW_MS = 3_600_000  # consumption latency over the last hour of trace: Delta skips older files


def _trace(
    keyed: DataFrame, trace: DataFrame | None, real: DataFrame | None, as_of: int | None
) -> Asking[dict[str, Any]]:  # fmt: skip
    """What the message trace says (docs/concepts/trace.md): discards by cause, per group the traced duplicates
    (predicted by the offsets or not) and failed attempts, and the latency from a message's store time to its
    first traced attempt (p50, p99) over the last hour. The contradictions are a table of LISTED."""
    kind = F.col("anomaly_type")
    causes = keyed.where(kind == "DISCARDED_AFTER_MAX_CHECKS").groupBy(_detail("cause")).count()
    per_group = (
        keyed.where(kind.isin("DUPLICATE_CONSUMPTION", "CONSUME_FAILED"))
        .groupBy("consumer_group")
        .agg(
            F.count_if(kind == "DUPLICATE_CONSUMPTION").alias("duplicates"),
            F.count_if((kind == "DUPLICATE_CONSUMPTION") & (_detail("predicted") == "true")).alias("predicted"),
            F.count_if((kind == "DUPLICATE_CONSUMPTION") & (_detail("predicted") == "false")).alias("missed"),
            F.count_if(kind == "CONSUME_FAILED").alias("failed_messages"),
        )
    )
    discards, traced_groups = yield [causes, per_group]
    groups = {r["consumer_group"]: r.asDict() for r in traced_groups}
    if trace is not None and real is not None and as_of is not None:
        since = as_of - LATENCY_WINDOW_MS
        first, traced = kept_with_ranges(
            trace.where((F.col("trace_type") == "SubBefore") & (F.col("store_timestamp") >= since))
            .groupBy(F.col("group_name").alias("consumer_group"), "uniq_key")
            .agg(F.min(F.col("timestamp") + F.col("store_timestamp") - F.col("born_timestamp")).alias("first_at")),
            ["uniq_key"],
        )
        # Only the messages traced are looked up: none (no trace in the window) reads no message at all.
        stored = (
            within(real.where(F.col("store_timestamp") >= since - LATENCY_WINDOW_MS), traced)
            .groupBy("uniq_key")
            .agg(F.min("store_timestamp").alias("stored_at"))
        )
        latency = (F.col("first_at") - F.col("stored_at")) / 1000
        [latencies] = yield [first.join(stored, on="uniq_key").groupBy("consumer_group").agg(
            F.percentile_approx(latency, [0.5, 0.99]).alias("q"), F.count(F.lit(1)).alias("traced")
        )]  # fmt: skip
        for r in latencies:
            groups.setdefault(r["consumer_group"], {"consumer_group": r["consumer_group"]}).update(
                latency_p50_s=r["q"][0], latency_p99_s=r["q"][1], traced_last_hour=r["traced"]
            )
    columns = ("consumer_group", "latency_p50_s", "latency_p99_s", "traced_last_hour", "duplicates", "predicted",
               "missed", "failed_messages")  # fmt: skip
    rows = [{c: g.get(c, 0 if c in ("duplicates", "predicted", "missed", "failed_messages") else None)
             for c in columns} for _, g in sorted(groups.items())]  # fmt: skip
    return {
        "discard_causes": [
            {"cause": r["cause"] or "untraced", "discards": r["count"]}
            for r in sorted(discards, key=lambda r: r["cause"] or "")
        ],
        "groups": rows,
    }


def _findings(keyed: DataFrame) -> Asking[dict[str, list[dict[str, Any]]]]:
    """The findings per type and consumer group with the messages their UNDELIVERED findings count, and the
    cluster findings going on."""

    def lost(field: str) -> Column:
        return F.sum(F.when(F.col("anomaly_type") == "UNDELIVERED", _detail(field).cast("long"))).alias(field)

    per_group = keyed.groupBy("anomaly_type", "consumer_group").agg(
        F.count(F.lit(1)).alias("count"), lost("messages"), lost("at_most")
    )
    ongoing = keyed.where(
        F.col("anomaly_type").isin("TOPIC_NOT_ON_BROKER", "BROKER_WITHOUT_WRITES") & (_detail("ongoing") == "true")
    ).select("anomaly_type", "broker_name", "topic", _detail("cluster"))
    per_group_rows, ongoing_rows = yield [per_group, ongoing]
    return {"findings": [r.asDict() for r in per_group_rows], "ongoing": [r.asDict() for r in ongoing_rows]}


def _brokers(spark: SparkSession, config: Config, as_of: int | None) -> Asking[dict[str, Any]]:
    """Writes per broker over time (broker_windows, bucketed as the other charts), and every broker of the
    topology, at zero where it stored nothing; with them, each broker's writes in the last whole window before
    `as_of` (`last_window`), which the metrics export."""
    writes, brokers = yield from together(_broker_writes(spark, config, as_of), _topology_brokers(spark, config))
    return writes | brokers


def _broker_writes(spark: SparkSession, config: Config, as_of: int | None) -> Asking[dict[str, Any]]:
    out: dict[str, Any] = {"broker_writes": _no_times(), "last_window": []}
    table = config.table(BROKER_WINDOWS.name)
    if table_exists(spark, table):
        # Kept: the chart reads the totals twice (their span, then their buckets), and the last window once. The
        # windows up to as_of are all of them (reconcile wrote them as of it); so bounded, Delta picks the files by
        # their statistics, where a scan with no condition first reckons the table's size, a Spark job more.
        windows = spark.table(table)
        writes = window_totals(windows if as_of is None else windows.where(F.col("window_ts") <= as_of)).persist()
        window_ms = config.thresholds.idle_window_ms
        try:
            out["broker_writes"], out["last_window"] = yield from together(
                _per_bucket(writes, window_ms), _last_window(writes, as_of, window_ms)
            )
        finally:
            writes.unpersist()
    return out


def _last_window(writes: DataFrame, as_of: int | None, window_ms: int) -> Asking[list[dict[str, Any]]]:
    """(broker_name, messages) of each broker that stored some in the last whole window before `as_of`."""
    if as_of is None:
        return []
    [rows] = yield [writes.where(F.col("window_ts") == last_whole_window(as_of, window_ms))
                    .select("broker_name", "messages")]  # fmt: skip
    return [r.asDict() for r in rows]


def _topology_brokers(spark: SparkSession, config: Config) -> Asking[dict[str, Any]]:
    out: dict[str, Any] = {}
    topology = config.table("topology_events")
    if table_exists(spark, topology):
        out["brokers"] = []
        if may_have_rows(spark, topology):  # a query on a table without rows still runs jobs
            members = spark.table(topology).where("kind = 'broker' AND broker_id = 0")
            [names] = yield [members.select("broker_name").distinct()]
            out["brokers"] = sorted(r["broker_name"] for r in names)
    return out


def _cluster_findings(counts: dict[str, int], listed: Listed) -> dict[str, Any]:
    """The cluster findings' tables and totals."""
    return {
        "topic_gaps": listed["topic_gaps"],
        "topic_gaps_total": counts.get("TOPIC_NOT_ON_BROKER", 0),
        "idle_brokers": listed["idle_brokers"],
        "idle_brokers_total": counts.get("BROKER_WITHOUT_WRITES", 0),
    }


def _per_bucket(writes: DataFrame, window_ms: int) -> Asking[dict[str, Any]]:
    """Writes per (bucket, broker) of the per-window counts `writes`, the buckets sized as the other charts' but
    never shorter than a window."""
    [[span]] = yield [writes.agg(F.min("window_ts").alias("first"), F.max("window_ts").alias("last"))]
    if span["first"] is None:
        return _no_times()
    width = max(bucket_ms(span["first"], span["last"]), window_ms)
    bucket = (F.floor(F.col("window_ts") / width) * width).alias("bucket")
    [rows] = yield [writes.groupBy(bucket, "broker_name").agg(F.sum("messages").alias("n"))]
    return {"bucket_ms": width, "counts": [(int(r["bucket"]), r["broker_name"], r["n"]) for r in rows]}


def group_deliveries(counts: DataFrame | None, deliveries: DataFrame | None, as_of: int | None) -> list[dict[str, Any]]:
    """Per group: the messages it wants and what became of them (the README's query of the same), from
    `delivery_counts`; the oldest pending message, its age at `as_of`, is looked up in `deliveries` within the
    second the counts name (its files by store time: Delta skips the others)."""
    [(found, _)] = gathered(_group_deliveries(counts, deliveries, as_of))
    return found


def _deliveries(
    counts: DataFrame | None, deliveries: DataFrame | None, as_of: int | None
) -> Asking[tuple[list[dict[str, Any]], dict[str, Any]]]:  # fmt: skip
    """`group_deliveries`, and each group's chart of what became of its messages over time."""
    found, spans = yield from _group_deliveries(counts, deliveries, as_of)
    shown = [r["consumer_group"] for r in found]
    per_group = {}
    if counts is not None and shown:
        per_group = yield from _over_time_by(counts, F.col("second_ts"), "status", "consumer_group", F.col("messages"),
                                             spans)  # fmt: skip
    return found, {group: per_group.get(group, _no_times()) for group in shown}


def _group_deliveries(
    counts: DataFrame | None, deliveries: DataFrame | None, as_of: int | None
) -> Asking[tuple[list[dict[str, Any]], dict[str, Span]]]:
    """`group_deliveries`, and from the same pass each group's span of time (for its chart)."""
    if counts is None or deliveries is None:
        return [], {}
    status, n, second = F.col("status"), F.col("messages"), F.col("second_ts")
    per_group = counts.groupBy("consumer_group").agg(
        F.sum(n).alias("wanted"),
        *(F.sum(F.when(status == s, n).otherwise(0)).alias(s.lower()) for s in DELIVERY_STATUSES),
        F.min(F.when(status == "PENDING", second)).alias("_pending_since"),
        F.sum("retries").alias("retries"), F.sum("duplicates_expected").alias("duplicates_expected"),
        F.min(second).alias("_first"), F.max(second).alias("_last"),
    )  # fmt: skip
    # A row per group, every one, ordered here: ordering them in Spark cost a job of its own.
    [rows] = yield [per_group]
    rows = sorted(rows, key=lambda r: (r["consumer_group"] is not None, r["consumer_group"] or ""))
    since = [r["_pending_since"] for r in rows if r["_pending_since"] is not None]
    oldest: dict[str, int] = {}
    if since and as_of is not None:
        window = F.col("store_timestamp").between(min(since), max(since) + 999)
        pending = deliveries.where((status == "PENDING") & window).groupBy("consumer_group")
        [oldest_rows] = yield [pending.agg(F.min("store_timestamp"))]
        oldest = {r[0]: as_of - r[1] for r in oldest_rows}
    statuses = [s.lower() for s in DELIVERY_STATUSES]
    found = [
        {"consumer_group": r["consumer_group"], "wanted": r["wanted"], **{s: r[s] for s in statuses},
         "oldest_pending_ms": oldest.get(r["consumer_group"]), "retries": r["retries"],
         "duplicates_expected": r["duplicates_expected"]}
        for r in rows
    ]  # fmt: skip
    return found, {r["consumer_group"]: (r["_first"], r["_last"]) for r in rows}


def _anomaly_tables(stuck_age_bins: list[tuple[str, int]], counts: dict[str, int], listed: Listed) -> dict[str, Any]:
    return {
        "stuck_age_bins": stuck_age_bins,
        "stuck_oldest": listed["stuck_oldest"],
        "stuck_total": counts.get("STUCK_HALF", 0),
        "discarded": listed["discarded"],
        "discarded_total": counts.get("DISCARDED_AFTER_MAX_CHECKS", 0) + counts.get("DISCARDED_EXPIRED", 0),
        "orphaned": listed["orphaned"],
        "orphaned_total": counts.get("ORPHANED_COMMIT", 0),
        "duplicates": listed["duplicates"],
        "duplicates_total": counts.get("DUPLICATE_COMMIT", 0),
        "rechecked": listed["rechecked"],
        "rechecked_total": counts.get("RECHECKED_AFTER_RESOLUTION", 0),
        "regressions": listed["regressions"],
        "regressions_total": counts.get("OFFSET_REGRESSION", 0),
    }


def _group_findings(counts: dict[str, int], listed: Listed, sums: dict[str, int]) -> dict[str, Any]:
    """The consumer-group findings: conflicts, stranded queues, expected duplicates at hand-offs, jumps,
    messages parked in a dead-letter queue, and messages a tag filter kept from the group (`sums`: what
    `_keyed_pass` added up)."""
    out: dict[str, Any] = {}
    for name in GROUP_TABLES:
        out[name] = listed[name]
        out[f"{name}_total"] = counts.get(LISTED[name].types[0], 0)
    return out | sums


def _anomalies(keyed: DataFrame) -> Asking[tuple[dict[str, int], dict[str, Any]]]:
    """What the group findings add up to (`_keyed_pass`), and the findings over time."""
    span, sums = yield from _keyed_pass(keyed)
    over_time = yield from _over_time(keyed, F.col("event_ts"), "anomaly_type", span)
    return sums, over_time


def _keyed_pass(keyed: DataFrame) -> Asking[tuple[Span, dict[str, int]]]:
    """One pass over the findings: their span of event time (for their chart) and what the group findings add
    up to (the duplicates expected at hand-offs, the messages UNDELIVERED)."""
    kind = F.col("anomaly_type")
    estimate = F.get_json_object("detail", "$.duplicates_estimate").cast("long")
    lost = F.get_json_object("detail", "$.messages").cast("long")
    [[(first, last, duplicates, undelivered)]] = yield [keyed.agg(
        F.min("event_ts"), F.max("event_ts"), F.sum(F.when(kind == "REDELIVERY_AT_HANDOFF", estimate)),
        F.sum(F.when(kind == "UNDELIVERED", lost)),
    )]  # fmt: skip
    return (first, last), {"expected_duplicates": duplicates or 0, "undelivered_messages": undelivered or 0}


def _groups(consumer: DataFrame | None) -> Asking[dict[str, Any]]:
    """Members and subscriptions at each group's latest snapshot, and who held each queue when."""
    if consumer is None:
        return {"members": [], "ownership": [], "ownership_total": 0}
    latest = consumer.withColumn("_latest", F.max("snapshot_ts").over(Window.partitionBy("consumer_group")))
    now = latest.where(F.col("snapshot_ts") == F.col("_latest"))
    members = (
        now.groupBy("consumer_group", F.coalesce("client_id", F.concat(F.lit("(table of "), "broker_name",
                                                                        F.lit(")"))).alias("member"))
        .agg(F.concat_ws(", ", F.sort_array(F.collect_set(F.when(F.col("kind") == "subscription",
                                                                  subscription_text())))).alias("subscriptions"),
             F.count(F.when(F.col("kind") == "queue", 1)).alias("queues_held"),
             F.max("snapshot_ts").alias("snapshot_ts"))
        .orderBy("consumer_group", "member")
    )  # fmt: skip
    held = holders(consumer)
    snaps = snapshots(consumer).select("consumer_group", "snapshot_ts", "k")
    queue = ["consumer_group", "topic", "broker_name", "queue_id"]
    runs = islands(held.join(snaps, on=["consumer_group", "snapshot_ts"]), [*queue, "client_id"])
    ownership = (
        runs.groupBy(*queue, "client_id", "island")
        .agg(
            F.min("snapshot_ts").alias("from_ts"),
            F.max("snapshot_ts").alias("to_ts"),
            F.count(F.lit(1)).alias("snapshots"),
        )
        .drop("island")
    )
    listed, owned, [[total]] = yield [members.limit(ROWS), ownership.orderBy(*queue, "from_ts").limit(ROWS),
                                      ownership.agg(F.count(F.lit(1)))]  # fmt: skip
    return {"members": [r.asDict() for r in listed], "ownership": [r.asDict() for r in owned], "ownership_total": total}


@dataclass(frozen=True)
class Table:
    """A table of findings on the page: the first `limit` findings of `types` in `order` ("latest": the latest
    first; "oldest": the oldest stuck half first; "queue": by group, topic, broker, queue, then time), with `columns`
    (`detail.x`: that field of the JSON detail, as a string named x)."""

    types: tuple[str, ...]
    columns: tuple[str, ...]
    order: str = "latest"
    limit: int = ROWS


Listed = dict[str, list[dict[str, Any]]]  # table name -> its rows
TXN_COLUMNS = ("anomaly_type", "reason", "broker_name", "uniq_key", "producer_group", "real_topic", "state", "event_ts",
               "detail", "anomaly_id")  # fmt: skip
GROUP_TABLES = ("conflicts", "stranded", "handoffs", "jumps", "dead_letters", "undelivered")
LISTED = {
    "stuck_oldest": Table(("STUCK_HALF",), ("broker_name", "uniq_key", "age_ms", "producer_group", "detail.check_times",
                          "detail.broker_still_checking", "event_ts", "anomaly_id"), "oldest", 25),
    "discarded": Table(("DISCARDED_AFTER_MAX_CHECKS", "DISCARDED_EXPIRED"), TXN_COLUMNS),
    "orphaned": Table(("ORPHANED_COMMIT",), TXN_COLUMNS),
    "duplicates": Table(("DUPLICATE_COMMIT",), TXN_COLUMNS),
    "rechecked": Table(("RECHECKED_AFTER_RESOLUTION",), TXN_COLUMNS),
    "regressions": Table(("OFFSET_REGRESSION",), ("consumer_group", "topic", "queue_id", "broker_name", "event_ts",
                         "detail.from_offset", "detail.to_offset", "detail.redelivery_estimate",
                         "detail.client_before", "detail.client_after", "anomaly_id"), "queue"),
    "conflicts": Table(("SUBSCRIPTION_CONFLICT",), ("consumer_group", "broker_name", "event_ts", "detail.until",
                       "detail.ongoing", "detail.broker_table", "detail.members", "anomaly_id")),
    "stranded": Table(("STRANDED_QUEUE",), ("consumer_group", "topic", "queue_id", "broker_name", "detail.lag",
                      "detail.cause", "event_ts", "detail.until", "detail.ongoing", "anomaly_id")),
    "handoffs": Table(("REDELIVERY_AT_HANDOFF",), ("consumer_group", "topic", "queue_id", "broker_name", "event_ts",
                      "detail.old_holder", "detail.new_holders", "detail.from_offset", "detail.to_offset",
                      "detail.duplicates_estimate", "detail.old_holder_gone", "anomaly_id")),
    "jumps": Table(("OFFSET_JUMP",), ("consumer_group", "topic", "queue_id", "broker_name", "event_ts",
                   "detail.from_offset", "detail.to_offset", "detail.skipped", "anomaly_id")),
    "dead_letters": Table(("DEAD_LETTERED",), ("consumer_group", "topic", "queue_id", "broker_name", "uniq_key",
                          "event_ts", "detail.reconsume_times", "detail.transaction_id", "detail.dlq_topic",
                          "detail.dlq_queue_offset", "anomaly_id")),
    "undelivered": Table(("UNDELIVERED",), ("consumer_group", "topic", "queue_id", "broker_name", "event_ts",
                         "detail.until", "detail.messages", "detail.at_most", "detail.before_first_snapshot",
                         "detail.exact", "detail.refused_by", "detail.filters", "anomaly_id")),
    "contradictions": Table(("TRACE_CONTRADICTION",), ("reason", "broker_name", "uniq_key", "consumer_group",
                            "event_ts", "detail")),
    "topic_gaps": Table(("TOPIC_NOT_ON_BROKER",), ("broker_name", "topic", "reason", "detail.cluster", "detail.since",
                        "detail.until", "detail.served_by", "detail.fix", "anomaly_id")),
    "idle_brokers": Table(("BROKER_WITHOUT_WRITES",), ("broker_name", "detail.cluster", "detail.since", "detail.until",
                          "detail.windows", "detail.cluster_messages", "anomaly_id")),
}  # fmt: skip


def _listed(keyed: DataFrame) -> Asking[Listed]:
    """The rows of every table in LISTED, from one query over the findings: a query per table cost a Spark job
    or two each, some fifteen per cycle. Each finding belongs to one table at most."""
    kind, names = F.col("anomaly_type"), list(LISTED)
    table = functools.reduce(lambda c, n: c.when(kind.isin(*LISTED[n].types), n), names[1:],
                             F.when(kind.isin(*LISTED[names[0]].types), names[0]))  # fmt: skip

    def ordered(order: str, column: str) -> Column:  # null outside the tables in that order: no effect there
        return F.when(F.col("_table").isin(*[n for n, t in LISTED.items() if t.order == order]), F.col(column))

    rank = F.row_number().over(Window.partitionBy("_table").orderBy(
        ordered("latest", "event_ts").desc(), ordered("oldest", "age_ms").desc(),
        *[ordered("queue", c) for c in ("consumer_group", "topic", "broker_name", "queue_id", "event_ts")],
        "anomaly_id",
    ))  # fmt: skip
    limit = F.create_map(*[F.lit(v) for n, t in LISTED.items() for v in (n, t.limit)])[F.col("_table")]
    fields = dict.fromkeys(c for t in LISTED.values() for c in t.columns)
    columns = [_detail(_named(c)) if c.startswith("detail.") else F.col(c) for c in fields]
    [rows] = yield [
        keyed.withColumn("_table", table).where(F.col("_table").isNotNull())
        .withColumn("age_ms", _detail("age_ms").cast("long"))
        .withColumn("_rank", rank).where(F.col("_rank") <= limit)
        .select("_table", "_rank", *columns)
    ]  # fmt: skip
    out: Listed = {name: [] for name in LISTED}
    for r in sorted(rows, key=lambda r: r["_rank"]):
        out[r["_table"]].append({_named(c): r[_named(c)] for c in LISTED[r["_table"]].columns})
    return out


def _named(column: str) -> str:
    return column.removeprefix("detail.")


def _detail(field: str) -> Column:
    """One field of an anomaly's JSON detail, as a string column of that name."""
    return F.get_json_object("detail", f"$.{field}").alias(field)


def _totals(over_time: dict[str, Any]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for _, group, n in over_time["counts"]:
        totals[group] = totals.get(group, 0) + n
    return totals


def _over_time(df: DataFrame, ts: Column, group: str, span: Span | None = None) -> Asking[dict[str, Any]]:
    """Counts per (time bucket, group), with the bucket width chosen from the data's time span (`span`, the least
    and greatest `ts`, when an earlier pass over the rows found it)."""
    spans = None if span is None else {True: span}
    found = yield from _over_time_by(df.withColumn("_all", F.lit(True)), ts, group, "_all", spans=spans)
    return found.get(True, _no_times())


def _over_time_by(
    df: DataFrame, ts: Column, group: str, by: str, weight: Column | None = None,
    spans: dict[Any, Span] | None = None,
) -> Asking[dict[Any, dict[str, Any]]]:  # fmt: skip
    """`_over_time` of the rows of each value of `by` (its buckets sized to its own span), in two passes over
    `df` for every value together: the deliveries' charts, one per consumer group, took two passes each. With
    `weight`, each row counts that much (rows that are counts already). With `spans` (per value of `by`, the
    least and greatest `ts`, found by a pass that had to be made anyway), in one pass."""
    timed = df.select(
        F.col(by).alias("_by"), ts.alias("ts"), group, (F.lit(1) if weight is None else weight).alias("_n")
    )
    timed = timed.where(F.col("ts").isNotNull() & F.col("_by").isNotNull())
    if spans is None:
        [found] = yield [timed.groupBy("_by").agg(F.min("ts").alias("first"), F.max("ts").alias("last"))]
        spans = {r["_by"]: (r["first"], r["last"]) for r in found}
    widths = {value: bucket_ms(first, last) for value, (first, last) in spans.items()
              if value is not None and first is not None}  # fmt: skip
    if not widths:
        return {}
    width = F.create_map(*(F.lit(v) for pair in widths.items() for v in pair))[F.col("_by")]
    bucket = (F.floor(F.col("ts") / width) * width).alias("bucket")
    [counts] = yield [timed.groupBy("_by", bucket, group).agg(F.sum("_n").alias("count"))]
    out: dict[Any, dict[str, Any]] = {value: {"bucket_ms": w, "counts": []} for value, w in widths.items()}
    for r in counts:
        out[r["_by"]]["counts"].append((int(r["bucket"]), r[group], r["count"]))
    return out


def _no_times() -> dict[str, Any]:
    return {"bucket_ms": 1000, "counts": []}


def _lifecycle_charts(
    life: DataFrame, as_of: int | None
) -> Asking[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:  # fmt: skip
    """The lifecycle's part of the dashboard, in two passes over its rows: the first finds the charts' spans and
    the figures, the second fills both charts' buckets at once (grouping sets).

    - The op lag per time bucket of the commit: how long after a transaction's first final message the op
      resolving it was stored, the largest per bucket. A lag past the check timeout lets the check service reach
      committed transactions: the early warning of RECHECKED_AFTER_RESOLUTION and duplicate commits.
    - What the metrics show of it: the lag's quantiles in seconds ("0.5", "0.99", "1"), and the transactions
      pending at `as_of` at least each of PENDING_AGES old.
    - The states over time, by first copy, else first commit.

    Kept in memory for three passes instead, a million transactions took a second longer to keep than the
    third pass took to read them."""
    lag = F.col("resolved_ts") - F.col("first_commit_ts")
    shown = F.when(lag >= 0, F.col("first_commit_ts"))
    old = [F.count_if((F.col("state") == "PENDING") & (F.lit(as_of) - F.col("born_ts") >= ms)).alias(label)
           for label, ms in PENDING_AGES.items()] if as_of is not None else []  # fmt: skip
    seen = F.coalesce("first_copy_ts", "first_commit_ts")
    [[(first, last, quantiles, most, seen_first, seen_last, *pending)]] = yield [life.agg(
        F.min(shown), F.max(shown), F.percentile_approx(lag / 1000, [0.5, 0.99]), F.max(lag / 1000), F.min(seen),
        F.max(seen), *old,
    )]  # fmt: skip
    figures = {
        "op_lag_seconds": {} if most is None else {"0.5": quantiles[0], "0.99": quantiles[1], "1": most},
        "pending": dict(zip(PENDING_AGES, pending, strict=True)) if as_of is not None else {},
    }
    if first is None and seen_first is None:  # nothing to chart: no second pass
        return {"bucket_ms": 1000, "rows": []}, figures, _no_times()

    def bucket(ts: Column, span: Span) -> tuple[int, Column]:  # its width, and the bucket of ts (no span: none)
        if span[0] is None:
            return 1000, F.lit(None).cast("long")
        width = bucket_ms(*span)
        return width, F.floor(ts / width) * width

    lag_width, lag_bucket = bucket(F.col("first_commit_ts"), (first, last))
    seen_width, seen_bucket = bucket(seen, (seen_first, seen_last))
    sets = ["lag_bucket"], ["seen_bucket", "state"]
    [rows] = yield [
        life.select(F.when(lag >= 0, lag_bucket).alias("lag_bucket"), F.when(lag >= 0, lag).alias("lag"),
                    seen_bucket.alias("seen_bucket"), "state")
        .groupingSets(sets, "lag_bucket", "seen_bucket", "state")
        .agg(F.max("lag").alias("max_ms"), F.count(F.lit(1)).alias("n"), F.grouping_id().alias("set"))
    ]  # fmt: skip
    # grouping_id sets a bit per column left out of a row's set: 0b011 for the lag's buckets, 0b100 for the states'.
    by_lag = [r for r in rows if r["set"] == 0b011 and r["lag_bucket"] is not None]
    by_state = [r for r in rows if r["set"] == 0b100 and r["seen_bucket"] is not None]
    # A chart without a span has no rows, and the width 1000 of no times. Its buckets ordered here: a bucket per
    # row, and ordering them in Spark cost a job of its own.
    lags = {"bucket_ms": lag_width, "rows": sorted((int(r["lag_bucket"]), int(r["max_ms"])) for r in by_lag)}
    states = {"bucket_ms": seen_width, "counts": [(int(r["seen_bucket"]), r["state"], r["n"]) for r in by_state]}
    return lags, figures, states


def _age_bins(keyed: DataFrame) -> Asking[list[tuple[str, int]]]:
    """How many stuck halves are how old, in STUCK_AGE_BINS."""
    stuck = keyed.where(F.col("anomaly_type") == "STUCK_HALF").withColumn("age_ms", _detail("age_ms").cast("long"))
    label = F.lit(STUCK_AGE_BINS[0][1])
    for low, name in STUCK_AGE_BINS[1:]:
        label = F.when(F.col("age_ms") >= low, F.lit(name)).otherwise(label)
    [rows] = yield [stuck.groupBy(label.alias("bin")).count()]
    found = {r["bin"]: r["count"] for r in rows}
    return [(name, found.get(name, 0)) for _, name in STUCK_AGE_BINS]


def _ingest_runs(spark: SparkSession, table: str) -> list[dict[str, Any]]:
    """The latest ingest runs, their rows (one per stream) summed. A run's rows share its finish time and runs
    follow one another, so the latest rows, as many as the latest runs can hold, hold all of theirs; an older
    run among them may be there in part, and is left out. A service knows them from the cycle before and the run
    it appended (`jobs.catalog.latest_rows`)."""
    rows: dict[str, list[Row]] = {}
    for r in latest_rows(spark, table, "finished_at", LATEST_RUNS * len(LANDING)):
        rows.setdefault(r["run_id"], []).append(r)
    runs = [
        {"run_id": run, "started_at": min(r["started_at"] for r in theirs),
         "finished_at": max(r["finished_at"] for r in theirs), **{c: sum(r[c] for r in theirs) for c in INGEST_SUMS}}
        for run, theirs in rows.items()
    ]  # fmt: skip
    latest = sorted(runs, key=lambda run: run["finished_at"], reverse=True)[:LATEST_RUNS]
    return sorted(latest, key=lambda run: run["started_at"], reverse=True)


def _reconcile_runs(spark: SparkSession, table: str) -> list[dict[str, Any]]:
    """The latest reconcile runs: full or incremental (and why full), what they computed, how long. A service
    knows them from the cycle before and the run it appended (`jobs.catalog.latest_rows`)."""
    columns = ["finished_at", "mode", "reason", "as_of", "transactions", "queues"]
    return [{**{c: r[c] for c in columns}, "seconds": round((r["finished_at"] - r["started_at"]).total_seconds(), 1)}
            for r in latest_rows(spark, table, "finished_at", LATEST_RUNS)]  # fmt: skip


def _collect_runs(runs: DataFrame | None) -> list[dict[str, Any]]:
    """The latest collect passes per broker: what each read, the check service's backlog, and errors."""
    if runs is None:
        return []
    columns = ["finished_at", "broker_name", "status", "half", "op", "real", "discarded", "offset_records",
               "check_backlog", "op_backlog"]  # fmt: skip
    latest = runs.orderBy(F.desc("finished_at"), "broker_name").limit(LATEST_RUNS)
    errors = F.array_join("errors", "; ").alias("errors")
    return [r.asDict() for r in latest.select(*columns, errors).collect()]


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["report", *sys.argv[1:]]))
