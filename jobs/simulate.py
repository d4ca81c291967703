"""`txn-recon simulate`: run the broker model and write landing folders plus `_truth/` (no Spark)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import resource
import sys
import time
from pathlib import Path

from broker.landing import FORMATS, LandingWriter
from broker.profiles import PROFILES, BrokerSettings
from broker.simulation import simulate
from broker.truth import Thresholds
from jobs.config import Config
from jobs.errors import TxnReconError

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="landing folder to create (must be empty)")
    parser.add_argument("--transactions", type=int, default=100_000, help="transactions to send (default 100000)")
    parser.add_argument("--seed", type=int, default=1, help="random seed; the same seed gives the same bytes")
    parser.add_argument("--profile", default="default", help=f"fault profile: {', '.join(PROFILES)}")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="landing file format (default jsonl)")
    parser.add_argument("--rate", type=float, help="virtual transactions per second (default: the profile's)")
    parser.add_argument("--records-per-file", type=int, default=250_000, help="rotate landing files (default 250000)")
    parser.add_argument("--benchmark", action="store_true", help="print transactions and events per second")


def run(args: argparse.Namespace, config: Config) -> int:
    profile = PROFILES.get(args.profile)
    if profile is None:
        raise TxnReconError(f"unknown profile {args.profile!r}; expected one of {', '.join(PROFILES)}")
    if args.transactions < 0:
        raise TxnReconError(f"--transactions must not be negative, got {args.transactions}")
    if args.records_per_file <= 0:
        raise TxnReconError(f"--records-per-file must be positive, got {args.records_per_file}")
    if args.rate is not None:
        if args.rate <= 0:
            raise TxnReconError(f"--rate must be positive, got {args.rate}")
        profile = dataclasses.replace(profile, txn_per_second=args.rate)
    out: Path = args.out
    _prepare_out(out)
    settings = BrokerSettings(**dataclasses.asdict(config.broker))
    thresholds = Thresholds(**dataclasses.asdict(config.thresholds))
    writer = LandingWriter(out, args.format, args.records_per_file)
    log.info("simulating %d transactions (profile %s, seed %d) into %s", args.transactions, profile.name,
             args.seed, out)  # fmt: skip
    started = time.perf_counter()
    summary = simulate(args.transactions, args.seed, profile, writer, settings, thresholds,
                       progress=lambda n: log.info("  %d/%d transactions", n, args.transactions))  # fmt: skip
    writer.close(summary, {"broker": dataclasses.asdict(settings), "thresholds": dataclasses.asdict(thresholds)})
    elapsed = time.perf_counter() - started
    events = sum(summary.records.values())
    log.info("wrote %s records; truth: %s", _fmt(summary.records), _fmt(summary.anomalies) or "no anomalies")
    if args.benchmark:
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"simulate: {args.transactions} transactions, {events} events in {elapsed:.2f} s: "
              f"{args.transactions / elapsed:,.0f} transactions/s, {events / elapsed:,.0f} events/s, "
              f"peak memory {peak_mib:,.0f} MiB")  # fmt: skip
    return 0


def _prepare_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise TxnReconError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise TxnReconError(f"--out {out} is not empty; choose a new folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TxnReconError(f"cannot create --out {out}: {e.strerror}") from None
    if not os.access(out, os.W_OK):
        raise TxnReconError(f"--out {out} is not writable")


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["simulate", *sys.argv[1:]]))
