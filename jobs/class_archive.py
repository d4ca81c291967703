"""The driver JVM's class archive: the classes a txn-recon job loads, read from their jars and verified once at
set-up into a file that every later driver JVM maps (the JDK's class-data sharing, a dynamic archive) instead of
loading each class again. A job starts about 4 s sooner (docs/reference/configuration.md).

`python -m jobs.class_archive` (run by `make setup`) makes the archive once, in `classes/` beside the Delta jars:
a session that writes, merges and reads a small Delta table, in a JVM of its own that writes the classes it loaded
as it exits. The JVM takes an archive only with the class path it was made with, and Spark's launcher puts the
Spark configuration folder (SPARK_CONF_DIR) first on it, so each folder has its own archive; so do another JDK,
Spark or Delta, and a session with none runs as before. The JDK archives no class path that holds a folder with
files in it: a configuration folder that holds a spark-defaults.conf gets no archive, and its jobs start as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark

from jobs.config import SparkSettings, load_config
from jobs.errors import SetupError, TxnReconError

log = logging.getLogger(__name__)

DUMP = "-XX:ArchiveClassesAtExit="


class Unarchivable(TxnReconError):
    """The JDK would not archive this class path: jobs start without an archive, as they did before one."""


def archive_path(settings: SparkSettings) -> Path:
    """The archive for this JDK, Spark, Delta and configuration folder."""
    jdk = Path(java()).resolve().parent.parent / "lib" / "modules"  # rewritten by any update of the JDK
    stamp = jdk.stat().st_mtime_ns if jdk.is_file() else 0
    key = "\n".join([str(jdk), str(stamp), pyspark.__version__, str(Path(pyspark.__file__).parent),
                     *settings.delta_packages, os.environ.get("SPARK_CONF_DIR", "")])  # fmt: skip
    return settings.jars_dir / "classes" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def conf_folder() -> Path:
    """The folder Spark's launcher puts first on the driver's class path: SPARK_CONF_DIR, else Spark's own conf/
    (for pip's pyspark, a folder it does not ship)."""
    folder = os.environ.get("SPARK_CONF_DIR")
    return Path(folder) if folder else Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent, "conf")


def unarchivable() -> str | None:
    """Why the JDK would refuse to archive this class path, or None. It refuses a folder with files in it
    ("Cannot have non-empty directory in paths"), as the configuration folder is when it holds settings."""
    folder = conf_folder()
    if folder.is_dir() and any(folder.iterdir()):
        return f"the Spark configuration folder {folder}, first on the driver's class path, is not empty"
    return None


def java_options(settings: SparkSettings, extra: str) -> list[str]:
    """The driver's options to map the archive, when there is one and the JVM is not writing one (`extra`).
    Quiet: the JVM skips an archive it cannot take with a warning on its stdout, amid the job's own output."""
    path = archive_path(settings)
    return [f"-XX:SharedArchiveFile={path}", "-Xlog:cds*=off"] if DUMP not in extra and path.is_file() else []


def make_archive(settings: SparkSettings) -> Path:
    """Write the archive unless it is there: a run of the workload below in a JVM of its own. Raises
    `Unarchivable` for a class path the JDK does not archive."""
    path = archive_path(settings)
    if path.is_file():
        return path
    if (reason := unarchivable()) is not None:
        raise Unarchivable(reason)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "jobs.class_archive", "--workload", str(partial)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0 or not partial.is_file():
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        raise SetupError(f"could not make the class archive: {lines[-1] if lines else f'exit {result.returncode}'}")
    if not mappable(partial):
        partial.unlink()
        raise SetupError(f"the class archive written to {partial} could not be mapped by java; it was removed")
    partial.rename(path)
    log.info("class archive %s written in %.0f s", path, time.perf_counter() - started)
    return path


def mappable(path: Path) -> bool:
    """Whether a JVM starts with the archive at `path`. The JVM maps an archive whole: one cut short (a full
    disk) crashes every JVM given it (SIGBUS)."""
    check = [java(), f"-XX:SharedArchiveFile={path}", "-Xlog:cds*=off", "-XX:ErrorFile=/dev/null", "-version"]
    return subprocess.run(check, capture_output=True).returncode == 0


def java() -> str:
    """The java that Spark's launcher starts."""
    home = os.environ.get("JAVA_HOME")
    return str(Path(home, "bin", "java")) if home else (shutil.which("java") or "java")


def workload(out: Path) -> None:
    """A session that writes, merges and reads a small Delta table, in a driver JVM that writes the classes it
    loaded to `out` as it exits. Starting the session is most of what an archive saves: one made by an ingest
    and two reconciles of a small landing saved a reconcile no more than this one does."""
    from jobs.session import EXTRA_JAVA_OPTIONS, build_session

    with tempfile.TemporaryDirectory(prefix="txn-recon-classes-") as tmp:
        config = load_config(overrides={"warehouse": tmp, "spark": {"conf": {EXTRA_JAVA_OPTIONS: f"{DUMP}{out}"}}})
        spark = build_session(config)
        table = config.table("class_archive")
        spark.range(100).selectExpr("id", "id % 7 AS n").write.format("delta").saveAsTable(table)
        updates = spark.range(50, 150).selectExpr("id", "id % 5 AS n")
        updates.createOrReplaceTempView("updates")
        spark.sql(f"MERGE INTO {table} t USING updates u ON t.id = u.id "
                  "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")  # fmt: skip
        spark.table(table).groupBy("n").count().collect()
        spark.stop()  # the JVM exits with this process, and writes the archive as it does


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if argv[:1] == ["--workload"]:
            workload(Path(argv[1]))
        else:
            print(f"ok {make_archive(load_config().spark)}")
    except Unarchivable as e:
        print(f"txn-recon class archive: none made ({e}); jobs start without one, about 4 s later")
    except TxnReconError as e:
        print(f"txn-recon class archive: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
