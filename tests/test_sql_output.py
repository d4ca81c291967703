from __future__ import annotations

import datetime as dt
import io
import json

from jobs.sql import write_result

COLUMNS = ["topic", "n", "at", "detail"]
ROWS = [("orders", 3, dt.datetime(2026, 1, 2, 3, 4, 5), {"from": 100, "to": 40}), ("pay,ments", None, None, None)]


def _render(fmt: str) -> str:
    out = io.StringIO()
    write_result(COLUMNS, ROWS, fmt, out)
    return out.getvalue()


def test_json_lines() -> None:
    lines = [json.loads(line) for line in _render("json").splitlines()]
    assert lines == [
        {"topic": "orders", "n": 3, "at": "2026-01-02T03:04:05", "detail": {"from": 100, "to": 40}},
        {"topic": "pay,ments", "n": None, "at": None, "detail": None},
    ]


def test_csv_quotes_and_empty_nulls() -> None:
    assert _render("csv").splitlines() == [
        "topic,n,at,detail",
        'orders,3,2026-01-02 03:04:05,"{""from"": 100, ""to"": 40}"',
        '"pay,ments",,,',
    ]


def test_table_aligns_and_counts() -> None:
    lines = _render("table").splitlines()
    assert lines[0].split() == COLUMNS
    assert lines[2].startswith("orders     3     2026-01-02 03:04:05")
    assert lines[3].split() == ["pay,ments", "NULL", "NULL", "NULL"]
    assert lines[-1] == "(2 rows)"


def test_statement_without_result() -> None:
    out = io.StringIO()
    write_result([], [], "table", out)
    assert out.getvalue() == "OK\n"
