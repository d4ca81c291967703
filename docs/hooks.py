"""MkDocs hooks: the reference pages generated from the code (jobs/reference.py) join the site at each build
(none of them is a file in docs/), and a list right under a paragraph's last line is a list, as it is on
GitHub (Python-Markdown wants a blank line first)."""

from __future__ import annotations

import re
from typing import Any

from mkdocs.structure.files import File, Files

from jobs.reference import PAGES


def on_files(files: Files, config: Any) -> Files:
    for path, page in PAGES.items():
        files.append(File.generated(config, path, content=page()))
    return files


def on_page_markdown(markdown: str, **_: Any) -> str:
    out: list[str] = []
    fenced = False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        item = not fenced and re.match(r"\s*(?:[-*] |\d+\. )", line)
        if (
            item
            and out
            and out[-1].strip()
            and not re.match(r"\s*(?:[-*] |\d+\. |\|)", out[-1])
            and not (out[-1].startswith(" "))
        ):
            out.append("")
        out.append(line)
    return "\n".join(out)
