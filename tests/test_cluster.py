"""spark-submit on a real standalone cluster: a master and a worker on loopback from the pip pyspark,
ingest and reconcile submitted with the project zip, the anomalies and lifecycle states those of the
broker model's truth, as a local-mode run's are (test_reconcile)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
import yaml
from pyspark.sql import DataFrame, SparkSession

from jobs import package
from jobs.score import read_truth, report, score
from tests.conftest import add_test_defaults, suite_java_options
from tests.test_ingest import make_landing

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# pyspark's launchers look for Spark through `python3` on PATH unless SPARK_HOME says where it is.
SPARK_ENV = {"SPARK_HOME": str(Path(pyspark.__file__).parent), "PYSPARK_PYTHON": sys.executable}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], log: Path, ready: str, timeout: float = 90) -> subprocess.Popen[bytes]:
    """Start a Spark daemon in its own process group and wait for `ready` in its log."""
    handle = log.open("wb")
    env = {**os.environ, **SPARK_ENV, "SPARK_DAEMON_JAVA_OPTS": suite_java_options()}
    proc = subprocess.Popen([str(BIN / "spark-class"), *args], stdout=handle, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)  # fmt: skip
    deadline = time.monotonic() + timeout
    while ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise AssertionError(f"{args[0]} did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """spark://127.0.0.1:PORT of a master with one 2-core worker; both stopped afterwards."""
    root = tmp_path_factory.mktemp("cluster")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    master = _start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                     "--webui-port", str(_free_port())], root / "master.log", "I have been elected leader")  # fmt: skip
    try:
        worker = _start(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "2",
                         "--memory", "2g", "--webui-port", str(_free_port()), "--work-dir", str(root / "work")],
                        root / "worker.log", "Successfully registered with master")  # fmt: skip
        try:
            yield url, root
        finally:
            _stop(worker)
    finally:
        _stop(master)


def _submit(url: str, root: Path, job: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SPARK_ENV, "SPARK_CONF_DIR": str(root / "spark-conf")}
    command = [str(BIN / "spark-submit"), "--master", url, "--py-files", str(root / "txn_recon.zip"),
               f"jobs/{job}.py", "--env", "cluster", "--conf", str(root / "cluster.yaml"), *args]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_ingest_and_reconcile_on_a_standalone_cluster_find_the_truth(
    cluster: tuple[str, Path], spark: SparkSession, tmp_path: Path
) -> None:
    url, root = cluster
    landing = tmp_path / "landing"
    meta = make_landing(landing, n=60, seed=5)
    package.build(root / "txn_recon.zip")
    warehouse = root / "warehouse"
    settings = {
        "warehouse": str(warehouse),
        "database": "t_cluster",
        # The test fetches nothing: the jars `make jars` put in .jars, not spark.jars.packages.
        "spark": {"delta_jars": "local", "jars_dir": str(ROOT / ".jars"),
                  "conf": {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                           "spark.ui.enabled": "false", "spark.cores.max": "2", "spark.executor.memory": "1g",
                           "spark.sql.shuffle.partitions": "4", "spark.locality.wait": "0s"}},
    }  # fmt: skip
    (root / "cluster.yaml").write_text(yaml.safe_dump(settings))
    spark_conf = [str(BIN / "txn-recon"), "spark-conf", "--env", "cluster", "--conf", str(root / "cluster.yaml"),
                  "--out", str(root / "spark-conf")]  # fmt: skip
    conf = subprocess.run(spark_conf, cwd=ROOT, capture_output=True, text=True)
    assert conf.returncode == 0, conf.stderr
    add_test_defaults(root / "spark-conf" / "spark-defaults.conf")  # tiny data: see tests/spark-conf

    for job, args in (("ingest", ["--landing", str(landing)]), ("reconcile", [])):
        done = _submit(url, root, job, *args)
        assert done.returncode == 0, f"{job}:\n{done.stderr[-4000:]}"
    assert "reconcile: anomalies by type" in done.stdout
    assert list((root / "work").glob("app-*/*/stderr")), "the worker ran no executor"

    # Bad input through spark-submit: one line, exit code 2, passed back by spark-submit. (Spark runs the
    # Python driver with its stderr merged into stdout.)
    bad = _submit(url, root, "ingest", "--landing", str(tmp_path / "nowhere"))
    assert bad.returncode == 2
    assert f"txn-recon ingest: error: --landing {tmp_path / 'nowhere'} is not a folder\n" in bad.stdout

    def table(name: str) -> DataFrame:
        return spark.read.format("delta").load(str(warehouse / "t_cluster.db" / name))

    found = [r.asDict() for r in table("anomalies").collect()]
    truth, as_of = read_truth(landing / "_truth")
    scores = score(truth, found)
    assert found and {r["as_of"] for r in found} == {as_of}
    assert all(s.perfect for s in scores.values()), report(scores)
    states = {r["state"]: r["count"] for r in table("txn_lifecycle").groupBy("state").count().collect()}
    assert states == meta["states"]
