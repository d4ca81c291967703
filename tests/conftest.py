"""One session-scoped SparkSession for the suite: local[2], few partitions, Delta configured; every Spark
the suite starts runs without the UI and without code generation (tests/spark-conf)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.config import Config, load_config
from jobs.session import build_session

REPO = Path(__file__).resolve().parent.parent
# Read by every Spark the suite starts, here or in a subprocess (a test that needs its own sets another).
os.environ.setdefault("SPARK_CONF_DIR", str(REPO / "tests" / "spark-conf"))


@pytest.fixture(scope="session")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    warehouse = tmp_path_factory.mktemp("warehouse")
    return load_config(
        overrides={
            "warehouse": str(warehouse),
            "spark": {"conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}},
        }
    )


@pytest.fixture(scope="session")
def spark(config: Config) -> Iterator[SparkSession]:
    session = build_session(config)
    yield session
    session.stop()
