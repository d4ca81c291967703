"""Tables in the catalog database, created from `schemas` constants (never inferred)."""

from __future__ import annotations

from collections.abc import Mapping

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from jobs.config import Config
from schemas.model import Schema
from schemas.spark import to_struct


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
    builder = DeltaTable.createIfNotExists(spark).tableName(table).addColumns(to_struct(schema))
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    if stats_columns:  # min/max statistics on every column cost a big write about a third of its time
        builder = builder.property("delta.dataSkippingStatsColumns", ",".join(stats_columns))
    if cluster_by:  # liquid clustering: OPTIMIZE lays the files out by these columns
        builder = builder.clusterBy(*cluster_by)
    builder.execute()
    return table
