"""`txn-recon explain TYPE`: what a finding type means, in one paragraph (its documentation page's first),
for an operator at a terminal. No Spark."""

from __future__ import annotations

import argparse
import sys

from jobs.config import CONF_DIR, Config
from jobs.errors import TxnReconError
from jobs.reference import first_paragraph
from schemas.findings import FINDINGS

DOCS = CONF_DIR.parent / "docs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("type", metavar="TYPE", help=f"a finding type: {', '.join(FINDINGS)}")


def run(args: argparse.Namespace, config: Config) -> int:
    kind = args.type.upper()
    if kind not in FINDINGS:
        raise TxnReconError(f"{args.type!r} is no finding type; the types are {', '.join(FINDINGS)}")
    page = DOCS / "findings" / f"{kind}.md"
    try:
        text = page.read_text(encoding="utf-8")
    except OSError as e:
        raise TxnReconError(f"cannot read {page} ({e.strerror}): explain needs the checkout's docs/") from None
    print(f"{kind}: {first_paragraph(text)}")
    print(f"More: {page} (how RocketMQ gets there, how to confirm it, what to do), or /docs/findings/{kind}/ on "
          "a running serve.")  # fmt: skip
    return 0


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["explain", *sys.argv[1:]]))
