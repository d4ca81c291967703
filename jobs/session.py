"""The composition root: one SparkSession per job, built from Config.

Local mode uses the Delta jars fetched by `make jars` (spark.jars), Hive support with an embedded
Derby metastore under the warehouse folder, so every job, notebook and spark-sql sees the same tables.
"""

from __future__ import annotations

import gc
import logging
import os
import shlex
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from jobs import class_archive
from jobs.config import CONF_DIR, Config
from jobs.jars import local_jars

log = logging.getLogger(__name__)


EXTRA_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def spark_settings(config: Config) -> dict[str, str]:
    """Every Spark setting a txn-recon session needs, as plain strings (also used for spark-defaults.conf)."""
    s = config.spark
    settings = {
        "spark.app.name": s.app_name,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": config.warehouse,
    }
    java_options = [f"-Dlog4j2.configurationFile=file:{CONF_DIR / 'log4j2.properties'}"]
    if config.is_local_warehouse:
        # Embedded Derby: one process at a time may open it; derby.log lands beside it, not in the cwd.
        metastore = Path(config.warehouse) / "metastore_db"
        settings["spark.hadoop.javax.jdo.option.ConnectionURL"] = f"jdbc:derby:;databaseName={metastore};create=true"
        java_options.append(f"-Dderby.system.home={config.warehouse}")
        # So one JVM at a time writes these tables (the warehouse lock holds them too), which is what Delta's
        # log store for one local writer assumes. The defaults rename each commit, and each commit's checksum
        # file, through Hadoop's FileContext, which without Hadoop's native library starts two `readlink`
        # processes per rename: about 6 ms of CPU each, some 700 in a small pipeline.
        settings["spark.delta.logStore.file.impl"] = "io.delta.storage.LocalLogStore"
        settings["spark.sql.streaming.checkpointFileManagerClass"] = (
            "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
        )
    if s.delta_jars == "local":
        settings["spark.jars"] = ",".join(str(p) for p in local_jars(s))
    else:
        settings["spark.jars.packages"] = ",".join(s.delta_packages)
    if s.master is not None:
        settings["spark.master"] = s.master
        if s.master.startswith("local"):
            settings["spark.pyspark.python"] = sys.executable
    settings.update(s.conf)
    extra = settings.get(EXTRA_JAVA_OPTIONS, "")
    settings[EXTRA_JAVA_OPTIONS] = " ".join([*java_options, extra]).strip()
    return settings


# The driver JVM's JIT compilers and collector, by the work a job does (a config, or a site's spark-defaults.conf,
# that sets spark.driver.defaultJavaOptions keeps its own). Both use the throughput collector: with G1's
# concurrent one, a full reconcile of a million transactions took 77.9 to 82.9 s against 69.9 to 74.1 s, and its
# process held more memory (docs/evidence/cost.md, The batch jobs).
# A process of a minute or two that runs hundreds of small queries (an incremental reconcile), each running the
# classes Spark generates for it briefly: the optimizing compiler's threads took more of its CPU than any other
# JVM thread (a flight recording), and its code pays off only later. The quick compiler alone needs a larger code
# cache than it reserves, or the cache fills and compiling stops. An incremental reconcile of 1% more on a
# million transactions: 43.7 to 45.2 s against 57.5 to 59.0 s.
QUICK_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m -XX:+UseParallelGC"
# Whole tables (ingest, a full reconcile), and a service's cycles: the optimizing compiler pays off in loops over
# millions of rows (with the quick one alone that full reconcile took 100 s), and in the code a service runs
# again every cycle, once it has compiled it (docs/operations/serve.md).
OPTIMIZING_JIT = "-XX:+UseParallelGC"
JAVA_OPTIONS = "spark.driver.defaultJavaOptions"


def with_jit(config: Config, options: str) -> Config:
    """`config` with the driver JVM's `options` (QUICK_JIT or OPTIMIZING_JIT), unless the config or the site's
    spark-defaults.conf sets them."""
    if JAVA_OPTIONS in config.spark.conf or JAVA_OPTIONS in _site_defaults():
        return config
    return config.with_spark_conf({**config.spark.conf, JAVA_OPTIONS: options})


def _site_defaults() -> set[str]:
    """The settings named in the defaults file Spark's launcher reads: the properties file PYSPARK_SUBMIT_ARGS names
    (which replaces the folder's), else spark-defaults.conf in Spark's configuration folder."""
    path = properties_file() or class_archive.conf_folder() / "spark-defaults.conf"
    if not path.is_file():
        return set()
    lines = (line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines())
    return {line.split(maxsplit=1)[0] for line in lines if line and not line.startswith("#")}


def properties_file() -> Path | None:
    """The `--properties-file` of PYSPARK_SUBMIT_ARGS, the arguments PySpark starts its JVM with."""
    args = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    for i, arg in enumerate(args):
        if arg == "--properties-file" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--properties-file="):
            return Path(arg.split("=", 1)[1])
    return None


def build_session(config: Config) -> SparkSession:
    """Create (or, under spark-submit or a second job in one process, join) the session and make sure
    the database exists."""
    active = SparkSession.getActiveSession()
    if active is not None:
        active.sql(f"CREATE DATABASE IF NOT EXISTS {config.database}")
        return active
    builder = SparkSession.builder
    settings = spark_settings(config)
    # The class archive of this configuration folder: spark_settings also writes the spark-defaults.conf of
    # spark-submit and spark-sql, whose JVMs start with another folder on their class path (jobs.class_archive).
    extra = settings[EXTRA_JAVA_OPTIONS]
    settings[EXTRA_JAVA_OPTIONS] = " ".join([*class_archive.java_options(config.spark, extra), extra])
    for key, value in settings.items():
        builder = builder.config(key, value)
    log.info("starting Spark (%s)", config.spark.master or "master from spark-submit")
    spark = builder.enableHiveSupport().getOrCreate()
    _quiet_accumulator_server(spark)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {config.database}")
    return spark


def jobs_started(spark: SparkSession) -> int:
    """How many Spark jobs this session has started: the DAG scheduler's own counter (job ids are handed out
    in order), exact however few jobs the status store retains."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().numTotalJobs())


def _quiet_accumulator_server(spark: SparkSession) -> None:
    """PySpark's accumulator server, a thread of this process, prints a Python traceback when its
    connection from the JVM breaks, which happens whenever the JVM dies. The job reports that failure in
    one line of its own, so the server only logs it."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda request, address: log.debug("the JVM's accumulator connection broke")


def write_spark_defaults(config: Config, out_dir: Path) -> Path:
    """Write spark-defaults.conf (and our log4j2 settings) so spark-sql and spark-submit share the catalog."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"{k} {v}" for k, v in sorted(spark_settings(config).items()) if k != "spark.app.name"]
    (out_dir / "spark-defaults.conf").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out_dir / "log4j2.properties").write_text((CONF_DIR / "log4j2.properties").read_text(), encoding="utf-8")
    return out_dir / "spark-defaults.conf"


def release_java_objects() -> None:
    """Let the JVM free what Python no longer names. Py4J's proxy of a JVM object and the proxies of its
    methods refer to each other, so only Python's cyclic collector frees them, and until it does the JVM keeps
    their objects: query plans, frames, checkpoints. In a long-running session Python's own schedule came every
    few serve cycles, after the JVM's heap had filled and a cycle had spent half its time or more in the JVM's
    collector (docs/evidence/cost.md)."""
    gc.collect()
