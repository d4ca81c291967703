from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli import main
from jobs.config import CONF_DIR, JARS_DIR_VARIABLE, Config, load_config
from jobs.errors import ConfigError
from jobs.reconcile import has_run
from jobs.serve import long_running
from jobs.session import JAVA_OPTIONS, OPTIMIZING_JIT, QUICK_JIT, with_jit
from tests.conftest import SUITE_SPARK_ARGS


def test_base_and_local_layers_merge(tmp_path: Path) -> None:
    config = load_config()
    assert config.database == "txn_recon"
    assert config.spark.master == "local[2]"
    assert config.spark.conf["spark.ui.enabled"] == "false"  # from local.yaml
    assert config.spark.conf["spark.sql.session.timeZone"] == "UTC"  # from base.yaml, kept by the merge
    assert config.broker.check_max == 15
    assert config.thresholds.stuck_after_ms == 60000
    assert Path(config.warehouse).is_absolute()


def test_relative_folders_are_taken_from_where_they_are_written(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A job started outside the checkout (cron, a service) finds the checkout's jars and warehouse."""
    checkout = CONF_DIR.parent
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(JARS_DIR_VARIABLE, raising=False)
    config = load_config()
    assert (config.spark.jars_dir, config.warehouse) == (checkout / ".jars", str(checkout / "warehouse"))
    mine = tmp_path / "etc" / "mine.yaml"
    mine.parent.mkdir()
    mine.write_text("warehouse: data/wh\nspark:\n  jars_dir: ../jars\n")
    config = load_config(mine)
    assert (config.spark.jars_dir, config.warehouse) == (tmp_path / "etc" / ".." / "jars", str(mine.parent / "data/wh"))
    config = load_config(mine, overrides={"warehouse": "here"})
    assert config.warehouse == str(tmp_path / "here")  # --warehouse: from the working folder
    monkeypatch.setenv(JARS_DIR_VARIABLE, "/opt/jars")
    assert load_config(mine).spark.jars_dir == Path("/opt/jars")


def test_a_job_runs_from_any_folder(tmp_path: Path) -> None:
    """`txn-recon spark-conf` needs the Delta jars: it used to fail outside the checkout."""
    binary = Path(sys.executable).parent / "txn-recon"
    run = subprocess.run([str(binary), "spark-conf", "--warehouse", str(tmp_path / "wh")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    written = (tmp_path / "wh" / "spark-conf" / "spark-defaults.conf").read_text()
    assert str(CONF_DIR.parent / ".jars" / "delta-storage") in written


def test_cluster_environment_uses_packages_and_no_master() -> None:
    config = load_config(env="cluster")
    assert config.spark.master is None
    assert config.spark.delta_jars == "packages"


def test_user_file_is_layered_last(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text("broker:\n  check_max: 5\nspark:\n  conf:\n    spark.sql.shuffle.partitions: 3\n")
    config = load_config(f)
    assert config.broker.check_max == 5
    assert config.broker.check_interval_ms == 30000
    assert config.spark.conf["spark.sql.shuffle.partitions"] == "3"
    assert config.spark.conf["spark.sql.session.timeZone"] == "UTC"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("brokr:\n  check_max: 5\n", "unknown key 'brokr'"),
        ("broker:\n  check_maxx: 5\n", "unknown key 'broker.check_maxx'"),
        ("broker:\n  check_max: fifteen\n", "'broker.check_max' must be a whole number, got str 'fifteen'"),
        ("broker:\n  check_max: -1\n", "'broker.check_max' must be positive, got -1"),
        ("broker: 3\n", "'broker' must be a mapping, got int 3"),
        ("spark:\n  delta_jars: maybe\n", "spark.delta_jars: expected 'local' or 'packages'"),
        ("database: 'bad name'\n", "database: 'bad name' is not a valid database name"),
        ("broker: [check_max: 1\n", "malformed YAML at line 2"),
        ("- just\n- a list\n", "expected a mapping of settings at the top level"),
        ("quality:\n  blocking: [half_events, halfevents]\n", "quality.blocking: unknown suite 'halfevents'"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=None) as excinfo:
        load_config(f)
    assert message in str(excinfo.value)


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="configuration file not found"):
        load_config("/nonexistent/conf.yaml")


def test_unknown_environment() -> None:
    with pytest.raises(ConfigError, match="unknown environment 'prod'"):
        load_config(env="prod")


def test_cli_bad_config_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("thresholds:\n  stuck_after: 10\n")
    code = main(["sql", "--conf", str(f), "SELECT 1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("txn-recon sql: error: ") and "unknown key 'thresholds.stuck_after'" in err


def test_cli_unknown_option_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(["sql", "--formt", "json", "SELECT 1"])
    err = capsys.readouterr().err
    assert excinfo.value.code == 2
    assert err.count("\n") == 1 and "unrecognized arguments: --formt" in err


def test_serve_listens_on_loopback_unless_told_otherwise() -> None:
    """The SQL server asks for no password: another host may reach it only when the config says so."""
    with pytest.raises(ConfigError, match=r"serve.sql: 0.0.0.0:10000 is reachable from other hosts"):
        load_config(overrides={"serve": {"sql": "0.0.0.0:10000"}})
    assert load_config(overrides={"serve": {"sql": "0.0.0.0:10000", "sql_unauthenticated": True}}).serve.sql
    with pytest.raises(ConfigError, match=r"serve.http: 'localhost' is not HOST:PORT"):
        load_config(overrides={"serve": {"http": "localhost"}})
    with pytest.raises(ConfigError, match=r"'serve.sql_unauthenticated' must be true or false"):
        load_config(overrides={"serve": {"sql_unauthenticated": "yes"}})


def test_a_job_picks_its_jvm_flags_unless_the_config_or_the_site_sets_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Incremental reconciles run the quick JIT only; ingest, full reconciles and serve's cycles the optimizing
    one too (jobs.session); a config or the site's spark-defaults.conf that sets the driver's JVM flags keeps
    them, as does a properties file PYSPARK_SUBMIT_ARGS names. Reconcile expects an incremental run where the
    warehouse folder holds an earlier run."""
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.delenv(SUITE_SPARK_ARGS)
    config = load_config(overrides={"warehouse": str(tmp_path / "wh")})

    def flags(c: Config) -> str | None:
        return c.spark.conf.get(JAVA_OPTIONS)

    assert flags(with_jit(config, QUICK_JIT)) == QUICK_JIT and flags(long_running(config)) == OPTIMIZING_JIT
    assert flags(with_jit(config, OPTIMIZING_JIT)) == OPTIMIZING_JIT
    own = load_config(overrides={"warehouse": str(tmp_path / "wh"), "spark": {"conf": {JAVA_OPTIONS: "-Xss4m"}}})
    assert flags(with_jit(own, QUICK_JIT)) == "-Xss4m"
    site = tmp_path / "site"
    site.mkdir()
    (site / "spark-defaults.conf").write_text(f"# a site's\nspark.ui.enabled false\n{JAVA_OPTIONS}   -Xss4m\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(site))
    assert flags(with_jit(config, OPTIMIZING_JIT)) is None and flags(long_running(config)) is None
    (site / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    assert flags(with_jit(config, OPTIMIZING_JIT)) == OPTIMIZING_JIT
    # A properties file PySpark is started with replaces the folder's defaults.
    (tmp_path / "my defaults.conf").write_text(f"{JAVA_OPTIONS} -Xss4m\n")
    monkeypatch.setenv(SUITE_SPARK_ARGS, f"--properties-file '{tmp_path / 'my defaults.conf'}' pyspark-shell")
    assert flags(with_jit(config, OPTIMIZING_JIT)) is None
    monkeypatch.setenv(SUITE_SPARK_ARGS, f"--properties-file={site / 'spark-defaults.conf'} pyspark-shell")
    assert flags(with_jit(config, OPTIMIZING_JIT)) == OPTIMIZING_JIT

    assert not has_run(config)
    (tmp_path / "wh" / f"{config.database}.db" / "reconcile_runs" / "_delta_log").mkdir(parents=True)
    assert has_run(config)
    assert not has_run(load_config(overrides={"warehouse": "s3a://bucket/wh"}))
