"""Airflow DAG: the txn-recon pipeline every 15 minutes on a Spark cluster, never two runs at once.

On one machine, `txn-recon serve` (conf/schedule/txn-recon.service) does the same every minute in one
long-running process, with SQL and metrics meanwhile; this DAG is for a shared Spark cluster, where each
job is a spark-submit application of its own. Do not run both on one warehouse.

Install it by copying this file into the DAGs folder. On the Airflow workers, TXN_RECON_HOME is the
project checkout with `make package` done (dist/txn_recon.zip) and conf/cluster.yaml filled in; the
Airflow connection `spark_txn_recon` names the master (e.g. spark://spark-master:7077). The Delta jars
come from Maven by coordinates, as in conf/base.yaml.

Exit codes (README, "Exit codes") decide what Airflow does: any non-zero code fails the task; 4 means
another job held the warehouse, so the retries are worth having. Quality exits 3 when a blocking suite
fails; the report still runs after it (trigger rule all_done), so the dashboard shows what failed.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow import DAG
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

HOME = os.environ.get("TXN_RECON_HOME", "/opt/txn-recon")
LANDING = os.environ.get("TXN_RECON_LANDING", "/shared/txn-recon/landing")
DELTA_PACKAGES = "io.delta:delta-spark_4.1_2.13:4.4.0,io.delta:delta-storage:4.4.0"


def job(name: str, *args: str, **kwargs: object) -> SparkSubmitOperator:
    """One txn-recon job through spark-submit: the entry script jobs/<name>.py and the project zip."""
    return SparkSubmitOperator(
        task_id=name,
        application=f"{HOME}/jobs/{name}.py",
        application_args=["--env", "cluster", *args],
        py_files=f"{HOME}/dist/txn_recon.zip",
        packages=DELTA_PACKAGES,
        conn_id="spark_txn_recon",
        name=f"txn-recon-{name}",
        env_vars={"TXN_RECON_CONF_DIR": f"{HOME}/conf"},
        **kwargs,
    )


with DAG(
    dag_id="txn_recon",
    schedule="*/15 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # the jobs share one warehouse: runs queue up instead of overlapping
    default_args={"retries": 2, "retry_delay": timedelta(minutes=3)},
    tags=["txn-recon"],
) as dag:
    ingest = job("ingest", "--landing", LANDING)
    reconcile = job("reconcile")
    quality = job("quality")
    report = job("report", trigger_rule="all_done")
    ingest >> reconcile >> quality >> report
