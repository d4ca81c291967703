"""One session-scoped SparkSession for the suite: local[2], few partitions, Delta configured; every Spark
the suite starts runs without the UI and without code generation (tests/spark-conf), but for the pipeline run
of test_outputs, which has the README's settings and so generates code as production does."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.config import Config, load_config
from jobs.session import build_session, release_java_objects

REPO = Path(__file__).resolve().parent.parent
TEST_DEFAULTS = REPO / "tests" / "spark-conf" / "spark-defaults.conf"
# Read by every session the suite starts, here or in a job it launches (a test that needs other settings drops
# it, or writes a spark-conf folder of its own for spark-submit and spark-sql, which do not read it). A file, not
# SPARK_CONF_DIR: Spark's launcher puts that folder on the JVM's class path, and the JDK maps no class archive
# (jobs.class_archive) for a class path with a folder that holds files; with the archive a job starts some 5 s
# sooner.
SUITE_SPARK_ARGS = "PYSPARK_SUBMIT_ARGS"
os.environ.setdefault(SUITE_SPARK_ARGS, f"--properties-file {shlex.quote(str(TEST_DEFAULTS))} pyspark-shell")


# The files that take minutes, longest first (their times in full suite runs on 2 cores). xdist hands whole
# files out in collection order (`make test` turns off its reordering by test count), each worker taking the
# next file as it nears the end of its own, so both workers finish together instead of one running a long file
# alone at the end. The two real-broker scenario files are kept apart: both wait on timings a starved machine
# stretches.
SLOWEST_FIRST = ("test_serve.py", "test_outputs.py", "test_rocketmq_versions.py", "test_quality.py",
                 "test_reconcile.py", "test_cluster.py", "test_consumer_rules.py", "test_incremental.py",
                 "test_real_broker.py", "test_ingest.py", "test_real_cluster.py", "test_ingest_kill.py",
                 "test_real_groups.py", "test_collect.py", "test_optional_fields.py", "test_metastore.py",
                 "test_fuzz.py", "test_transforms.py")  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order otherwise kept


def add_test_defaults(conf_file: Path) -> None:
    """Append the suite's Spark defaults to a spark-defaults.conf a test had written for its own jobs."""
    with conf_file.open("a", encoding="utf-8") as f:
        f.write(TEST_DEFAULTS.read_text(encoding="utf-8"))


# How much the optimizing JIT of a worker's session inlines (HotSpot's defaults: 325, 2500 and 15).
SESSION_INLINING = ("-XX:FreqInlineSize=50", "-XX:InlineSmallCode=500", "-XX:MaxInlineLevel=3")


def suite_java_options() -> str:
    """The JVM flags of the suite's Spark defaults, for daemons that read no spark-defaults.conf."""
    line = next(x for x in TEST_DEFAULTS.read_text().splitlines() if x.startswith("spark.driver.defaultJavaOptions"))
    return line.split(maxsplit=1)[1]


def session_java_options() -> str:
    """A worker's own session: the suite's JVM flags, with the optimizing JIT, inlining less (SESSION_INLINING)."""
    kept = [flag for flag in suite_java_options().split() if not flag.startswith("-XX:TieredStopAtLevel")]
    return " ".join([*kept, *SESSION_INLINING])


@pytest.fixture(scope="session")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    warehouse = tmp_path_factory.mktemp("warehouse")
    return load_config(
        overrides={
            "warehouse": str(warehouse),
            # The session lives through every Spark test file of its worker; at 1 GiB its heap
            # ran out late in a full run ("GC overhead limit exceeded" in test_consumer_rules).
            "spark": {
                "conf": {
                    "spark.sql.shuffle.partitions": "2",
                    "spark.default.parallelism": "2",
                    "spark.driver.memory": "2g",
                    # spark-defaults.conf says why this session's pages are 1 MiB; conf/local.yaml's 8 MiB, for
                    # the jobs' 4 GiB heaps, would otherwise win.
                    "spark.buffer.pageSize": "1m",
                    # Delta keeps the log of every table it read (its snapshot and the plans that rebuild its
                    # state) for an hour, up to 10,000 of them. Across the suite's hundreds of warehouses that
                    # was 147 logs late in a full run, with 830 MB of this heap live, and a broadcast in
                    # test_consumer_rules found no memory left. A few warehouses' worth is all a test reads.
                    "spark.databricks.delta.delta.log.cacheSize": "40",
                    # This JVM lives as long as its worker, most of the suite: its interpreted expressions and
                    # planning are hot for that long, and the optimizing JIT pays off (test_quality alone ran
                    # in 374 s with it against 463 s without). It inlines less than by default: compiling Spark,
                    # Delta and Scala took a third of its CPU, and with these limits five pipelines in a row
                    # took 260 s of CPU against 300 s or more, the last no slower (docs/reference/testing.md).
                    # The suite's other JVM flags stay.
                    "spark.driver.defaultJavaOptions": session_java_options(),
                }
            },
        }
    )


@pytest.fixture(scope="session")
def spark(config: Config) -> Iterator[SparkSession]:
    session = build_session(config)
    yield session
    session.stop()


@pytest.fixture(scope="module", autouse=True)
def _release_java_objects() -> Iterator[None]:
    """After each test file, let the JVMs free what its Python side held (`jobs.session.release_java_objects`):
    the worker's session lives through most of the suite, as serve's does through its cycles."""
    yield
    release_java_objects()
