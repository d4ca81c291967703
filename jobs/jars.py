"""The Delta jars: fetched once through Maven into a git-ignored folder, so no session downloads.

`python -m jobs.jars` (run by `make jars`) fetches what is missing and is a no-op afterwards.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

from jobs.config import JARS_DIR_VARIABLE, SparkSettings, load_config
from jobs.errors import SetupError, TxnReconError

log = logging.getLogger(__name__)


def jar_path(jars_dir: Path, coordinate: str) -> Path:
    """Where Maven's dependency:copy puts group:artifact:version (its default file name)."""
    _, artifact, version = coordinate.split(":")
    return jars_dir / f"{artifact}-{version}.jar"


def local_jars(settings: SparkSettings) -> list[Path]:
    """The jar files for spark.jars; raises SetupError naming what is missing."""
    paths = [jar_path(settings.jars_dir, c) for c in settings.delta_packages]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise SetupError(f"Delta jars missing from {settings.jars_dir}: {', '.join(missing)} (run `make jars` in "
                         f"the checkout, or point {JARS_DIR_VARIABLE} at a folder that holds them)")  # fmt: skip
    return paths


def fetch_jars(settings: SparkSettings) -> list[Path]:
    """Copy every configured coordinate that is not there yet from Maven; return all jar paths."""
    mvn = shutil.which("mvn")
    settings.jars_dir.mkdir(parents=True, exist_ok=True)
    for coordinate in settings.delta_packages:
        target = jar_path(settings.jars_dir, coordinate)
        if target.is_file():
            continue
        if mvn is None:
            raise SetupError("Maven (mvn) is not on PATH; it is needed once to fetch the Delta jars")
        log.info("fetching %s", coordinate)
        cmd = [mvn, "-B", "-q", "dependency:copy", f"-Dartifact={coordinate}", f"-DoutputDirectory={settings.jars_dir}"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not target.is_file():
            errors = [ln for ln in result.stdout.splitlines() if "[ERROR]" in ln]
            detail = errors[0].replace("[ERROR]", "").strip() if errors else f"mvn exited {result.returncode}"
            raise SetupError(f"could not fetch {coordinate} through Maven: {detail}")
    return local_jars(settings)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        paths = fetch_jars(load_config().spark)
    except TxnReconError as e:
        print(f"txn-recon jars: error: {e}", file=sys.stderr)
        return 2
    for p in paths:
        print(f"ok {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
