"""What an incremental reconcile recomputes (DESIGN §2 rules, applied to a part). Pure DataFrame -> DataFrame.

A transaction's lifecycle depends only on its own events and on the ops listing its copies' offsets;
an offset commit only on its queue's commits. So a run recomputes the transactions with new events,
those whose copies a new op lists, and the ones still open (their state can change with time alone),
and the queues with new commits; every other row stays as the last run left it, as a full recompute
would leave it.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from transforms.anomalies import OFFSET_KEY
from transforms.frames import union_all
from transforms.lifecycle import (
    DISCARD_TOPIC,
    ID,
    LOOKUP,
    copy_lookups,
    earliest,
    facts,
    is_commit,
    op_offsets,
    open_transactions,
    resolutions,
)


def event_transactions(new_half: DataFrame, new_op: DataFrame, new_real: DataFrame, half_df: DataFrame) -> DataFrame:
    """(broker_name, uniq_key, since) of the transactions new events touch: new copies, commits or discard
    evidence, and copies that a new op lists. `since` is when the earliest of its new copies and evidence was
    stored (null when it has none: a copy an op lists is stored already)."""
    listed = op_offsets(new_op).select(*LOOKUP).distinct()
    evidence = is_commit() | ((F.col("topic") == DISCARD_TOPIC) & F.col("uniq_key").isNotNull())
    stored = F.col("store_timestamp").alias("since")
    return per_transaction(union_all([
        new_half.select(*ID, stored),
        new_real.where(evidence).select(*ID, stored),
        copy_lookups(half_df).join(F.broadcast(listed), on=LOOKUP, how="left_semi")
        .select(*ID, F.lit(None).cast("long").alias("since")),
    ]))  # fmt: skip


def stored_transactions(events: DataFrame, traced: DataFrame, lifecycle_df: DataFrame) -> DataFrame:
    """(broker_name, uniq_key, since) of the current lifecycle's rows to recompute, in one pass over it: the
    open ones, those new events touch (`event_transactions`) and those a newly landed trace names
    (`traced_keys`). `since` is when its stored facts begin (`stored_since`)."""
    marked = (
        lifecycle_df.join(F.broadcast(events.select(*ID, F.lit(True).alias("_event"))), on=ID, how="left")
        .join(F.broadcast(traced.select("uniq_key", F.lit(True).alias("_traced"))), on="uniq_key", how="left")
    )  # fmt: skip
    return marked.where(open_transactions() | F.col("_event") | F.col("_traced")).select(*ID, stored_since())


def traced_keys(new_trace: DataFrame) -> DataFrame:
    """The uniq_keys a newly landed send or end-request trace names: a trace message can be stored, or
    collected, long after the transaction it tells of."""
    return new_trace.where(F.col("trace_type").isin("Pub", "EndTransaction")).select("uniq_key").distinct()


def per_transaction(touched: DataFrame) -> DataFrame:
    """Transactions to recompute (`event_transactions`, `stored_transactions`), one row each, with the
    least `since`: no half copy or commit evidence of one, stored or new, is older."""
    return touched.groupBy(*ID).agg(F.min("since").alias("since"))


def stored_since() -> Column:
    """As "since": the earliest store time among a lifecycle row's facts (its first half copy, commit or
    discard record), null when it has none. Its halves and its commit evidence were stored no earlier."""
    return F.least("first_copy_ts", "first_commit_ts", "discard_ts").alias("since")


def from_since(df: DataFrame, since: int | None) -> DataFrame:
    """The rows of a bronze stream (half or real) stored at `since` or later: with `since` the least of some
    transactions' (`per_transaction`), all their facts can come from, and Delta reads only the files
    that can hold them. No `since` (no transaction has one): every row."""
    return df if since is None else df.where(F.col("store_timestamp") >= since)


def touched_queues(new_offset: DataFrame) -> DataFrame:
    """The consumer queues with new offset commits: their chains are recomputed whole."""
    return new_offset.select(*OFFSET_KEY).distinct()


def facts_of(keys: DataFrame, half_df: DataFrame, op_df: DataFrame, real_df: DataFrame) -> DataFrame:
    """`facts` of the transactions in `keys` only: the ops are cut down to the offsets of those transactions'
    copies before they are reduced."""
    half_k = half_df.join(F.broadcast(keys), on=ID, how="left_semi")
    needed = copy_lookups(half_k).select(*LOOKUP).distinct()
    resolved = earliest(op_offsets(op_df).join(F.broadcast(needed), on=LOOKUP, how="left_semi"))
    real_k = real_df.join(F.broadcast(keys), on=ID, how="left_semi")
    return facts(half_k, resolutions(half_k, resolved), real_k)
