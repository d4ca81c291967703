"""`txn-recon spark-conf`: write spark-defaults.conf so `spark-sql` and `spark-submit` share our catalog.

Use it as SPARK_CONF_DIR=<warehouse>/spark-conf .venv/bin/spark-sql -e "SELECT ...".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs.config import Config
from jobs.session import write_spark_defaults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="folder to write into (default: <warehouse>/spark-conf)")


def run(args: argparse.Namespace, config: Config) -> int:
    out_dir = args.out or Path(config.warehouse) / "spark-conf"
    path = write_spark_defaults(config, out_dir)
    print(path)
    return 0


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["spark-conf", *sys.argv[1:]]))
