"""The documentation site's reference, generated from the code: the command line from its parsers, every
table and landing record from `schemas/`, every metric from serve's registry, every setting from
`conf/base.yaml` with its comment, and the finding types from `schemas.findings`. The site's build
(docs/hooks.py) writes these pages; nothing in them is copied by hand, so they cannot drift from the code.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Iterator
from html import escape
from pathlib import Path

from jobs.cli import JOBS, build_parser
from jobs.config import CONF_DIR
from schemas.findings import FINDINGS
from schemas.model import Schema

# The modules of `schemas/` whose Schema constants are documented, with the heading each gets.
SCHEMA_MODULES = {
    "landing": "Landing records (files in <landing>/<stream>/)",
    "bronze": "Bronze tables and ingest's bookkeeping",
    "reconciled": "Silver and gold tables",
    "quality": "Data quality tables",
    "service": "Serve's tables",
    "truth": "The broker model's truth (beside a simulated landing)",
}


def _cell(text: str) -> str:
    """Text for a table cell: pipes escaped, and outside code spans HTML's and emphasis' marks (`<group>` is a
    placeholder, `__transactionId__` a property's name)."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else re.sub(r"([_*])", r"\\\1", escape(p, quote=False)) for i, p in enumerate(parts))


def cli_page() -> str:
    """Every command with its options, as `--help` prints them."""
    parser = build_parser()
    out = ["# Command line", "", "Generated from the argument parsers (`jobs/cli.py` and each job's module).", "",
           "```text", parser.format_help().rstrip(), "```", ""]  # fmt: skip
    for name in JOBS:
        commands = next(a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction))
        out += [f"## txn-recon {name}", "", "```text", commands.choices[name].format_help().rstrip(), "```", ""]
    return "\n".join(out)


def schemas() -> Iterator[tuple[str, list[Schema]]]:
    """(module, its Schema constants, also those inside a dict) in definition order, each once."""
    seen: set[str] = set()
    for module_name in SCHEMA_MODULES:
        module = importlib.import_module(f"schemas.{module_name}")
        found = []
        for value in vars(module).values():
            for s in value.values() if isinstance(value, dict) else [value]:
                if isinstance(s, Schema) and s.name not in seen:
                    seen.add(s.name)
                    found.append(s)
        yield module_name, found


def tables_page() -> str:
    out = ["# Tables and records", "", "Generated from `schemas/`: every landing record and table, each column "
           "with its type and meaning. Keys are the columns that identify a row.", ""]  # fmt: skip
    for module_name, found in schemas():
        out += [f"## {SCHEMA_MODULES[module_name]}", ""]
        for s in found:
            out += [f"### {s.name}", "", f"Key: {', '.join(f'`{k}`' for k in s.key) or 'none'}.", "",
                    "| column | type | null | meaning |", "|---|---|---|---|"]  # fmt: skip
            out += [f"| `{f.name}` | {f.type} | {'yes' if f.nullable else 'no'} | {_cell(f.doc)} |" for f in s.fields]
            out.append("")
    return "\n".join(out)


def metrics() -> list[tuple[str, str, list[str]]]:
    """(name, help, labels) of every metric serve exports."""
    from prometheus_client.metrics import MetricWrapperBase

    from jobs.web import Metrics  # the registry is built in its constructor

    found = [m for m in vars(Metrics()).values() if isinstance(m, MetricWrapperBase)]
    return [(m._name + ("_total" if m._type == "counter" else ""), m._documentation, list(m._labelnames))
            for m in found]  # fmt: skip


def metrics_page() -> str:
    out = ["# Metrics", "", "Generated from serve's registry (`jobs/web.py`), at `/metrics` on `serve.http`.", "",
           "| metric | labels | meaning |", "|---|---|---|"]  # fmt: skip
    for name, doc, labels in metrics():
        out.append(f"| `{name}` | {', '.join(labels)} | {_cell(doc)} |")
    return "\n".join(out) + "\n"


def settings(path: Path | None = None) -> list[tuple[str, str, str]]:
    """(dotted key, default, comment) of every setting in conf/base.yaml: the comment on its line, else the
    comment lines right above it. A list's items are its default."""
    text = (path or CONF_DIR / "base.yaml").read_text(encoding="utf-8")
    out: list[tuple[str, str, str]] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the maps we are in
    above: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            above = []
            continue
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# ").strip())
            continue
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("- "):
            key, value, comment = out[-1]
            out[-1] = (key, f"{value} {stripped}".strip(), comment)
            continue
        m = re.match(r"([^:#]+):\s*(.*?)\s*(?:#\s*(.*))?$", stripped)
        if not m:  # a flow list's next line
            key, value, comment = out[-1]
            out[-1] = (key, f"{value} {stripped}", comment)
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [m[1].strip()])
        comment = m[3] or " ".join(above)
        above = []
        if m[2]:
            out.append((key, m[2], comment))
        else:
            stack.append((indent, m[1].strip()))
            out.append((key, "", comment))
    # A map's own row stays only where it documents something its keys do not (its comment).
    keys = {k for k, _, _ in out}
    return [(k, v, c) for k, v, c in out if v or c or not any(o.startswith(k + ".") for o in keys)]


def settings_page() -> str:
    out = ["# Settings", "", "Generated from `conf/base.yaml`: every setting with its default and its comment. "
           "Environment files and `--conf FILE` layer over it (see Configuration).", "",
           "| setting | default | meaning |", "|---|---|---|"]  # fmt: skip
    out += [f"| `{k}` | {f'`{_cell(v)}`' if v else ''} | {_cell(c)} |" for k, v, c in settings()]
    return "\n".join(out) + "\n"


def findings_page() -> str:
    out = ["# Finding types", "", "Generated from `schemas/findings.py`. Each type has a page: what it means, how "
           "RocketMQ gets there, how to confirm it and what to do.", "", "| type | in short |",
           "|---|---|"]  # fmt: skip
    out += [f"| [`{t}`](../findings/{t}.md) | {_cell(s)} |" for t, s in FINDINGS.items()]
    return "\n".join(out) + "\n"


PAGES = {
    "reference/cli.md": cli_page,
    "reference/tables.md": tables_page,
    "reference/metrics.md": metrics_page,
    "reference/settings.md": settings_page,
    "reference/findings.md": findings_page,
}


def first_paragraph(markdown: str) -> str:
    """A page's first paragraph after its title, as one line of plain text."""
    paragraphs = [p for p in re.split(r"\n\s*\n", markdown) if p.strip() and not p.lstrip().startswith("#")]
    return " ".join(paragraphs[0].split()).replace("`", "") if paragraphs else ""
