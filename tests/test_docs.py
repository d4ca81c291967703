"""The documentation site: built strictly (a broken link or anchor fails), its generated reference against the
code and back, a page of the same shape per finding type, every alert's runbook a page, `txn-recon explain`,
the site served by serve at /docs/, and the home and a finding page looked at in headless Chromium. The README
stays short. No Spark session.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import pytest
import yaml

from jobs.cli import JOBS, build_parser, main
from jobs.reference import first_paragraph, metrics, schemas, settings
from jobs.web import Health, Metrics, site_file, start_http
from schemas.findings import FINDINGS
from tests.conftest import REPO
from tests.test_dashboard import _data
from tests.test_outputs import CHROMEDRIVER, CHROMIUM

BIN = REPO / ".venv" / "bin"
DOCS = REPO / "docs"
SHAPE = ("## How RocketMQ gets there", "## How to confirm", "## What to do")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "-d", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-3000:]
    return out


def text_of(site: Path, page: str) -> str:
    """A built page's text, tags dropped."""
    return unescape(re.sub(r"<[^>]+>", " ", (site / page / "index.html").read_text()))


def test_the_readme_is_short_and_links_only_pages_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make run" in readme and "make test" in readme
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links and all((REPO / link).exists() for link in links), [x for x in links if not (REPO / x).exists()]


def test_the_command_line_reference_has_every_command_and_option(site: Path) -> None:
    page = text_of(site, "reference/cli")
    for name in JOBS:
        assert f"txn-recon {name}" in page, name
        commands = next(a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction))
        for action in commands.choices[name]._actions:
            assert all(option in page for option in action.option_strings), (name, action.option_strings)
    # And nothing else: a section per command.
    assert len(re.findall(r"<h2 id=", (site / "reference/cli/index.html").read_text())) == len(JOBS)


def test_the_tables_metrics_and_settings_are_those_of_the_code(site: Path) -> None:
    tables = (site / "reference/tables/index.html").read_text()
    documented = re.findall(r'<h3 id="[^"]*">([^<]+)', tables)
    found = [s for _, module in schemas() for s in module]
    assert documented == [s.name for s in found]
    rows = re.findall(r"<tr>\s*<td><code>([^<]+)</code>", tables)
    assert rows == [f.name for s in found for f in s.fields]
    words = " ".join(text_of(site, "reference/tables").split())
    for s in found:  # every column's meaning, as its Field.doc says (markdown's code marks dropped)
        missing = [f.name for f in s.fields if " ".join(f.doc.replace("`", "").split()) not in words]
        assert not missing, (s.name, missing)

    shown = re.findall(r"<tr>\s*<td><code>([^<]+)</code>", (site / "reference/metrics/index.html").read_text())
    exported = {m.name for m in Metrics().registry.collect()}
    assert shown == [name for name, _, _ in metrics()]
    assert {name.removesuffix("_total") for name in shown} == exported

    keys = re.findall(r"<tr>\s*<td><code>([^<]+)</code>", (site / "reference/settings/index.html").read_text())
    assert keys == [k for k, _, _ in settings()]

    def leaves(doc: dict[str, object], prefix: str = "") -> Iterator[str]:
        for k, v in doc.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]

    assert set(leaves(yaml.safe_load((REPO / "conf" / "base.yaml").read_text()))) <= set(keys)
    assert all(comment for _, _, comment in settings()), [k for k, _, c in settings() if not c]


def test_every_finding_type_has_one_page_of_the_same_shape(site: Path) -> None:
    pages = {p.stem for p in (DOCS / "findings").glob("*.md")}
    assert pages == set(FINDINGS)  # a page for every type, and no page for a type the code does not have
    for kind in FINDINGS:
        text = (DOCS / "findings" / f"{kind}.md").read_text()
        assert text.startswith(f"# {kind}\n") and first_paragraph(text), kind
        assert [h for h in re.findall(r"^## .*", text, flags=re.M)] == list(SHAPE), kind
        assert "```sql" in text and "txn_recon." in text, kind
        assert re.search(r"`[A-Z]\w+(\.\w+)?`|reference §", text), f"{kind} cites no RocketMQ source"
        assert (site / "findings" / kind / "index.html").is_file()
    article = (site / "reference/findings/index.html").read_text().split("<article", 1)[1].split("</article>")[0]
    listed = re.findall(r'href="\.\./\.\./findings/(\w+)/"', article)
    assert listed == list(FINDINGS)


def test_every_alert_has_a_runbook_page(site: Path) -> None:
    rules = yaml.safe_load((REPO / "conf/alerts/txn-recon.rules.yml").read_text())["groups"][0]["rules"]
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        path = url.split("/docs/", 1)[1]
        if "{{ $labels.type }}" in path:  # one page for each type the expression names
            types = re.search(r'type=~?"([^"]+)"', rule["expr"])
            assert types, rule["alert"]
            paths = [path.replace("{{ $labels.type }}", t) for t in types[1].split("|")]
        else:
            paths = [path]
        assert url.startswith("http://{{ $labels.instance }}/docs/"), rule["alert"]
        for p in paths:
            assert site_file(site, p) is not None, (rule["alert"], p)


def test_explain_prints_the_pages_first_paragraph(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "undelivered"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"UNDELIVERED: {first_paragraph((DOCS / 'findings' / 'UNDELIVERED.md').read_text())}"
    assert main(["explain", "NOT_A_TYPE"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'NOT_A_TYPE' is no finding type" in err and "ORPHANED_COMMIT" in err


@pytest.fixture(scope="module")
def served(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """serve's HTTP server, with the built site as its manual and a dashboard of test_dashboard's data."""
    from dashboard.page import render

    dashboard = tmp_path_factory.mktemp("dashboard") / "dashboard.html"
    dashboard.write_text(render(_data()))
    server = start_http("127.0.0.1:0", Metrics(), Health(60, 3, dashboard), site=site)
    yield "http://{}:{}".format(*server.server_address[:2])
    server.shutdown()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_serve_serves_the_manual_the_dashboard_links_to(served: str) -> None:
    status, home = _get(f"{served}/docs/")
    assert status == 200 and "<h1" in home
    status, dashboard = _get(f"{served}/")
    links = set(re.findall(r'href="(docs/findings/[^"]+)"', dashboard))
    assert {link.split("/")[2] for link in links} == set(FINDINGS)  # every type links to its page
    assert all(_get(f"{served}/{link}")[0] == 200 for link in links)
    assert _get(f"{served}/docs/../conf/base.yaml")[0] == 404
    assert _get(f"{served}/docs/findings/NOPE/")[0] == 404


def test_the_site_renders_in_headless_chromium(served: str, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), "Debian's chromium and chromium-driver: run `make browser`"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}",
                 "--window-size=1280,1000"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        for path, heading in (("/docs/", "txn-recon"), ("/docs/findings/ORPHANED_COMMIT/", "ORPHANED_COMMIT")):
            driver.get(served + path)
            h1 = driver.find_element(By.CSS_SELECTOR, "article h1")
            assert h1.text.strip().rstrip("¶").strip() == heading and h1.size["height"] > 0
            links = driver.find_elements(By.CSS_SELECTOR, "nav.md-nav--primary .md-nav__link")
            nav = {(a.get_attribute("textContent") or "").strip() for a in links}
            assert {"Getting started", "Findings", "Reference", "ORPHANED_COMMIT"} <= nav, nav
            assert any(a.is_displayed() for a in links)  # the navigation is on screen, not only in the page
            sections = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "article h2")]
            if "findings" in path:
                assert [s.rstrip("¶").strip() for s in sections] == [h[3:] for h in SHAPE]
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == [], errors
    finally:
        driver.quit()
