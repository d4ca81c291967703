"""`txn-recon collect`: a live RocketMQ cluster into landing files, through its remoting protocol. No Spark.

The shell of `sources.collector`: the command line, the ACL keys, the lock on the collect state, the
signals that end `--every` cleanly, and the exit code.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path

from jobs.config import CollectSettings, Config
from jobs.errors import TxnReconError
from jobs.lock import folder_lock
from jobs.runs import new_run_id
from jobs.signals import stop_on_signals
from sources.collector import Collector, write_runs
from sources.landing_files import make_landing
from sources.remoting import Credentials


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namesrv", required=True, metavar="HOST:PORT[;HOST:PORT]",
                        help="the cluster's name servers, as RocketMQ's clients take them")  # fmt: skip
    parser.add_argument("--landing", type=Path, required=True, help="landing folder to add files to")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one pass, then exit (the default)")
    when.add_argument("--every", type=float, metavar="SECONDS", help="a pass every SECONDS until stopped")


def credentials(settings: CollectSettings) -> Credentials | None:
    access = os.environ.get("TXN_RECON_ACCESS_KEY") or settings.access_key
    secret = os.environ.get("TXN_RECON_SECRET_KEY") or settings.secret_key
    if access is None and secret is None:
        return None
    if not access or not secret:
        raise TxnReconError("an ACL access key needs its secret key and the other way round: set both "
                            "(collect.access_key and collect.secret_key, or TXN_RECON_ACCESS_KEY and "
                            "TXN_RECON_SECRET_KEY)")  # fmt: skip
    return Credentials(access, secret)


def run(args: argparse.Namespace, config: Config) -> int:
    namesrv = [a.strip() for a in args.namesrv.split(";") if a.strip()]
    if not namesrv or not all(a.rpartition(":")[2].isdigit() for a in namesrv):
        raise TxnReconError(f"--namesrv {args.namesrv!r}: expected HOST:PORT, several separated by ';'")
    if args.every is not None and args.every <= 0:
        raise TxnReconError(f"--every {args.every:g}: expected a positive number of seconds")
    landing: Path = args.landing
    make_landing(landing)
    with (
        stop_on_signals() as stop,
        folder_lock(landing / "_collect", f"the collect state in {landing}", "collect", name=".collect.lock"),
    ):
        collector = Collector(namesrv, landing, config.collect, credentials(config.collect), stop)
        while True:
            started = time.monotonic()
            run_id = new_run_id(dt.datetime.now(dt.UTC), "collect")
            runs = collector.run_pass(run_id)
            write_runs(collector.folder, run_id, runs)
            read = [r for r in runs if r.status != "failed"]
            print(f"collect {run_id}: {len(read)} of {len(runs)} broker(s) read; "
                  + "; ".join(f"{r.broker_name or 'name server'} {r.status}" for r in runs), flush=True)  # fmt: skip
            for cluster, masters in sorted(collector.seen.items()):
                print(f"  cluster {cluster}: " + "; ".join(f"{b} {_topics(t)}" for b, t in sorted(masters.items())),
                      flush=True)  # fmt: skip
            if args.every is None or stop.wait(max(args.every - (time.monotonic() - started), 0)):
                break
    if stop.is_set():
        print(f"txn-recon collect: stopped by {stop.name}; every pass is recorded, the next run goes on from it",
              flush=True)  # fmt: skip
        return 0
    if not read:
        first = runs[0].errors[0] if runs and runs[0].errors else "no broker"
        if runs and all(r.refused for r in runs):
            raise TxnReconError(f"nothing could be read: {first}")
        print(f"txn-recon collect: failed: nothing could be read: {first}", file=sys.stderr)
        return 1
    return 0


def _topics(topics: list[str] | None) -> str:
    if topics is None:
        return "(topic table not read)"
    return f"topics {', '.join(topics)}" if topics else "(no business topic)"


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["collect", *sys.argv[1:]]))
