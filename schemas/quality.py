"""Data-quality contracts: the expectation suites for bronze, silver, gold and the cross-table views,
and the `dq_results` table they fill. Plain data (no Great Expectations import): `jobs.quality` turns
each Expectation into a GE expectation configuration of the same type and arguments.

Suites are derived from the schema constants, so a new column gets its contract where it is defined.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.bronze import BRONZE
from schemas.findings import ANOMALY_TYPES
from schemas.landing import (
    COPY_KINDS,
    HALF_TOPIC_OF_OP,
    OP_BODY_CHARS,
    OP_BODY_EMPTY_ITEM,
    TOPOLOGY_KINDS,
    TRACE_TYPES,
)
from schemas.model import Field, Schema
from schemas.reconciled import ANOMALIES, DELIVERIES, OFFSET_COMMITS, TXN_LIFECYCLE

# Epoch milliseconds a RocketMQ timestamp may hold: not before 1970, not after 2100.
TIME_RANGE = (0, 4_102_444_800_000)
TIME_COLUMNS = frozenset({"store_timestamp", "born_timestamp", "commit_timestamp", "as_of"})
NON_NEGATIVE = frozenset({
    "queue_id", "queue_offset", "commit_log_offset", "real_queue_id", "check_immunity_seconds",
    "prepared_queue_offset", "prepared_transaction_offset", "body_size", "reconsume_times", "offset", "seq",
    "context_index",
    "copies", "check_times", "commit_count", "first_commit_queue_id", "first_commit_queue_offset", "retries",
    "duplicates_expected", "broker_id", "read_queues", "write_queues",
})  # fmt: skip

DELIVERY_STATUSES = ("CONSUMED", "DEAD_LETTERED", "UNDELIVERED", "POSSIBLY_UNDELIVERED", "PENDING")
STATES = ("COMMITTED", "ROLLED_BACK", "DISCARDED", "PENDING")
DISCARD_REASONS = ("MAX_CHECKS", "EXPIRED")
SNAPSHOT_KINDS = ("subscription", "queue")
TOPIC_REASONS = ("MISSING", "NOT_WRITABLE")  # TOPIC_NOT_ON_BROKER: no such topic, or none of its queues takes writes
# TRACE_CONTRADICTION: a check answer traced where we saw no check; consumed where we say a filter refused it.
CONTRADICTIONS = ("ANSWER_WITHOUT_CHECK", "CONSUMED_BUT_UNDELIVERED")
ANOMALY_REASONS = ("NO_HALF", "NO_OP", "AFTER_DISCARD", "OFFSET_MISMATCH", *DISCARD_REASONS, *TOPIC_REASONS,
                   *CONTRADICTIONS)  # fmt: skip
MAX_PERM = 15  # PermName: inherit 1, write 2, read 4, priority 8


@dataclass(frozen=True)
class Expectation:
    type: str  # a Great Expectations expectation type, e.g. expect_column_values_to_not_be_null
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def label(self) -> str:
        """A short, stable name for reports: the type and its column arguments."""
        cols = [str(v) for k, v in self.kwargs.items() if k in ("column", "column_A", "column_B")]
        if "column_list" in self.kwargs:
            cols.append("+".join(self.kwargs["column_list"]))
        return f"{self.type}({', '.join(cols)})"


@dataclass(frozen=True)
class Suite:
    name: str
    layer: str  # bronze, silver, gold: a table of that layer; cross: a view joining tables
    expectations: tuple[Expectation, ...]
    # Validated by what changed since the last validated version (the table keeps a Change Data Feed);
    # else whole, like a table rewritten by every run.
    incremental: bool = False
    key: tuple[str, ...] = ()  # the natural key: rows sharing one with a changed row are validated too
    # Columns never null whose ranges over the changed rows bound where those rows (and, beside the key, those
    # sharing a key with them) can be, so that they are looked for in the table's recent files. Without a key,
    # the changed rows still in the table are validated.
    bounded_by: tuple[str, ...] = ()


def _e(kind: str, **kwargs: Any) -> Expectation:
    return Expectation(f"expect_{kind}", kwargs)


def contract(schema: Schema) -> tuple[Expectation, ...]:
    """Schema, not-null, natural-key and range expectations every table of `schema` must meet."""
    out = [_e("table_columns_to_match_set", column_set=list(schema.names), exact_match=True)]
    out += [_e("column_values_to_not_be_null", column=name) for name in schema.required]
    if len(schema.key) == 1:
        out.append(_e("column_values_to_be_unique", column=schema.key[0]))
    elif schema.key:
        out.append(_e("compound_columns_to_be_unique", column_list=list(schema.key)))
    out += [_range(f) for f in schema.fields if _range(f) is not None]  # type: ignore[misc]
    return tuple(out)


def _range(f: Field) -> Expectation | None:
    if f.name in TIME_COLUMNS or f.name.endswith("_ts"):
        return _e("column_values_to_be_between", column=f.name, min_value=TIME_RANGE[0], max_value=TIME_RANGE[1])
    if f.name in NON_NEGATIVE:
        return _e("column_values_to_be_between", column=f.name, min_value=0)
    return None


def _problems(what: str) -> Expectation:
    """Cross-table views carry a `problem` column: null when the row checks out, else what is wrong
    (with the key, so the failing rows appear in the result sample and can be looked up in SQL)."""
    return Expectation("expect_column_values_to_be_null", {"column": "problem"}, description=what)


def suites(check_max: int) -> tuple[Suite, ...]:
    """Every suite, in the order they run. `check_max` is the broker's transactionCheckMax."""
    half, op, real, offset, consumer, copy, topology, trace = (
        BRONZE[s] for s in ("half", "op", "real", "offset", "consumer", "copy", "topology", "trace")
    )
    in_set = "column_values_to_be_in_set"
    half_topics, op_topics = sorted(HALF_TOPIC_OF_OP.values()), sorted(HALF_TOPIC_OF_OP)
    half_rows = (_check_times(1, check_max), _e(in_set, column="topic", value_set=half_topics))
    op_body = (
        _e(in_set, column="topic", value_set=op_topics),
        _e(in_set, column="tag", value_set=["d"]),
        _e("column_values_to_match_regex", column="body", regex=OP_BODY_CHARS),
        _e("column_values_to_not_match_regex", column="body", regex=OP_BODY_EMPTY_ITEM),
    )
    snapshot_rows = (_e(in_set, column="kind", value_set=list(SNAPSHOT_KINDS)),)
    copy_rows = (_e(in_set, column="kind", value_set=list(COPY_KINDS)),)
    topology_rows = (
        _e(in_set, column="kind", value_set=list(TOPOLOGY_KINDS)),
        _e("column_values_to_be_between", column="perm", min_value=0, max_value=MAX_PERM),
    )
    # A malformed context is quarantined by ingest, never stored.
    trace_rows = (_e(in_set, column="trace_type", value_set=list(TRACE_TYPES)),
                  _e("column_values_to_be_null", column="malformed"))  # fmt: skip
    lifecycle = (
        _e(in_set, column="state", value_set=list(STATES)),
        _e(in_set, column="reason", value_set=list(DISCARD_REASONS)),
        _check_times(0, check_max),
        _e(in_set, column="half_topic", value_set=half_topics),
        _e("column_pair_values_a_to_be_greater_than_b", column_A="last_copy_ts", column_B="first_copy_ts",
           or_equal=True, ignore_row_if="either_value_is_missing"),
    )  # fmt: skip
    anomalies = (
        _e(in_set, column="anomaly_type", value_set=list(ANOMALY_TYPES)),
        _e(in_set, column="reason", value_set=list(ANOMALY_REASONS)),
        _e("column_values_to_be_json_parseable", column="detail"),
    )
    deliveries = (_e(in_set, column="status", value_set=list(DELIVERY_STATUSES)),)
    commit_columns = tuple(f.name for f in OFFSET_COMMITS.fields if not f.nullable)
    # A message stream's key is a place in a broker's queue: one stored message, with one store time. Bounded by
    # it, the changed rows' keys are looked for in the files of their time (ingest writes in store-time order);
    # the key's own ranges span most files where queues and brokers differ in their offsets.
    stored = ("store_timestamp",)
    return (
        Suite(half.name, "bronze", contract(half) + half_rows, incremental=True, key=half.key, bounded_by=stored),
        Suite(op.name, "bronze", contract(op) + op_body, incremental=True, key=op.key, bounded_by=stored),
        Suite(real.name, "bronze", contract(real), incremental=True, key=real.key, bounded_by=stored),
        Suite(offset.name, "bronze", contract(offset), incremental=True, key=offset.key),
        Suite(consumer.name, "bronze", contract(consumer) + snapshot_rows, incremental=True, key=consumer.key),
        Suite(copy.name, "bronze", contract(copy) + copy_rows, incremental=True, key=copy.key, bounded_by=stored),
        Suite(topology.name, "bronze", contract(topology) + topology_rows, incremental=True, key=topology.key),
        Suite(trace.name, "bronze", contract(trace) + trace_rows, incremental=True, key=trace.key, bounded_by=stored),
        Suite(
            TXN_LIFECYCLE.name, "silver", contract(TXN_LIFECYCLE) + lifecycle, incremental=True, key=TXN_LIFECYCLE.key
        ),
        Suite(OFFSET_COMMITS.name, "silver", contract(OFFSET_COMMITS), incremental=True, bounded_by=commit_columns),
        Suite(ANOMALIES.name, "gold", contract(ANOMALIES) + anomalies, incremental=True, key=ANOMALIES.key),
        # A message's store time goes with its key, and the table's files follow store time.
        Suite(
            DELIVERIES.name,
            "gold",
            contract(DELIVERIES) + deliveries,
            incremental=True,
            key=DELIVERIES.key,
            bounded_by=("store_timestamp",),
        ),
        Suite("op_references", "cross", (_problems("every half offset an op lists is a known half copy"),)),
        Suite("commit_references", "cross", (_problems("every commit's prepared offset is a half copy"),)),
        Suite("lifecycle_totals", "cross", (_problems("lifecycle counts add up to the half and real counts"),)),
        Suite(
            "group_findings",
            "cross",
            (
                _problems(
                    "a consumer-group finding names its group (and queue) and counts a positive lag, window or skip"
                ),
            ),
        ),
    )


def _check_times(low: int, high: int) -> Expectation:
    return _e("column_values_to_be_between", column="check_times", min_value=low, max_value=high)


def suite_names() -> tuple[str, ...]:
    """The suites' names, which do not depend on the broker settings."""
    return tuple(s.name for s in suites(check_max=15))


DQ_RESULTS = Schema(
    "dq_results",
    (
        Field("run_id", "string"),
        Field("validated_at", "timestamp"),
        Field("suite", "string"),
        Field("layer", "string"),
        Field("table_version", "long", nullable=True, doc="the Delta version validated (null: a cross view)"),
        Field("scope", "string", doc="full, or incremental: the rows changed since the last validated version"),
        Field("expectation", "string", doc="type(columns), stable across runs"),
        Field("kwargs", "string", doc="the expectation's arguments as JSON"),
        Field("blocking", "boolean", doc="a failure makes `txn-recon quality` exit non-zero"),
        Field("success", "boolean"),
        Field("observed_value", "string", nullable=True),
        Field("element_count", "long", nullable=True, doc="rows validated"),
        Field("unexpected_count", "long", nullable=True),
        Field("unexpected_sample", "string", nullable=True, doc="up to 20 unexpected values, as JSON"),
    ),
)

LATEST_DOC = "JSON: per suite ever validated, [the run that validated it last, the version it validated or null]"
TOTALS_DOC = (
    "JSON: the as_of and table versions up to which lifecycle_totals last held, which the next run checks from;"
    " null when it failed or never ran"
)
QUALITY_RUNS = Schema(
    "quality_runs",
    (
        Field("run_id", "string"),
        Field("validated_at", "timestamp"),
        Field("finished_at", "timestamp"),
        Field("expectations", "long", doc="results this run appended to dq_results"),
        Field("failed", "long"),
        Field("blocking_failed", "long"),
        Field("suites", "string", doc="the suites it validated, comma-separated"),
        Field("latest", "string", doc=LATEST_DOC),
        Field("totals", "string", nullable=True, doc=TOTALS_DOC),
    ),
)
