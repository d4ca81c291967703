"""`txn-recon demo` on a warehouse that already holds a database: what an earlier demo of the same landing
left is dropped, tables and views; a database that ingested anything else is left as it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.catalog import create_table, tables_in
from jobs.config import Config
from jobs.errors import TxnReconError
from jobs.ingest import LandingFile, file_rows, record_files
from jobs.pipeline import reset_for
from schemas.bronze import INGEST_FILES, QUARANTINE
from tests.test_ingest import fresh_db

pytestmark = pytest.mark.spark


def test_a_demo_drops_only_what_an_earlier_demo_of_its_landing_left(
    spark: SparkSession, config: Config, tmp_path: Path
) -> None:
    cfg = fresh_db(spark, config, "t_demo_reset")
    landing = tmp_path / "landing"
    create_table(spark, cfg, INGEST_FILES)
    create_table(spark, cfg, QUARANTINE)
    record_files(
        spark, cfg, file_rows("half", [LandingFile(landing / "half" / "part-0.jsonl", 10, 1)], set(), "run-1", 5)
    )
    spark.sql(f"CREATE VIEW {cfg.table('recorded')} AS SELECT path FROM {cfg.table('ingest_files')}")
    held = tables_in(spark, cfg.database)
    assert held == {"ingest_files", "quarantine", "recorded"}

    # Another landing folder: the files this database recorded are not its own.
    with pytest.raises(TxnReconError, match="holds more than demo's simulations"):
        reset_for(spark, cfg, tmp_path / "elsewhere")
    assert tables_in(spark, cfg.database) == held

    reset_for(spark, cfg, landing)
    assert tables_in(spark, cfg.database) == set()
    assert spark.catalog.databaseExists(cfg.database)
