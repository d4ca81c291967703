"""`txn-recon sql`: run one Spark SQL statement against the warehouse catalog and print the result."""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import decimal
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from pyspark.errors import AnalysisException

from jobs.config import Config
from jobs.errors import QueryError
from jobs.session import build_session

FORMATS = ("table", "csv", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", help='one Spark SQL statement, e.g. "SELECT count(*) FROM txn_recon.anomalies"')
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")


def run(args: argparse.Namespace, config: Config) -> int:
    spark = build_session(config)
    spark.catalog.setCurrentDatabase(config.database)
    try:
        df = spark.sql(args.query)
        columns = df.columns
        rows = [tuple(r) for r in df.collect()]
    except AnalysisException as e:  # includes ParseException
        raise QueryError(_first_line(str(e))) from e
    write_result(columns, rows, args.format, sys.stdout)
    return 0


def write_result(columns: Sequence[str], rows: Sequence[tuple[Any, ...]], fmt: str, out: TextIO) -> None:
    if fmt == "json":
        for row in rows:
            out.write(
                json.dumps(dict(zip(columns, row, strict=True)), default=_json_default, ensure_ascii=False) + "\n"
            )
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        if columns:
            writer.writerow(columns)
        writer.writerows([[_text(v, csv_null="") for v in row] for row in rows])
    else:
        out.write(_table(columns, rows))


def _table(columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> str:
    if not columns:
        return "OK\n"
    cells = [[_text(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    footer = f"({len(rows)} row{'s' if len(rows) != 1 else ''})"
    return "\n".join([line, rule, *body, footer]) + "\n"


def _text(value: Any, csv_null: str = "NULL") -> str:
    if value is None:
        return csv_null
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=_json_default)
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    return str(value)


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "Spark rejected the statement"


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["sql", *sys.argv[1:]]))
