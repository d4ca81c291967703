"""What an incremental reconcile recomputes (DESIGN §2 rules, applied to a part). Pure DataFrame -> DataFrame.

A transaction's lifecycle depends only on its own events and on the ops listing its copies' offsets;
an offset commit only on its queue's commits. So a run recomputes the transactions with new events,
those whose copies a new op lists, and the ones still open (their state can change with time alone),
and the queues with new commits; every other row stays as the last run left it, as a full recompute
would leave it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
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


def touched_transactions(
    new_half: DataFrame, listed: DataFrame, new_real: DataFrame, half_df: DataFrame, lifecycle_df: DataFrame
) -> DataFrame:
    """(broker_name, uniq_key) of every transaction to recompute: new copies, commits or discard
    evidence; copies that a new op lists (`listed`: `listed_copies` of the new ops); and the open rows of
    the current lifecycle."""
    evidence = is_commit() | ((F.col("topic") == DISCARD_TOPIC) & F.col("uniq_key").isNotNull())
    return union_all([
        new_half.select(*ID),
        new_real.where(evidence).select(*ID),
        half_df.join(F.broadcast(listed), on=list(listed.columns), how="left_semi").select(*ID),
        lifecycle_df.where(open_transactions()).select(*ID),
    ]).distinct()  # fmt: skip


def traced_transactions(new_trace: DataFrame, lifecycle_df: DataFrame) -> DataFrame:
    """(broker_name, uniq_key) of the transactions a newly landed send or end-request trace names: a trace
    message can be stored, or collected, long after the transaction it tells of."""
    keys = new_trace.where(F.col("trace_type").isin("Pub", "EndTransaction")).select("uniq_key").distinct()
    return lifecycle_df.join(F.broadcast(keys), on="uniq_key", how="left_semi").select(*ID)


def touched_queues(new_offset: DataFrame) -> DataFrame:
    """The consumer queues with new offset commits: their chains are recomputed whole."""
    return new_offset.select(*OFFSET_KEY).distinct()


def facts_of(half_k: DataFrame, op_df: DataFrame, real_k: DataFrame) -> DataFrame:
    """`facts` of the transactions whose halves are `half_k` and whose messages are `real_k` (looked up by key
    already), from the whole op table: the ops are cut down to the offsets of those halves' copies before they
    are reduced."""
    needed = copy_lookups(half_k).select(*LOOKUP).distinct()
    resolved = earliest(op_offsets(op_df).join(F.broadcast(needed), on=LOOKUP, how="left_semi"))
    return facts(half_k, resolutions(half_k, resolved), real_k)
