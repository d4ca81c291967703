"""Run by test_schedule in the Airflow virtualenv (make airflow): load the DAG folder with Airflow's own
DagBag and print what it parsed as JSON. Not a test module: pytest does not collect it."""

from __future__ import annotations

import json
import sys

from airflow.dag_processing.dagbag import DagBag


def main(folder: str) -> None:
    bag = DagBag(dag_folder=folder)
    dags = {}
    for dag_id, dag in bag.dags.items():
        dags[dag_id] = {
            "max_active_runs": dag.max_active_runs,
            "catchup": dag.catchup,
            "schedule": str(dag.schedule),
            "tasks": {
                t.task_id: {
                    "operator": type(t).__name__,
                    "downstream": sorted(t.downstream_task_ids),
                    "trigger_rule": str(t.trigger_rule.value),
                    "retries": t.retries,
                    "application": t.application,
                    "application_args": list(t.application_args or []),
                    "py_files": t.py_files,
                    "packages": t.packages,
                }
                for t in dag.tasks
            },
        }
    print(json.dumps({"import_errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": dags}))


if __name__ == "__main__":
    main(sys.argv[1])
