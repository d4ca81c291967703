"""The dashboard page from gathered data, without Spark: self-contained, every finding drawn and keyed."""

from __future__ import annotations

import re
from typing import Any

from dashboard.charts import bucket_ms, stacked_bars
from dashboard.page import render

T0 = 1_767_225_600_000  # 2026-01-01 00:00 UTC


def _data() -> dict[str, Any]:
    txn = {"anomaly_type": "DISCARDED_EXPIRED", "reason": "EXPIRED", "broker_name": "broker-a", "uniq_key": "K1",
           "producer_group": "pg-<orders>", "real_topic": "orders", "state": "DISCARDED", "event_ts": T0 + 5000,
           "detail": '{"check_times": 3}', "anomaly_id": "a" * 64}  # fmt: skip
    regression = {"consumer_group": "cg", "topic": "orders", "queue_id": 1, "broker_name": "broker-a",
                  "event_ts": T0 + 9000, "from_offset": "40", "to_offset": "10", "redelivery_estimate": "30",
                  "client_before": "c1", "client_after": "c2", "anomaly_id": "b" * 64}  # fmt: skip
    return {
        "database": "txn_recon",
        "generated_at": "2026-11-21 03:00:00 UTC",
        "as_of": T0 + 60_000,
        "states": {"COMMITTED": 5, "PENDING": 1},
        "anomaly_counts": {"DISCARDED_EXPIRED": 1, "OFFSET_REGRESSION": 1},
        "states_over_time": {
            "bucket_ms": 1000,
            "counts": [(T0, "COMMITTED", 3), (T0 + 3000, "COMMITTED", 2), (T0 + 3000, "PENDING", 1)],
        },
        "anomalies_over_time": {
            "bucket_ms": 1000,
            "counts": [(T0 + 5000, "DISCARDED_EXPIRED", 1), (T0 + 9000, "OFFSET_REGRESSION", 1)],
        },
        "stuck_age_bins": [("< 5 min", 0), ("5-15 min", 2)],
        "stuck_oldest": [],
        "stuck_total": 2,
        "discarded": [txn],
        "discarded_total": 1,
        "orphaned": [],
        "orphaned_total": 0,
        "duplicates": [],
        "duplicates_total": 0,
        "rechecked": [dict(txn, anomaly_type="RECHECKED_AFTER_RESOLUTION", uniq_key="K2", anomaly_id="c" * 64)],
        "rechecked_total": 1,
        "op_lag": {"bucket_ms": 1000, "rows": [(T0, 400), (T0 + 2000, 5_400)]},
        "regressions": [regression],
        "regressions_total": 1,
        "dq_latest": [
            {
                "suite": "half_events",
                "expectation": "expect_x(queue_offset)",
                "success": False,
                "unexpected_count": 1,
                "unexpected_sample": "[-5]",
            }
        ],
        "dq_runs": [],
        "ingest_runs": [],
        "reconcile_runs": [],
        # broker-b is a master of the topology that stored nothing: a line at zero.
        "broker_writes": {"bucket_ms": 60_000, "counts": [(T0, "broker-a", 30), (T0 + 60_000, "broker-a", 20)]},
        "brokers": ["broker-a", "broker-b"],
        "topic_gaps": [
            {
                "broker_name": "broker-b",
                "topic": "orders",
                "reason": "MISSING",
                "cluster": "C",
                "since": str(T0),
                "until": None,
                "served_by": '["broker-a"]',
                "fix": "mqadmin updateTopic -c C -t orders -w 4 -r 4",
                "anomaly_id": "d" * 64,
            }
        ],
        "topic_gaps_total": 1,
        "trace": {
            "discard_causes": [{"cause": "ANSWERED_UNKNOWN", "discards": 7}, {"cause": "UNANSWERED", "discards": 2}],
            "groups": [
                {
                    "consumer_group": "cg",
                    "latency_p50_s": 0.25,
                    "latency_p99_s": 3.5,
                    "traced_last_hour": 40,
                    "duplicates": 5,
                    "predicted": 4,
                    "missed": 1,
                    "failed_messages": 0,
                }
            ],
            "contradictions": [],
            "contradictions_total": 0,
        },
    }


def test_page_is_self_contained_and_escaped() -> None:
    html = render(_data())
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "<link" not in html and "<script src" not in html and "@import" not in html
    assert "pg-&lt;orders&gt;" in html and "pg-<orders>" not in html


def test_every_finding_is_drawn_and_keyed() -> None:
    html = render(_data())
    charts = re.findall(r'<svg class="chart[^"]*" role="img" aria-label="([^"]+)"(.*?)</svg>', html, flags=re.S)
    marks = {label: body.count('class="mark"') for label, body in charts}
    # 3 bars of states (bucket 0: committed; bucket 3: committed + pending), 2 anomaly bars, 1 age bar,
    # 2 op-lag bars, 1 regression circle.
    assert marks == {"transactions by state per 1 s": 3, "anomalies by type per 1 s": 2, "stuck-half age": 1,
                     "largest op lag per 1 s": 2, "offset regressions": 1,
                     "messages stored per broker per 60 s": 4}  # fmt: skip
    writes = next(body for label, body in charts if label.startswith("messages stored per broker"))
    assert "broker-b: 0" in writes and "broker-a: 30" in writes and writes.count("<polyline") == 2
    assert "mqadmin updateTopic -c C -t orders -w 4 -r 4" in html and "d" * 64 in html
    assert "a" * 64 in html and "b" * 64 in html and "c" * 64 in html
    assert "op lag: 5,400" in html
    assert '<tr class="fail">' in html  # the failed expectation stands out
    assert 'id="orphaned"' in html and "None." in html  # an empty table says so
    # The trace section: discards by cause, and per group the latency and the duplicates the offsets missed.
    trace = html.split('<section id="trace">', 1)[1].split("</section>", 1)[0]
    assert "ANSWERED_UNKNOWN" in trace and ">7<" in trace and ">3.5<" in trace and ">1<" in trace


def test_bars_scale_to_the_largest_total() -> None:
    svg = stacked_bars("t", ["x", "y"], {"a": [2, 4], "b": [2, 0]})
    heights = [float(h) for h in re.findall(r'class="mark"[^>]*height="([\d.]+)"', svg)]
    assert heights[0] == heights[1] == heights[2] / 2 > 0  # 2 + 2 stacked on x, 4 alone on y


def test_bucket_width_keeps_at_most_sixty_bars() -> None:
    assert bucket_ms(0, 59_000) == 1000
    assert bucket_ms(0, 3_600_000) == 60_000
    assert bucket_ms(0, 400 * 86_400_000) == 7 * 86_400_000
