"""The Prometheus alerting rules shipped in conf/alerts: valid, doing what their unit tests say (promtool,
from Debian's prometheus package, which `make test` installs), and about metrics `serve` exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from prometheus_client import generate_latest

from jobs.web import Metrics

ALERTS = Path(__file__).resolve().parent.parent / "conf" / "alerts"


def promtool(*args: str) -> str:
    out = subprocess.run(["promtool", *args], cwd=ALERTS, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_rules_are_valid_and_fire_as_their_unit_tests_say() -> None:
    assert "SUCCESS: 16 rules found" in promtool("check", "rules", "txn-recon.rules.yml")
    assert "SUCCESS" in promtool("test", "rules", "txn-recon.rules.test.yml")


def test_the_rules_name_only_metrics_serve_exports() -> None:
    exported = set(re.findall(r"^# TYPE (\w+) ", generate_latest(Metrics().registry).decode(), re.M))
    used = set(re.findall(r"\b(txn_recon_\w+)", (ALERTS / "txn-recon.rules.yml").read_text()))
    assert used and used <= exported, used - exported
