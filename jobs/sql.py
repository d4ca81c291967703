"""`txn-recon sql`: run one Spark SQL statement against the warehouse catalog and print the result.

While `txn-recon serve` runs on the warehouse it holds the catalog (an embedded metastore admits one
process); then the statement goes to serve's SQL server over JDBC (Hive's beeline, from the jars pyspark
ships), and every value comes back as text.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import decimal
import io
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import pyspark
from pyspark.errors import AnalysisException

from jobs.config import Config
from jobs.errors import QueryError
from jobs.running import running_server
from jobs.session import build_session

FORMATS = ("table", "csv", "json")
PROMPT = re.compile(r"^\d+: jdbc:\S*> ")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", help='one Spark SQL statement, e.g. "SELECT count(*) FROM txn_recon.anomalies"')
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")


def run(args: argparse.Namespace, config: Config) -> int:
    jdbc = running_server(config)
    if jdbc is not None:
        columns, rows = query_server(jdbc, args.query)
        write_result(columns, rows, args.format, sys.stdout)
        return 0
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


def query_server(jdbc: str, query: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The statement's columns and rows from serve's SQL server (values as text, NULL as None)."""
    classpath = str(Path(pyspark.__file__).parent / "jars" / "*")
    # disable.quoting.for.sv=false: quote values with commas (beeline's CSV quotes nothing by default)
    out = subprocess.run(["java", "-Ddisable.quoting.for.sv=false", "-cp", classpath, "org.apache.hive.beeline.BeeLine",
                          "-u", jdbc, "--silent=true",
                          "--outputformat=csv2", "--nullemptystring=false", "-e", query],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:
        errors = [line for line in out.stderr.splitlines() if line.startswith("Error:")]
        raise QueryError(errors[0].removeprefix("Error: ") if errors else _first_line(out.stderr))
    # beeline echoes its prompt ("0: jdbc:hive2://...> ") in front of the header, even when silent.
    table = list(csv.reader(io.StringIO(PROMPT.sub("", out.stdout, count=1))))
    if not table:
        return [], []
    return table[0], [tuple(None if v == "NULL" else v for v in row) for row in table[1:]]


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
