"""The DataFrames the data-quality suites validate beyond whole tables. Pure DataFrame -> DataFrame.

Cross-table views have one row per thing checked and a `problem` column: null when it checks out,
else a sentence naming the key, so a failed expectation's sample says where to look.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from transforms.lifecycle import DISCARD_TOPIC, ID, is_commit, resolved_offsets, up_to


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
    """One row per half offset listed by an op; a problem when no half copy has that offset."""
    copies = half_df.select("broker_name", "queue_id", F.col("queue_offset").alias("half_offset"),
                            F.lit(True).alias("_known")).distinct()  # fmt: skip
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
                            F.col("uniq_key").alias("_copy_of"))  # fmt: skip
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
    differ (a transaction lost or double-counted between the layers)."""
    half = half_df.transform(up_to(as_of, "store_timestamp"))
    real = real_df.transform(up_to(as_of, "store_timestamp"))
    discard_txn = F.when((F.col("topic") == DISCARD_TOPIC) & F.col("uniq_key").isNotNull(), F.struct(*ID))
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
        F.count("discard_ts").alias("discards"),
    ).crossJoin(offset_commits_df.agg(F.count(F.lit(1)).alias("offsets")))
    checks = {
        "half copies": "copies",
        "transactions with a half": "transactions",
        "commits": "commits",
        "transactions with discard evidence": "discards",
        "offset commits": "offsets",
    }
    pairs = bronze.select([F.col(c).alias(f"b_{c}") for c in checks.values()]).crossJoin(
        silver.select([F.coalesce(c, F.lit(0)).alias(f"s_{c}") for c in checks.values()])
    )
    rows = pairs.select(F.explode(F.array(*[
        F.struct(F.lit(name).alias("check"), F.col(f"b_{c}").cast("long").alias("bronze"),
                 F.col(f"s_{c}").cast("long").alias("silver"))
        for name, c in checks.items()
    ])).alias("r")).select("r.*")  # fmt: skip
    problem = F.format_string("%s as of %d: %d in bronze, %d in silver", "check", F.lit(as_of), "bronze", "silver")
    return rows.withColumn("problem", F.when(F.col("bronze") != F.col("silver"), problem))


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
