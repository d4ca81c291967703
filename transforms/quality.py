"""The DataFrames the data-quality suites validate beyond whole tables. Pure DataFrame -> DataFrame.

Cross-table views have one row per thing checked and a `problem` column: null when it checks out,
else a sentence naming the key, so a failed expectation's sample says where to look.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.landing import ROCKSDB_HALF_TOPIC
from transforms.frames import union_all
from transforms.lifecycle import DISCARD_TOPIC, ID, is_commit, resolved_offsets, up_to

TOTALS = {  # lifecycle_totals: what silver must carry over from bronze, by the name its rows give it
    "copies": "half copies",
    "transactions": "transactions with a half",
    "commits": "commits",
    "discards": "transactions with discard evidence",
    "offsets": "offset commits",
}


def changed_rows(table_df: DataFrame, changed_df: DataFrame, key: Sequence[str], few: bool = False) -> DataFrame:
    """What to validate after a change: the table's rows a change added or rewrote. With a natural key, every
    row whose key a changed row has, so a new duplicate of an old key is caught; without one, the changed
    rows still in the table (not those a later change removed or rewrote again). The keys of `few` changed
    rows are sent to every task, so the table's rows are looked up where they lie, with no shuffle."""
    if key:
        keys = changed_df.select(*key)
        return table_df.join(F.broadcast(keys) if few else keys.distinct(), on=list(key), how="left_semi")
    return table_df.intersectAll(changed_df.select(*table_df.columns))


def prepared_halves(real_df: DataFrame) -> DataFrame:
    """(broker_name, commit_log_offset): the half copies the commits name by their prepared offset."""
    committed = real_df.where(is_commit() & F.col("prepared_transaction_offset").isNotNull())
    return committed.select("broker_name", F.col("prepared_transaction_offset").alias("commit_log_offset"))


def op_references(op_df: DataFrame, half_df: DataFrame) -> DataFrame:
    """One row per half offset listed by an op; a problem when no half copy has that offset. The copies are
    joined by a sort, as Spark joins a large table's (so is `commit_references`'): a small warehouse's were
    broadcast, sized by the table, a Spark job more in a quality run."""
    copies = half_df.select("broker_name", "queue_id", F.col("queue_offset").alias("half_offset"),
                            F.lit(True).alias("_known")).distinct().hint("merge")  # fmt: skip
    listed = resolved_offsets(op_df).join(copies, on=["broker_name", "queue_id", "half_offset"], how="left")
    problem = F.format_string(
        "op on %s queue %d lists half offset %d: no such half copy", "broker_name", "queue_id", "half_offset"
    )
    return listed.select("broker_name", "queue_id", "half_offset", F.when(F.col("_known").isNull(), problem)
                         .alias("problem"))  # fmt: skip


def commit_references(real_df: DataFrame, half_df: DataFrame) -> DataFrame:
    """One row per commit carrying a prepared offset; a problem when no half copy of the same
    transaction sits at that commit-log offset."""
    copies = half_df.select("broker_name", F.col("commit_log_offset").alias("prepared_transaction_offset"),
                            F.col("uniq_key").alias("_copy_of")).hint("merge")  # fmt: skip
    committed = real_df.where(is_commit() & F.col("prepared_transaction_offset").isNotNull())
    joined = committed.join(copies, on=["broker_name", "prepared_transaction_offset"], how="left")
    problem = F.format_string(
        "commit %s/%s at %s queue %d offset %d: prepared offset %d is %s", "broker_name", "uniq_key", "topic",
        "queue_id", "queue_offset", "prepared_transaction_offset",
        F.when(F.col("_copy_of").isNull(), F.lit("no half copy")).otherwise(F.concat(F.lit("a copy of "), "_copy_of")),
    )  # fmt: skip
    matches = F.col("_copy_of").eqNullSafe(F.col("uniq_key"))
    return joined.select(*ID, "topic", "queue_id", "queue_offset", F.when(~matches, problem).alias("problem"))


def lifecycle_totals(
    lifecycle_df: DataFrame,
    offset_commits_df: DataFrame,
    half_df: DataFrame,
    real_df: DataFrame,
    offset_df: DataFrame,
    as_of: int,
) -> DataFrame:
    """One row per count that silver must carry over from bronze up to `as_of`; a problem when the two
    differ (a transaction lost or double-counted between the layers). Reads every table whole:
    `lifecycle_gains` checks what changed since a check that held."""
    half = half_df.transform(up_to(as_of, "store_timestamp"))
    real = real_df.transform(up_to(as_of, "store_timestamp"))
    discard_txn = F.when(_evidence(), F.struct(*ID))
    bronze = (
        half.agg(F.count(F.lit(1)).alias("copies"), F.count_distinct(*ID).alias("transactions"))
        .crossJoin(
            real.agg(F.count(F.when(is_commit(), 1)).alias("commits"), F.count_distinct(discard_txn).alias("discards"))
        )
        .crossJoin(offset_df.transform(up_to(as_of, "commit_timestamp")).agg(F.count(F.lit(1)).alias("offsets")))
    )
    silver = lifecycle_df.agg(
        F.sum("copies").alias("copies"),
        F.count(F.when(F.col("copies") > 0, 1)).alias("transactions"),
        F.sum("commit_count").alias("commits"),
        F.count_if(_evidenced_discard()).alias("discards"),
    ).crossJoin(offset_commits_df.agg(F.count(F.lit(1)).alias("offsets")))
    pairs = bronze.select([F.col(c).alias(f"b_{c}") for c in TOTALS]).crossJoin(
        silver.select([F.coalesce(c, F.lit(0)).alias(f"s_{c}") for c in TOTALS])
    )
    rows = pairs.select(F.explode(F.array(*[
        F.struct(F.lit(name).alias("check"), F.lit(None).cast("string").alias("transaction"),
                 F.col(f"b_{c}").cast("long").alias("bronze"), F.col(f"s_{c}").cast("long").alias("silver"))
        for c, name in TOTALS.items()
    ])).alias("r")).select("r.*")  # fmt: skip
    problem = F.format_string("%s as of %d: %d in bronze, %d in silver", "check", F.lit(as_of), "bronze", "silver")
    return rows.withColumn("problem", F.when(F.col("bronze") != F.col("silver"), problem))


def _evidence() -> Column:
    """A real record that is discard evidence: a copy in TRANS_CHECK_MAX_TIME_TOPIC of a known message."""
    return (F.col("topic") == DISCARD_TOPIC) & F.col("uniq_key").isNotNull()


def _evidenced_discard() -> Column:
    """A lifecycle row discarded on evidence: a RIP-82 broker's discards are inferred and leave none."""
    return F.col("discard_ts").isNotNull() & ~F.coalesce(F.col("half_topic") == ROCKSDB_HALF_TOPIC, F.lit(False))


def _change_sign() -> Column:
    """+1 for a row a Change Data Feed row adds (an insert, an update's new image), -1 for one it removes."""
    return F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)


def gained(
    df: DataFrame, changes: DataFrame, time_col: str, since: int, as_of: int, saw_all: bool = False
) -> DataFrame:
    """The rows of bronze table `df` that a count up to `as_of` holds and one up to `since` at an earlier
    version did not, each with `_sign` (+1, or -1 for a row that version held and this one does not):
    the rows stored after `since`, and those at or before it that `changes` (the table's Change Data Feed
    since that version) added or removed. Both reach only recent files as a rule, by their times. When that
    version held no row after `since` (`saw_all`), every row stored after it came since, and `changes` alone
    tell them: the table is not read."""
    t = F.col(time_col)
    if saw_all:
        return changes.where(t <= as_of).select(*df.columns, _change_sign().alias("_sign"))
    return (
        df.where((t > since) & (t <= as_of))
        .withColumn("_sign", F.lit(1))
        .unionByName(changes.where(t <= since).select(*df.columns, _change_sign().alias("_sign")))
    )


def _per_transaction(half_gained: DataFrame, real_gained: DataFrame, lifecycle_changes: DataFrame) -> DataFrame:
    """Per transaction that either layer changed since a check: the half copies, commits and discard evidence
    bronze gained (`gained` rows), and what silver gained (its Change Data Feed): copies, commits, the
    change in its discards on evidence (-1, 0, +1), and `discarded` whether it holds one now (null when its
    row did not change)."""
    sign = F.col("_sign")
    bronze = union_all([
        half_gained.select(*ID, sign.alias("copies"), F.lit(0).alias("commits"), F.lit(0).alias("evidence")),
        real_gained.where(is_commit() | _evidence()).select(
            *ID, F.lit(0).alias("copies"), F.when(is_commit(), sign).otherwise(0).alias("commits"),
            F.when(_evidence(), sign).otherwise(0).alias("evidence")),
    ]).groupBy(*ID).agg(*[F.sum(c).alias(f"b_{c}") for c in ("copies", "commits", "evidence")])  # fmt: skip
    change, flag = _change_sign(), _evidenced_discard()
    silver = lifecycle_changes.groupBy(*ID).agg(
        F.sum(change * F.col("copies")).alias("s_copies"),
        F.sum(change * F.col("commit_count")).alias("s_commits"),
        F.sum(change * flag.cast("int")).alias("s_discards"),
        # The last image (an update's new one after its old one) says what the row holds now.
        F.max_by((change > 0) & flag, F.struct("_commit_version", change)).alias("discarded"),
    )
    b, s = bronze.alias("b"), silver.alias("s")
    joined = b.join(s, on=[F.col(f"b.{c}").eqNullSafe(F.col(f"s.{c}")) for c in ID], how="full")
    keys = [F.coalesce(f"b.{c}", f"s.{c}").alias(c) for c in ID]
    counts = [F.coalesce(c, F.lit(0)).cast("long").alias(c)
              for c in ("b_copies", "b_commits", "b_evidence", "s_copies", "s_commits", "s_discards")]  # fmt: skip
    return joined.select(*keys, *counts, "discarded")


def _discards_of(lifecycle_df: DataFrame, real_gained: DataFrame, lifecycle_changes: DataFrame) -> DataFrame:
    """(broker_name, uniq_key, _now: whether it is discarded on evidence) from the lifecycle, for the transactions
    with new discard evidence whose row did not change (a second discard: rare). None, as a rule: Spark then
    reads no lifecycle file."""
    keys = real_gained.where(_evidence() & (F.col("_sign") > 0)).select(*ID).distinct()
    unchanged = keys.join(lifecycle_changes.select(*ID), on=ID, how="left_anti")
    found = lifecycle_df.join(F.broadcast(unchanged), on=ID, how="left_semi")
    return found.select(*ID, _evidenced_discard().alias("_now"))


def lifecycle_gains(
    lifecycle_df: DataFrame, lifecycle_changes: DataFrame, commit_changes: DataFrame,
    half_gained: DataFrame, real_gained: DataFrame, offsets_gained: DataFrame, since: int, as_of: int,
) -> DataFrame:  # fmt: skip
    """`lifecycle_totals` from a check that held (up to `since`) to `as_of`, from what changed: the bronze rows
    `gained`, and the Change Data Feeds of the lifecycle and the offset commits since. A row per count a
    transaction gained in either layer, a problem when the layers gained differently, and one row for the
    offset commits. Where all agree, the totals still do: each is a sum of the transactions' counts, and the
    transactions with a half are those with copies. A transaction's discard on evidence is a flag, not a
    count: new evidence must leave one in silver, and silver may gain one only with new evidence."""
    # The discards joined by a sort, not broadcast: sized by the lifecycle they come from, they were, a job more.
    rows = (
        _per_transaction(half_gained, real_gained, lifecycle_changes)
        .join(_discards_of(lifecycle_df, real_gained, lifecycle_changes).hint("merge"), on=ID, how="left")
        .withColumn("discarded", F.coalesce("discarded", "_now", F.lit(False)))
    )
    txn = F.format_string("%s/%s", "broker_name", "uniq_key")
    span = F.format_string("from %d to %d", F.lit(since), F.lit(as_of))
    discard_problem = (
        F.when(F.col("b_evidence") < 0, "discard evidence removed from bronze")
        .when(F.col("s_discards") < 0, "its discard removed from silver")
        .when((F.col("s_discards") > 0) & (F.col("b_evidence") == 0), "discarded in silver without new evidence")
        .when((F.col("b_evidence") > 0) & ~F.col("discarded"), "new discard evidence in bronze, no discard in silver")
    )  # fmt: skip

    def pair(check: str, b: str, s: str, problem: Column | None = None) -> Column:
        differs = F.format_string("%d in bronze, %d in silver", b, s)
        why = F.when(F.col(b) != F.col(s), differs) if problem is None else problem
        sentence = F.format_string("%s of %s gained %s: %s", F.lit(check), txn, span, why)
        return F.struct(F.lit(check).alias("check"), txn.alias("transaction"), F.col(b).alias("bronze"),
                        F.col(s).alias("silver"), F.when(why.isNotNull(), sentence).alias("problem"))  # fmt: skip

    per_check = (
        rows.select(
            F.explode(
                F.array(
                    pair(TOTALS["copies"], "b_copies", "s_copies"),
                    pair(TOTALS["commits"], "b_commits", "s_commits"),
                    pair(TOTALS["discards"], "b_evidence", "s_discards", discard_problem),
                )
            ).alias("r")
        )
        .select("r.*")
        .where((F.col("bronze") != 0) | (F.col("silver") != 0) | F.col("problem").isNotNull())
    )
    offsets = offsets_gained.agg(F.sum("_sign").alias("b")).crossJoin(
        commit_changes.agg(F.sum(_change_sign()).alias("s"))
    ).select(
        F.lit(TOTALS["offsets"]).alias("check"), F.lit(None).cast("string").alias("transaction"),
        F.coalesce("b", F.lit(0)).cast("long").alias("bronze"), F.coalesce("s", F.lit(0)).cast("long").alias("silver"),
    )  # fmt: skip
    offsets = offsets.withColumn("problem", F.when(F.col("bronze") != F.col("silver"), F.format_string(
        "%s gained %s: %d in bronze, %d in silver", "check", span, "bronze", "silver")))  # fmt: skip
    return per_check.unionByName(offsets)


GROUP_COUNTS = {
    "STRANDED_QUEUE": "lag",
    "REDELIVERY_AT_HANDOFF": "duplicates_estimate",
    "OFFSET_JUMP": "skipped",
    "UNDELIVERED": "at_most",  # messages certainly lost may be 0 where the filters seen disagree
    "DEAD_LETTERED": "reconsume_times",
}
GROUP_FINDINGS = ("SUBSCRIPTION_CONFLICT", *GROUP_COUNTS)  # the findings `group_findings` checks


def group_findings(anomalies_df: DataFrame) -> DataFrame:
    """One row per consumer-group finding; a problem when it lacks its group, or (a queue finding) its queue,
    or its count (lag, duplicates estimate, messages skipped, possibly undelivered or dead-lettered) is not
    positive."""
    found = anomalies_df.where(F.col("anomaly_type").isin(*GROUP_FINDINGS))
    count = F.coalesce(*[F.when(F.col("anomaly_type") == t, F.get_json_object("detail", f"$.{c}").cast("long"))
                         for t, c in GROUP_COUNTS.items()])  # fmt: skip
    queue_type = F.col("anomaly_type") != "SUBSCRIPTION_CONFLICT"
    bad = (
        F.when(F.col("consumer_group").isNull(), "no consumer group")
        .when(queue_type & (F.col("topic").isNull() | F.col("queue_id").isNull()), "no queue")
        .when(queue_type & ~F.coalesce(count > 0, F.lit(False)), "no positive count")
    )
    problem = F.format_string("%s %s: %s", "anomaly_type", "anomaly_id", bad)
    return found.select("anomaly_id", "anomaly_type", F.when(bad.isNotNull(), problem).alias("problem"))
