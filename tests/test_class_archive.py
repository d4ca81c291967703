"""The driver JVM's class archive (jobs.class_archive): made by `make setup`, mapped by every session started
from the same configuration folder."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.class_archive import DUMP, archive_path, java, java_options, main, mappable
from jobs.config import load_config
from tests.conftest import SUITE_SPARK_ARGS

SHARED = "source: shared objects file"


def setup_archive(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The archive `make setup` made for no configuration folder (the README's jobs); the test runs without one,
    and without the suite's Spark defaults."""
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv(SUITE_SPARK_ARGS)
    path = archive_path(load_config().spark)
    assert path.is_file(), f"no class archive at {path}: run `make setup`"
    return path


def test_a_session_loads_spark_from_the_archive_setup_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session started as the README's jobs start theirs maps the archive, and Spark's classes come from it."""
    setup_archive(monkeypatch)
    loads = tmp_path / "class-load.log"
    script = (
        "from jobs.config import load_config\n"
        "from jobs.session import EXTRA_JAVA_OPTIONS, build_session\n"
        f"conf = {{EXTRA_JAVA_OPTIONS: '-Xlog:class+load=info:file={loads}'}}\n"
        f"config = load_config(overrides={{'warehouse': {str(tmp_path / 'wh')!r}, 'spark': {{'conf': conf}}}})\n"
        "spark = build_session(config)\n"
        "assert spark.range(3).count() == 3\n"
        "spark.stop()\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = loads.read_text(encoding="utf-8").splitlines()
    context = [ln for ln in lines if " org.apache.spark.SparkContext " in ln]
    assert context and SHARED in context[0], context
    shared = sum(SHARED in ln for ln in lines if " org.apache.spark." in ln)
    spark_classes = sum(" org.apache.spark." in ln for ln in lines)
    assert shared > spark_classes / 2, (shared, spark_classes)


def test_an_archive_the_jvm_cannot_take_leaves_no_word_in_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A JVM with another class path (here none: `java -version`) skips the archive; with the options a session
    gets, it says nothing of it, where by default it warns on stdout, amid a job's own output."""
    setup_archive(monkeypatch)
    options = java_options(load_config().spark, "")
    quiet = subprocess.run([java(), *options, "-version"], capture_output=True, text=True)
    loud = subprocess.run([java(), options[0], "-version"], capture_output=True, text=True)
    assert quiet.returncode == 0 and loud.returncode == 0
    assert "Unable to use shared archive" in loud.stdout
    assert "archive" not in quiet.stdout + quiet.stderr


def test_an_archive_is_picked_by_configuration_folder_and_delta_and_never_while_one_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = dataclasses.replace(load_config().spark, jars_dir=tmp_path)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "site"))
    site = archive_path(settings)
    assert site.parent == tmp_path / "classes"
    assert java_options(settings, "") == []  # none made for this folder
    site.parent.mkdir()
    site.write_bytes(b"")
    assert java_options(settings, "-Xss4m") == [f"-XX:SharedArchiveFile={site}", "-Xlog:cds*=off"]
    assert java_options(settings, f"{DUMP}/tmp/x.jsa") == []
    other_delta = dataclasses.replace(settings, delta_packages=("io.delta:delta-spark_4.1_2.13:9.9.9",))
    assert archive_path(other_delta) != site and java_options(other_delta, "") == []
    monkeypatch.delenv("SPARK_CONF_DIR")
    assert archive_path(settings) != site and java_options(settings, "") == []


def test_an_archive_cut_short_is_found_before_a_jvm_crashes_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = setup_archive(monkeypatch)
    cut = tmp_path / "cut.jsa"
    with whole.open("rb") as f:
        cut.write_bytes(f.read(1 << 20))
    assert mappable(whole)
    assert not mappable(cut)


def test_a_configuration_folder_with_settings_gets_none_and_set_up_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The JDK archives no class path with a folder that holds files, and Spark's launcher puts the configuration
    folder on it: set-up says so in one line and succeeds, and the jobs there start without an archive."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "spark-defaults.conf").write_text("spark.ui.enabled false\n", encoding="utf-8")
    monkeypatch.setenv("SPARK_CONF_DIR", str(site))
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("txn-recon class archive: none made (") and str(site) in out and out.count("\n") == 1
    settings = load_config().spark
    assert not archive_path(settings).exists() and java_options(settings, "") == []
