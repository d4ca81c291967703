"""The dashboard page: gathered data (see `jobs.report.gather`) into one self-contained HTML document.

Pure: no Spark, no file access. Styles and the table-sorting script are inline and nothing is loaded
from the network, so the file works offline and can be mailed or archived as it is.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from dashboard.charts import lines, stacked_bars, time_label, timeline
from schemas.quality import ANOMALY_TYPES, DELIVERY_STATUSES

STATE_ORDER = ("COMMITTED", "ROLLED_BACK", "DISCARDED", "PENDING")

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 24px 48px; color: #222; }
h1 { font-size: 22px; margin: 20px 0 4px; } h2 { font-size: 17px; margin: 32px 0 8px; border-bottom: 1px solid #ddd; }
.meta { color: #666; } .cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card b { display: block; font-size: 20px; }
a.card { color: inherit; text-decoration: none; } .bad b { color: #b00020; } .good b { color: #137333; }
div.scroll { max-height: 440px; overflow: auto; border: 1px solid #eee; display: inline-block; max-width: 100%; }
table { border-collapse: collapse; margin: 8px 0; font-size: 12.5px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; cursor: pointer; user-select: none; white-space: nowrap; }
th.asc::after { content: " \\25b2"; } th.desc::after { content: " \\25bc"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; } td.key { font-family: monospace; font-size: 11.5px; }
tr.fail td { background: #fde7e9; } .note { color: #666; font-size: 12.5px; }
svg.chart { display: block; margin: 8px 0; } svg .axis { stroke: #888; } svg .grid { stroke: #eee; }
svg text { font-size: 11px; fill: #444; } svg .label { font-size: 12px; }
"""

# Click a header to sort by it; a cell's data-v (a number) sorts numerically.
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var asc = !th.classList.contains("asc");
      table.querySelectorAll("th").forEach(function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(asc ? "asc" : "desc");
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col], y = b.cells[col];
        var nx = parseFloat(x.dataset.v), ny = parseFloat(y.dataset.v);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.textContent.localeCompare(y.textContent);
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


TRACE_TYPES = (
    "DISCARDED_AFTER_MAX_CHECKS",
    "CHECK_ANSWER_LOST",
    "DUPLICATE_CONSUMPTION",
    "CONSUME_FAILED",
    "TRACE_CONTRADICTION",
)


def render(data: dict[str, Any]) -> str:
    as_of = data["as_of"]
    sections = [
        _cards(data),
        _section("Transactions by state over time", "txn-states",
                 over_time_chart("transactions by state", data["states_over_time"], STATE_ORDER),
                 "By the time of the first half copy (or of the commit, for a commit with no half)."),
        _section("Anomalies by type over time", "anomaly-types",
                 over_time_chart("anomalies by type", data["anomalies_over_time"], ANOMALY_TYPES)
                 + '<p class="note">What each type means, how RocketMQ gets there and what to do: '
                 + " · ".join(_finding_link(t) for t in ANOMALY_TYPES) + "</p>"),
        _section("Stuck halves", "stuck",
                 stacked_bars("stuck-half age", [b for b, _ in data["stuck_age_bins"]],
                              {"stuck halves": [n for _, n in data["stuck_age_bins"]]}, "halves")
                 + _table("stuck-oldest", data["stuck_oldest"], title=f"The oldest of {data['stuck_total']:,}"),
                 "Age is the time since the producer sent the half, as of the data time."),
        _section("Discarded transactions", "discarded",
                 _table("discarded", data["discarded"], total=data["discarded_total"])),
        _section("Orphaned commits", "orphaned", _table("orphaned", data["orphaned"], total=data["orphaned_total"])),
        _section("Duplicate commits", "duplicates",
                 _table("duplicates", data["duplicates"], total=data["duplicates_total"])),
        _section("Op lag and transactions checked after their resolution", "op-lag",
                 op_lag_chart(data["op_lag"])
                 + _table("rechecked", data["rechecked"], total=data["rechecked_total"]),
                 "Op lag: from a transaction's first final message to the op that resolves it. Past the check "
                 "timeout, the check service finds committed transactions without their op and checks them "
                 "again: a duplicate commit if the producer answers from its records, else a discard."),
        _section("Offset regressions", "regressions", regression_chart(data["regressions"])
                 + _table("regressions", data["regressions"], total=data["regressions_total"]),
                 "One lane per consumer group, topic and queue; a circle's area is the redelivery estimate."),
        _section("Message trace", "trace",
                 _table("discard-causes", data["trace"]["discard_causes"],
                        title="Discarded after the maximum checks, by cause")
                 + _table("trace-groups", data["trace"]["groups"],
                          title="Per consumer group: first-attempt latency, traced duplicates and failures")
                 + _table("contradictions", data["trace"]["contradictions"],
                          title="Contradictions between the trace and our findings (should be none)",
                          total=data["trace"]["contradictions_total"])
                 + '<p class="note">' + " · ".join(_finding_link(t) for t in TRACE_TYPES) + "</p>",
                 "What clients built with enableMsgTrace recorded. Latency: from a message's store time to its "
                 "first attempt, over the last hour of trace; predicted: duplicates the offsets counted. "
                 "`txn-recon trace UNIQ_KEY` tells one message's story."),
        _section("Consumer groups", "groups",
                 _table("deliveries", data.get("deliveries", []),
                        title="Deliveries: what became of every message each group wants")
                 + "".join(over_time_chart(f"{group}: messages by status, by store time", over_time, DELIVERY_STATUSES)
                           for group, over_time in data.get("deliveries_over_time", {}).items())
                 + _table("group-members", data.get("members", []), title="Members and subscriptions (latest snapshot)")
                 + _table("conflicts", data.get("conflicts", []), title="Subscription conflicts",
                          total=data.get("conflicts_total"))
                 + _table("stranded", data.get("stranded", []), title="Stranded queues",
                          total=data.get("stranded_total"))
                 + _table("handoffs", data.get("handoffs", []),
                          title=f"Expected duplicates at hand-offs: {data.get('expected_duplicates', 0):,} messages",
                          total=data.get("handoffs_total"))
                 + _table("jumps", data.get("jumps", []), title="Offset jumps (messages skipped)",
                          total=data.get("jumps_total"))
                 + _table("dead_letters", data.get("dead_letters", []),
                          title="Dead-lettered: messages a group failed until the broker parked them",
                          total=data.get("dead_letters_total"))
                 + _table("undelivered", data.get("undelivered", []),
                          title=f"Undelivered: {data.get('undelivered_messages', 0):,} messages a tag filter refused",
                          total=data.get("undelivered_total"))
                 + _table("ownership", data.get("ownership", []), title="Queue ownership over time",
                          total=data.get("ownership_total")),
                 "From `txn-recon collect`'s snapshots of each group (or the model's). A stranded queue has "
                 "messages waiting that no subscribing member holds; a hand-off's estimate counts what the old "
                 "holder had consumed but not committed when it was last seen; an undelivered message was wanted by "
                 "a member, passed by the committed offset, and refused by the broker's kept expression or the "
                 "holder's own."),
        _section("Brokers", "brokers",
                 writes_chart(data.get("broker_writes", {"bucket_ms": 1000, "counts": []}), data.get("brokers", []))
                 + _table("topic-gaps", data.get("topic_gaps", []), total=data.get("topic_gaps_total"),
                          title="Topics a broker does not take (TOPIC_NOT_ON_BROKER)")
                 + _table("idle-brokers", data.get("idle_brokers", []), total=data.get("idle_brokers_total"),
                          title="Brokers that stored nothing (BROKER_WITHOUT_WRITES)"),
                 "Messages producers stored on each master (halves and business messages), one line per broker: a "
                 "broker that joined a cluster takes nothing until its topics are created on it. From "
                 "`txn-recon collect`'s topology snapshots (or the model's)."),
        _section("Data quality: latest result of every expectation", "quality",
                 _table("dq-latest", data["dq_latest"], fail_col="success")),
        _section("Run history", "runs",
                 _table("dq-runs", data["dq_runs"], title="Quality runs")
                 + _table("ingest-runs", data["ingest_runs"], title="Ingest runs")
                 + _table("reconcile-runs", data["reconcile_runs"], title="Reconcile runs")
                 + _table("collect-runs", data.get("collect_runs", []), title="Collect passes (txn-recon collect)")),
    ]  # fmt: skip
    as_of_text = (
        "n/a" if as_of is None else f"{dt.datetime.fromtimestamp(as_of / 1000, dt.UTC):%Y-%m-%d %H:%M:%S} UTC ({as_of})"
    )
    head = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>txn-recon: {escape(data['database'])}</title><style>{CSS}</style></head><body>"
        f"<h1>txn-recon reconciliation: {escape(data['database'])}</h1>"
        f'<p class="meta">Data time (as of): {escape(as_of_text)} · generated {escape(data["generated_at"])} · '
        "every anomaly row shows its anomaly_id and key for lookup in SQL</p>"
    )
    return head + "\n".join(sections) + f"<script>{SCRIPT}</script></body></html>\n"


def _cards(data: dict[str, Any]) -> str:
    cards = [("transactions", sum(data["states"].values()))]
    cards += [(s.lower().replace("_", " "), data["states"].get(s, 0)) for s in STATE_ORDER]
    items = "".join(f'<div class="card"><b>{n:,}</b>{escape(label)}</div>' for label, n in cards)
    # Each finding type's card opens its page in the manual.
    items += "".join(
        f'<a class="card bad" href="{_finding_url(k)}" title="what {escape(k)} means"><b>{v:,}</b>'
        f"{escape(k.lower().replace('_', ' '))}</a>"
        for k, v in sorted(data["anomaly_counts"].items())
    )
    failed = [r for r in data["dq_latest"] if not r["success"]]
    if data["dq_latest"]:
        cls = "bad" if failed else "good"
        items += f'<div class="card {cls}"><b>{len(failed):,}</b>failed expectations</div>'
    return f'<div class="cards">{items}</div>'


def _finding_url(kind: str) -> str:
    """A finding type's page in the manual, which serve serves at /docs/ beside the dashboard at /."""
    return f"docs/findings/{quote(kind)}/"


def _finding_link(kind: str) -> str:
    return f'<a href="{_finding_url(kind)}">{escape(kind)}</a>'


def _section(title: str, anchor: str, body: str, note: str = "") -> str:
    note_html = f'<p class="note">{escape(note)}</p>' if note else ""
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>{note_html}{body}</section>'


def over_time_chart(title: str, over_time: dict[str, Any], order: Sequence[str]) -> str:
    width, counts = over_time["bucket_ms"], over_time["counts"]
    if not counts:
        return stacked_bars(title, [], {})
    first, last = min(b for b, _, _ in counts), max(b for b, _, _ in counts)
    buckets = list(range(first, last + width, width))
    groups = list(order)  # every known group, present or not, so each keeps its colour across pages
    groups += sorted({c[1] for c in counts} - set(groups))
    index = {b: i for i, b in enumerate(buckets)}
    series = {g: [0] * len(buckets) for g in groups}
    for bucket, group, n in counts:
        series[group][index[bucket]] += n
    labels = [time_label(b, width) for b in buckets]
    return stacked_bars(f"{title} per {width // 1000:,} s", labels, series, "count")


def writes_chart(over_time: dict[str, Any], brokers: Sequence[str]) -> str:
    """Writes per broker and time bucket, one line per broker; a master of the topology that stored nothing
    is a line at zero."""
    width, counts = over_time["bucket_ms"], over_time["counts"]
    if not counts:
        return lines("messages stored per broker", [], {})
    first, last = min(b for b, _, _ in counts), max(b for b, _, _ in counts)
    buckets = list(range(first, last + width, width))
    index = {b: i for i, b in enumerate(buckets)}
    series = {name: [0] * len(buckets) for name in sorted({c[1] for c in counts} | set(brokers))}
    for bucket, broker, n in counts:
        series[broker][index[bucket]] += n
    labels = [time_label(b, width) for b in buckets]
    return lines(f"messages stored per broker per {width // 1000:,} s", labels, series, "messages")


def op_lag_chart(op_lag: dict[str, Any]) -> str:
    """The largest op lag per time bucket, in ms."""
    width, rows = op_lag["bucket_ms"], op_lag["rows"]
    labels = [time_label(b, width) for b, _ in rows]
    return stacked_bars(f"largest op lag per {width // 1000:,} s", labels, {"op lag": [m for _, m in rows]}, "ms")


def regression_chart(rows: list[dict[str, Any]]) -> str:
    lanes = sorted({f"{r['consumer_group']} {r['topic']}/{r['queue_id']}" for r in rows})
    index = {lane: i for i, lane in enumerate(lanes)}
    points = [
        (r["event_ts"], index[f"{r['consumer_group']} {r['topic']}/{r['queue_id']}"],
         float(r["redelivery_estimate"] or 0),
         f"{r['consumer_group']} {r['topic']}/{r['queue_id']}: {r['from_offset']} -> {r['to_offset']}, "
         f"~{r['redelivery_estimate']} redelivered")
        for r in rows
    ]  # fmt: skip
    times = [p[0] for p in points] or [0]
    return timeline("offset regressions", lanes, points, (min(times), max(times)))


def _table(
    table_id: str, rows: list[dict[str, Any]], title: str = "", total: int | None = None, fail_col: str = ""
) -> str:
    heading = f"<h3>{escape(title)}</h3>" if title else ""
    if not rows:
        return f'{heading}<p class="note" id="{table_id}">None.</p>'
    shown = f" (showing {len(rows):,} of {total:,})" if total is not None and total > len(rows) else ""
    count = f'<p class="note">{total if total is not None else len(rows):,} rows{shown}</p>'
    columns = list(rows[0])
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cls = ' class="fail"' if fail_col and r.get(fail_col) is False else ""
        body.append(f"<tr{cls}>" + "".join(_cell(c, r[c]) for c in columns) + "</tr>")
    return (
        f'{heading}{count}<div class="scroll"><table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


TIME_COLUMNS = frozenset({"event_ts", "since", "until", "from_ts", "to_ts", "snapshot_ts"})
# Detail fields (JSON text) shown as numbers.
COUNT_COLUMNS = frozenset({"from_offset", "to_offset", "redelivery_estimate", "check_times", "lag",
                           "duplicates_estimate", "skipped", "windows", "cluster_messages"})  # fmt: skip


def _cell(col: str, value: Any) -> str:
    if value is None:
        return "<td></td>"
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'NO'}</td>"
    if isinstance(value, (int, float)):
        shown = f"{value:,}" if col not in ("queue_id", "version") else str(value)
        if col in TIME_COLUMNS:
            shown = f"{time_label(int(value), 1000)} ({value})"
        elif col == "age_ms":
            shown = f"{value / 60_000:,.1f} min"
        return f'<td class="num" data-v="{value}">{escape(shown)}</td>'
    if isinstance(value, dt.datetime):
        return f"<td>{value:%Y-%m-%d %H:%M:%S}</td>"
    text = str(value)
    if col in TIME_COLUMNS and text.isdigit():
        return _cell(col, int(text))
    if col in COUNT_COLUMNS and text.lstrip("-").isdigit():
        return f'<td class="num" data-v="{text}">{int(text):,}</td>'
    if col in ("detail", "observed_value", "unexpected_sample", "kwargs"):
        text = _compact_json(text)
    cls = ' class="key"' if col in ("uniq_key", "anomaly_id", "run_id") else ""
    return f"<td{cls}>{escape(text)}</td>"


def _compact_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), separators=(",", ":"))[:300]
    except ValueError:
        return text[:300]
