"""The scheduling examples: the Airflow DAG as Airflow itself parses it, and the crontab lines."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from jobs.cli import CONCURRENT, EXIT_BUSY, JOBS, build_parser, main
from jobs.config import load_config
from jobs.lock import warehouse_lock

ROOT = Path(__file__).resolve().parent.parent
SCHEDULE = ROOT / "conf" / "schedule"
AIRFLOW_PYTHON = ROOT / ".venv-airflow" / "bin" / "python"


def test_the_airflow_dag_chains_the_jobs_through_spark_submit(tmp_path: Path) -> None:
    assert AIRFLOW_PYTHON.exists(), "run `make airflow` (make test does) to install Airflow in .venv-airflow"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "TXN_RECON_HOME": str(ROOT)}  # fmt: skip
    done = subprocess.run([str(AIRFLOW_PYTHON), str(ROOT / "tests" / "airflow_probe.py"), str(SCHEDULE)],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed["import_errors"] == {}
    dag = parsed["dags"]["txn_recon"]
    assert (dag["max_active_runs"], dag["catchup"]) == (1, False)  # never two runs on one warehouse
    tasks = dag["tasks"]
    assert {n: t["downstream"] for n, t in tasks.items()} == {
        "ingest": ["reconcile"], "reconcile": ["quality"], "quality": ["report"], "report": []}  # fmt: skip
    assert tasks["report"]["trigger_rule"] == "all_done"  # the dashboard shows a blocking failure too
    packages = ",".join(load_config(None).spark.delta_packages)
    for name, task in tasks.items():
        assert task["operator"] == "SparkSubmitOperator" and task["retries"] >= 1
        assert task["application"] == str(ROOT / "jobs" / f"{name}.py") and Path(task["application"]).exists()
        assert task["py_files"] == str(ROOT / "dist" / "txn_recon.zip")
        assert task["packages"] == packages
        args = build_parser().parse_args([name, *task["application_args"]])  # exits 2 if our CLI refuses them
        assert args.command == name and args.env == "cluster"


def test_the_crontab_lines_are_valid_commands() -> None:
    """Every schedule line (also the commented cluster one) is five cron fields and a txn-recon command
    that our own parser accepts: `txn-recon JOB ...` or `spark-submit ... jobs/<module>.py ...`."""
    lines = [line for line in (SCHEDULE / "crontab").read_text().splitlines() if re.match(r"^(# )?[0-9*]", line)]
    assert len(lines) == 4
    for line in lines:
        fields = line.removeprefix("# ").split(None, 5)
        assert all(re.fullmatch(r"[0-9*/,\-]+", f) for f in fields[:5]), line
        words = shlex.split(fields[5].split(">>")[0])
        [i] = [i for i, w in enumerate(words) if w.endswith("bin/txn-recon") or w.startswith("jobs/")]
        job = Path(words[i]).stem.replace("_", "-") if words[i].startswith("jobs/") else words[i + 1]
        command = [{"pipeline": "run"}.get(job, job), *words[i + (1 if words[i].startswith("jobs/") else 2) :]]
        assert command[0] in JOBS, line
        build_parser().parse_args(command)


def test_a_job_on_a_busy_warehouse_exits_4_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = load_config(None, overrides={"warehouse": str(tmp_path / "wh")})
    with warehouse_lock(config, "ingest"):
        code = main(["reconcile", "--warehouse", str(tmp_path / "wh")])
    assert code == EXIT_BUSY == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"txn-recon reconcile: busy: the warehouse {tmp_path / 'wh'} is in use by txn-recon ingest "
                   f"(pid {os.getpid()}); try again when it ends"]  # fmt: skip


def test_delta_conflicts_are_recognised_as_busy() -> None:
    assert CONCURRENT.search("[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] ConcurrentAppendException: Files were added")
    assert CONCURRENT.search("io.delta.exceptions.MetadataChangedException: The metadata of the Delta table")
    assert not CONCURRENT.search("[DELTA_TABLE_NOT_FOUND] Delta table `x` doesn't exist.")


def test_the_systemd_unit_starts_serve_and_stops_it_with_sigterm() -> None:
    """The unit's ExecStart is a command our parser accepts, stopped the way serve stops cleanly, and
    restarted when the engine fails (exit 1)."""
    unit = dict(
        line.split("=", 1) for line in (SCHEDULE / "txn-recon.service").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )  # fmt: skip
    words = shlex.split(unit["ExecStart"])
    assert words[0].endswith("/bin/txn-recon") and words[1] == "serve"
    assert build_parser().parse_args(words[1:]).command == "serve"
    assert (unit["KillSignal"], unit["Restart"]) == ("SIGTERM", "on-failure")
    assert "TXN_RECON_JARS_DIR" in unit["Environment"]
