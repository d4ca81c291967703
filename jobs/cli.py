"""`txn-recon`: one entry point, a subcommand per job (DESIGN §4).

Every error is one line on stderr. Exit codes, for schedulers: 0 done; 1 failed (a Spark or
environment failure; score: a mismatch); 2 bad input or configuration, fix and rerun; 3 a blocking
data-quality suite failed; 4 the warehouse is busy (another job holds it, or changed a table while
this one wrote it), rerun later; 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from jobs.config import ENVIRONMENTS, load_config
from jobs.errors import EngineError, TxnReconError
from jobs.lock import LockedError
from sources.landing_files import LandingError

log = logging.getLogger("txn_recon")
EXIT_BUSY = 4
# Delta's conflict errors: its error classes and its exception names.
CONCURRENT = re.compile(r"\b(DELTA_CONCURRENT_\w+|Concurrent\w*Exception|(Protocol|Metadata)ChangedException)")

# name -> (module under jobs/, its add_arguments and run functions, one-line help). A module is imported
# only for the command that runs: Great Expectations alone takes seconds to import, and the jobs that
# read brokers need no Spark at all.
JOBS: dict[str, tuple[str, str, str, str]] = {
    "simulate": ("simulate", "add_arguments", "run", "run the broker model: landing folders and truth (no Spark)"),
    "export-store": ("export_store", "add_arguments", "run",
                     "a RocketMQ broker's store folder into landing files (no Spark)"),
    "collect": ("collect", "add_arguments", "run", "a live RocketMQ cluster into landing files (no Spark)"),
    "ingest": ("ingest", "add_arguments", "run", "land new landing files in the bronze Delta tables"),
    "reconcile": ("reconcile", "add_arguments", "run", "transaction lifecycles and anomalies as of a data time"),
    "quality": ("quality", "add_arguments", "run", "Great Expectations suites on the tables; dq_results, Data Docs"),
    "report": ("report", "add_arguments", "run", "the dashboard: one self-contained HTML page from the tables"),
    "score": ("score", "add_arguments", "run", "precision and recall of the anomalies against the model's truth"),
    "run": ("pipeline", "add_run_arguments", "run_pipeline",
            "the pipeline on a landing folder: ingest, reconcile, quality, report"),
    "demo": ("pipeline", "add_demo_arguments", "demo", "simulate the default profile, run the pipeline, score"),
    "serve": ("serve", "add_arguments", "run",
              "one long-running engine: a cycle every minute, SQL (JDBC) and metrics (HTTP) meanwhile"),
    "sql": ("sql", "add_arguments", "run", "run one Spark SQL statement against the warehouse catalog"),
    "spark-conf": ("spark_conf", "add_arguments", "run", "write spark-defaults.conf for spark-sql / spark-submit"),
    "explain": ("explain", "add_arguments", "run", "what a finding type means, in one paragraph (no Spark)"),
    "trace": ("story", "add_arguments", "run", "the story of one message (UNIQ_KEY) from every table, in time order"),
}  # fmt: skip


def job(name: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace, Any], int]]:
    """A command's add_arguments(parser) and run(args, config) -> exit code."""
    module_name, add_arguments, run, _ = JOBS[name]
    module = importlib.import_module(f"jobs.{module_name}")
    return getattr(module, add_arguments), getattr(module, run)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI; given the command about to run, only that command's module is imported."""
    parser = _Parser(prog="txn-recon", description="Reconciliation of RocketMQ transactional messaging.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, (_, _, _, help_text) in JOBS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--conf", metavar="FILE", help="YAML settings layered over conf/base.yaml")
        p.add_argument("--env", choices=ENVIRONMENTS, help="environment file under conf/ (default: local)")
        p.add_argument("--warehouse", metavar="DIR", help="warehouse folder (overrides the configured one)")
        p.add_argument("--debug", action="store_true", help="show the full traceback of an unexpected error")
        if command in (None, name):
            add_arguments, run = job(name)
            add_arguments(p)
            p.set_defaults(run=run)
    return parser


def configure_logging(debug: bool = False) -> None:
    """Our progress at INFO on stderr; libraries at WARNING. PySpark's query-context loggers repeat,
    as JSON with a JVM stack, the error we already report in one line, and py4j logs a Python traceback
    for every call that finds the JVM gone (a dead JVM, which the job reports in one line; calls made on
    the way out, too): both are silenced unless --debug."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for name in ("jobs", "broker", "transforms", "schemas", "txn_recon"):
        logging.getLogger(name).setLevel(logging.INFO)
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger", "py4j"):
        logging.getLogger(name).setLevel(logging.NOTSET if debug else logging.CRITICAL + 1)
    if not debug:  # py4j also logs some of those tracebacks through the root logger (`logging.exception`)
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda record: f"{os.sep}py4j{os.sep}" not in record.pathname)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in JOBS else None).parse_args(argv)
    configure_logging(args.debug)
    prog = f"txn-recon {args.command}"
    try:
        overrides = {"warehouse": args.warehouse} if args.warehouse else None
        config = load_config(args.conf, env=args.env, overrides=overrides)
        return int(args.run(args, config))
    except LockedError as e:
        print(f"{prog}: busy: {e}", file=sys.stderr)
        return EXIT_BUSY
    except (TxnReconError, LandingError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except EngineError as e:
        if args.debug:
            raise
        print(f"{prog}: failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug or an environment failure: one line unless --debug
        if args.debug:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if CONCURRENT.search(first):  # Delta's conflict detection: the warehouse has no lock (not local)
            print(f"{prog}: busy: another job changed a table this one was writing ({first}); rerun later",
                  file=sys.stderr)  # fmt: skip
            return EXIT_BUSY
        print(f"{prog}: failed: {type(e).__name__}: {first} (rerun with --debug for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
