"""The catalog persists across processes: a job creates a table, later processes query it by name.

Each step runs in its own process, because the embedded Derby metastore admits one process at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, add_test_defaults

pytestmark = pytest.mark.spark

BIN = Path(sys.executable).parent

CREATE = textwrap.dedent(
    """
    import sys
    from jobs.catalog import create_table
    from jobs.config import load_config
    from jobs.session import build_session
    from schemas import OFFSET
    from schemas.spark import to_struct

    config = load_config(overrides={"warehouse": sys.argv[1]})
    spark = build_session(config)
    name = create_table(spark, config, OFFSET)
    rows = [("b", "g", "t", q, 10 * q, 1000 + q, None, None) for q in range(3)]
    spark.createDataFrame(rows, to_struct(OFFSET)).write.format("delta").mode("append").saveAsTable(name)
    spark.stop()
    """
)


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wh = tmp_path_factory.mktemp("persisted")
    done = _run([sys.executable, "-c", CREATE, str(wh)])
    assert done.returncode == 0, done.stderr
    return wh


def test_second_process_queries_by_name(warehouse: Path) -> None:
    done = _run(
        [
            str(BIN / "txn-recon"),
            "sql",
            "--warehouse",
            str(warehouse),
            "--format",
            "json",
            "SELECT queue_id, offset FROM txn_recon.offset ORDER BY queue_id",
        ]
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"queue_id": 0, "offset": 0},
        {"queue_id": 1, "offset": 10},
        {"queue_id": 2, "offset": 20},
    ]


def test_job_module_runs_under_spark_submit(warehouse: Path) -> None:
    conf = _run([str(BIN / "txn-recon"), "spark-conf", "--warehouse", str(warehouse)])
    assert conf.returncode == 0, conf.stderr
    defaults = Path(conf.stdout.strip())
    add_test_defaults(defaults)
    env = {**os.environ, "SPARK_CONF_DIR": str(defaults.parent),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    query = "SELECT count(*) AS n FROM txn_recon.offset"
    done = _run([str(BIN / "spark-submit"), "jobs/sql.py", "--warehouse", str(warehouse), "--format", "json", query],
                env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"n": 3}
