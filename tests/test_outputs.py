"""What people look at after `txn-recon run`: the printed paths, the dashboard in a real headless
Chromium, the notebooks executed top to bottom, and the documentation's ready queries in spark-sql.

One pipeline run in a separate process fills a warehouse for all of them: notebooks and spark-sql open
its embedded Derby metastore, which admits one process at a time, so this test process reads its Delta
tables by path only. That run has the README's Spark settings, not the suite's small-data defaults
(tests/spark-conf): it is the suite's one pipeline that generates code, as production does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from pyspark.sql import SparkSession

from broker.landing import LandingWriter
from broker.profiles import PROFILES
from broker.simulation import simulate
from tests.conftest import REPO, SUITE_SPARK_ARGS, add_test_defaults

pytestmark = pytest.mark.spark

BIN = Path(sys.executable).parent
ARTIFACTS = REPO / "artifacts"
HOUR = 3_600_000
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


@dataclass(frozen=True)
class Shipped:
    warehouse: Path
    stdout: str
    as_of: int

    def table(self, spark: SparkSession, name: str) -> list[dict[str, Any]]:
        return [
            r.asDict() for r in spark.read.format("delta").load(str(self.warehouse / "txn_recon.db" / name)).collect()
        ]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Shipped:
    """The chaos profile (every anomaly type at this seed), reconciled an hour after its last event, so
    the halves still pending have been stuck for over an hour."""
    root = tmp_path_factory.mktemp("shipped")
    writer = LandingWriter(root / "landing", "jsonl", 5000)
    summary = simulate(800, 17, dataclasses.replace(PROFILES["chaos"], txn_per_second=2.0), writer)
    writer.close(summary, {})
    as_of = summary.as_of + HOUR
    cmd = [str(BIN / "txn-recon"), "run", "--landing", str(root / "landing"), "--warehouse", str(root / "wh"),
           "--as-of", str(as_of)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", SUITE_SPARK_ARGS)}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    (ARTIFACTS / "pipeline.log").parent.mkdir(exist_ok=True)
    (ARTIFACTS / "pipeline.log").write_text(done.stderr + done.stdout)
    return Shipped(root / "wh", done.stdout, as_of)


def test_run_ends_with_the_dashboard_and_data_docs(shipped: Shipped, spark: SparkSession) -> None:
    last = shipped.stdout.strip().splitlines()[-2:]
    assert last[0].startswith("dashboard: ") and last[1].startswith("Data Docs: ")
    dashboard, docs = Path(last[0].split(": ", 1)[1]), Path(last[1].split(": ", 1)[1])
    assert dashboard.is_file() and docs.is_file()
    assert "half_events" in docs.read_text() and "anomalies" in docs.read_text()
    results = shipped.table(spark, "dq_results")
    assert len(results) > 100 and all(r["success"] for r in results), [r for r in results if not r["success"]]
    assert re.search(r"quality \S+: (\d+) expectations, \1 passed, 0 failed", shipped.stdout)
    # Every stream landed something, and nothing failed or went to quarantine.
    rows = [
        line.split() for line in shipped.stdout.splitlines() if re.match(r"(half|op|real|offset|consumer) +\d", line)
    ]
    assert {r[0] for r in rows} == {"half", "op", "real", "offset", "consumer"}
    assert all(int(r[2]) == 0 and int(r[6]) == 0 and int(r[4]) > 0 for r in rows), rows
    assert shipped.table(spark, "quarantine") == []


def test_dashboard_renders_in_headless_chromium(shipped: Shipped, spark: SparkSession, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), "Debian's chromium and chromium-driver: run `make browser`"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1000"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        page = shipped.warehouse / "_report" / "dashboard.html"
        driver.get(page.as_uri())
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert errors == []
        # Every chart drew marks with a real size on screen.
        charts = driver.execute_script(
            "return Array.from(document.querySelectorAll('svg.chart')).map(function (svg) {"
            "  var marks = Array.from(svg.querySelectorAll('.mark'));"
            "  var area = marks.reduce(function (a, m) {"
            "    var b = m.getBoundingClientRect(); return a + b.width * b.height; }, 0);"
            "  return [svg.getAttribute('aria-label'), marks.length, area]; })"
        )  # fmt: skip
        groups = {r["consumer_group"] for r in shipped.table(spark, "deliveries")}  # a chart each, and 6 more
        assert len(charts) == 6 + len(groups) and all(n > 0 and area > 0 for _, n, area in charts), charts
        anomalies = shipped.table(spark, "anomalies")
        kinds = Counter(a["anomaly_type"] for a in anomalies)
        regression_marks = next(n for label, n, _ in charts if label == "offset regressions")
        assert regression_marks == kinds["OFFSET_REGRESSION"] > 0
        # Each anomaly shows its key: the discarded table lists exactly the discarded anomalies' ids.
        shown = {c.text for c in driver.find_elements(By.CSS_SELECTOR, "#discarded td.key") if len(c.text) == 64}
        assert shown == {a["anomaly_id"] for a in anomalies if a["anomaly_type"].startswith("DISCARDED_")}
        rechecked = {c.text for c in driver.find_elements(By.CSS_SELECTOR, "#rechecked td.key") if len(c.text) == 64}
        assert rechecked and rechecked == {a["anomaly_id"] for a in anomalies
                                           if a["anomaly_type"] == "RECHECKED_AFTER_RESOLUTION"}  # fmt: skip
        # Brokers: a line per master of the topology, broker-c's (never given a topic) at zero; the gaps by id.
        [writes] = [c for c in driver.find_elements(By.CSS_SELECTOR, "#brokers svg.chart")]
        drawn = writes.get_attribute("innerHTML") or ""
        assert len(writes.find_elements(By.TAG_NAME, "polyline")) == 3 and "broker-c: 0" in drawn
        gaps = {c.text for c in driver.find_elements(By.CSS_SELECTOR, "#topic-gaps td.key") if len(c.text) == 64}
        assert gaps and gaps == {a["anomaly_id"] for a in anomalies if a["anomaly_type"] == "TOPIC_NOT_ON_BROKER"}
        # The consumer-group view: stranded queues and hand-offs by id, and the group members by client id.
        for table, kind in (("stranded", "STRANDED_QUEUE"), ("handoffs", "REDELIVERY_AT_HANDOFF"),
                            ("conflicts", "SUBSCRIPTION_CONFLICT"), ("dead_letters", "DEAD_LETTERED")):  # fmt: skip
            ids = {c.text for c in driver.find_elements(By.CSS_SELECTOR, f"#{table} td.key") if len(c.text) == 64}
            assert ids and ids == {a["anomaly_id"] for a in anomalies if a["anomaly_type"] == kind}, table
        # Deliveries: per group, the messages it wants, as the table holds them.
        wanted = Counter(r["consumer_group"] for r in shipped.table(spark, "deliveries"))
        trs = driver.find_elements(By.CSS_SELECTOR, "#deliveries tr")
        shown_rows = [r.find_elements(By.TAG_NAME, "td") for r in trs]
        assert wanted and {c[0].text: int(c[1].get_attribute("data-v") or "") for c in shown_rows if c} == wanted
        charts = {c.get_attribute("aria-label") for c in driver.find_elements(By.CSS_SELECTOR, "#groups svg.chart")}
        assert {g for g in wanted if any(str(c).startswith(f"{g}: messages by status") for c in charts)} == set(wanted)
        members = {r["client_id"] for r in shipped.table(spark, "consumer_events") if r["client_id"]}
        shown_members = {c.text for c in driver.find_elements(By.CSS_SELECTOR, "#group-members td")}
        assert shown_members & members
        # Tables sort by a click on a header, then reverse on a second click.
        header = driver.find_element(By.XPATH, "//table[@id='discarded']//th[text()='event_ts']")
        column = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "#discarded th")].index("event_ts")
        cells = f"#discarded tbody tr td:nth-child({column + 1})"

        def times() -> list[int]:
            return [int(c.get_attribute("data-v") or "") for c in driver.find_elements(By.CSS_SELECTOR, cells)]

        header.click()
        assert times() == sorted(times()) and len(set(times())) > 1
        header.click()
        assert times() == sorted(times(), reverse=True)
        driver.execute_script("window.scrollTo(0, 0)")
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1280, min(height, 16000))
        ARTIFACTS.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    finally:
        driver.quit()


@pytest.mark.parametrize("name", ["exploration", "dashboard"])
def test_notebook_runs_top_to_bottom(shipped: Shipped, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = REPO / "notebooks" / f"{name}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    assert all(
        not c.get("outputs") and c.get("execution_count") is None for c in notebook.cells if c.cell_type == "code"
    )
    monkeypatch.setenv("TXN_RECON_WAREHOUSE", str(shipped.warehouse))
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    text = json.dumps([o for c in notebook.cells for o in c.get("outputs", [])])
    assert "error" not in {o.get("output_type") for c in notebook.cells for o in c.get("outputs", [])}
    if name == "exploration":
        assert "ORPHANED_COMMIT" in text and "half copy" in text and "final message" in text
    else:
        assert '<svg class=\\"chart\\"' in text and f"dashboard: {shipped.warehouse}" in text


def _docs_queries() -> list[str]:
    """The documentation's ready queries."""
    page = (REPO / "docs" / "getting-started" / "queries.md").read_text()
    return re.findall(r"```sql\n(.*?)```", page, flags=re.S)


def test_docs_queries_run_as_written_in_spark_sql(shipped: Shipped, spark: SparkSession, tmp_path: Path) -> None:
    queries = _docs_queries()
    assert len(queries) == 8
    # One spark-sql process for all of them (a JVM start each would be slow); a marker row separates them.
    script = "".join(f"SELECT 'query {i}';\n{q}" for i, q in enumerate(queries))
    (tmp_path / "queries.sql").write_text(script)
    # As documented: `txn-recon spark-conf`, then the venv's spark-sql (it finds Spark through python3 on PATH).
    conf = subprocess.run([str(BIN / "txn-recon"), "spark-conf", "--warehouse", str(shipped.warehouse), "--out",
                           str(tmp_path / "conf")], capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert conf.returncode == 0, conf.stderr
    add_test_defaults(tmp_path / "conf" / "spark-defaults.conf")
    env = {**os.environ, "SPARK_CONF_DIR": str(tmp_path / "conf"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([str(BIN / "spark-sql"), "-f", str(tmp_path / "queries.sql")], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    outputs: list[list[list[str]]] = []
    for line in done.stdout.splitlines():
        if re.fullmatch(r"query \d", line.strip()):
            outputs.append([])
        elif outputs and line.strip():
            outputs[-1].append(line.split("\t"))
    assert outputs == _expected(shipped, spark)
    assert all(outputs), "every query has rows on the pipeline's output"


def _expected(shipped: Shipped, spark: SparkSession) -> list[list[list[str]]]:
    """The answers computed in Python from the Delta tables, independently of the SQL."""
    anomalies, life = shipped.table(spark, "anomalies"), shipped.table(spark, "txn_lifecycle")

    def detail(a: dict[str, Any], field: str) -> Any:
        return json.loads(a["detail"]).get(field)

    stuck = [a for a in anomalies if a["anomaly_type"] == "STUCK_HALF" and a["as_of"] - a["event_ts"] > HOUR]
    stuck_rows = sorted(([a["broker_name"], a["uniq_key"], detail(a, "producer_group"),
                          round((a["as_of"] - a["event_ts"]) / 60000, 1), detail(a, "check_times")] for a in stuck),
                        key=lambda r: (-r[3], r[0], r[1]))  # fmt: skip
    discards = Counter((t["producer_group"], t["reason"]) for t in life if t["state"] == "DISCARDED")
    discard_rows = sorted(((g, r, n) for (g, r), n in discards.items()), key=lambda r: (-r[2], r[0], r[1]))
    dup: dict[str, list[int]] = {}
    for t in life:
        if t["commit_count"] > 1:
            dup.setdefault(t["first_commit_topic"], []).append(t["commit_count"] - 1)
    dup_rows = sorted(((k, len(v), sum(v)) for k, v in dup.items()), key=lambda r: (-r[2], r[0]))
    groups: dict[str, list[dict[str, Any]]] = {}
    for a in anomalies:
        if a["anomaly_type"] == "OFFSET_REGRESSION":
            groups.setdefault(a["consumer_group"], []).append(a)
    regression_rows = sorted(
        ([g, len(v), len({(a["topic"], a["queue_id"]) for a in v}), sum(detail(a, "redelivery_estimate") for a in v)]
         for g, v in groups.items()), key=lambda r: (-r[3], r[0]),
    )  # fmt: skip
    stranded = [a for a in anomalies if a["anomaly_type"] == "STRANDED_QUEUE"]
    stranded_rows = sorted(([a["consumer_group"], a["topic"], a["queue_id"], a["broker_name"], detail(a, "lag"),
                             detail(a, "cause"), round((detail(a, "until") - a["event_ts"]) / 60000, 1),
                             str(detail(a, "ongoing")).lower()] for a in stranded),
                           key=lambda r: (-r[4], r[0], r[1], r[2]))  # fmt: skip
    counts = {"REDELIVERY_AT_HANDOFF": "duplicates_estimate", "OFFSET_REGRESSION": "redelivery_estimate",
              "OFFSET_JUMP": "skipped"}  # fmt: skip
    per_group: dict[str, list[int]] = {}
    for a in anomalies:
        if a["anomaly_type"] in counts:
            sums = per_group.setdefault(a["consumer_group"], [0, 0, 0])
            sums[list(counts).index(a["anomaly_type"])] += detail(a, counts[a["anomaly_type"]])
    duplicate_rows = [[g, *v] for g, v in sorted(per_group.items(), key=lambda kv: (-(kv[1][0] + kv[1][1]), kv[0]))]
    snapshot = shipped.table(spark, "consumer_events")
    latest = {g: max(r["snapshot_ts"] for r in snapshot if r["consumer_group"] == g)
              for g in {r["consumer_group"] for r in snapshot}}  # fmt: skip
    subscribed: dict[tuple[str, str], set[str]] = {}
    for r in snapshot:
        if r["kind"] == "subscription" and r["snapshot_ts"] == latest[r["consumer_group"]]:
            who = r["client_id"] or f"broker {r['broker_name']}"
            subscribed.setdefault((r["consumer_group"], who), set()).add(f"{r['topic']} {r['expression']}")
    member_rows = [[g, who, ", ".join(sorted(subs))] for (g, who), subs in sorted(subscribed.items())]
    dead: dict[tuple[str, str], list[int]] = {}
    for a in anomalies:
        if a["anomaly_type"] == "DEAD_LETTERED":
            n = dead.setdefault((a["consumer_group"], a["topic"]), [0, 0])
            n[0], n[1] = n[0] + 1, n[1] + (detail(a, "transaction_id") is not None)
    dead_rows = [[g, t, *n] for (g, t), n in sorted(dead.items(), key=lambda kv: (-kv[1][0], kv[0]))]
    answers = (stuck_rows, discard_rows, dup_rows, regression_rows, stranded_rows, duplicate_rows, dead_rows,
               member_rows)  # fmt: skip
    return [[[str(v) for v in row] for row in rows] for rows in answers]
