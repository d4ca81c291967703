"""The cluster rules (transforms/topology.py) on topology rows written by hand: no Spark."""

from __future__ import annotations

from typing import Any

from transforms.lifecycle import Rules
from transforms.topology import gaps_in, idle_brokers, passes, topic_gaps

RULES = Rules(route_delay_ms=20_000, idle_window_ms=10_000, idle_min_messages=5)


def member(ts: int, broker: str, broker_id: int = 0, cluster: str = "C") -> dict[str, Any]:
    return {"snapshot_ts": ts, "kind": "broker", "cluster": cluster, "broker_name": broker, "broker_id": broker_id,
            "topic": None, "read_queues": None, "write_queues": None, "perm": None, "table_ts": None}  # fmt: skip


def table(
    ts: int, broker: str, topics: dict[str, tuple[int, int, int]], table_ts: int | None = None
) -> list[dict[str, Any]]:
    head = {**member(ts, broker), "kind": "table", "broker_id": None, "table_ts": table_ts}
    return [head] + [{**head, "kind": "topic", "topic": t, "read_queues": r, "write_queues": w, "perm": p,
                      "table_ts": None} for t, (r, w, p) in topics.items()]  # fmt: skip


def route(ts: int, topic: str, brokers: dict[str, tuple[int, int, int]]) -> list[dict[str, Any]]:
    base = {**member(ts, ""), "kind": "route", "broker_id": None, "topic": topic}
    return [
        {**base, "broker_name": b, "read_queues": r, "write_queues": w, "perm": p} for b, (r, w, p) in brokers.items()
    ]


def cluster_story() -> list[dict[str, Any]]:
    """broker-a holds T from the start; broker-b joins at 30 s with no topic, gets T at 95 s (its table says
    so at 93 s); a slave of broker-a is listed too and never judged."""
    rows = table(0, "a", {"T": (4, 4, 6)})
    for ts in range(0, 140_000, 5_000):
        rows += [member(ts, "a"), member(ts, "a", broker_id=1)]
        if ts >= 30_000:
            rows.append(member(ts, "b"))
    rows += table(30_000, "b", {}, table_ts=29_500) + table(95_000, "b", {"T": (4, 4, 6)}, table_ts=93_000)
    return rows


def test_a_broker_that_joins_without_the_topic_is_a_gap_until_it_gets_it() -> None:
    history = passes(cluster_story())
    assert gaps_in(history[6]) == {("C", "b", "T"): ("MISSING", ["a"], "mqadmin updateTopic -c C -t T -w 4 -r 4")}
    [gap] = topic_gaps(history, 140_000, RULES)
    assert (gap["broker_name"], gap["topic"], gap["reason"]) == ("b", "T", "MISSING")
    assert (gap["since"], gap["until"], gap["table_ts"]) == (30_000, 95_000, 93_000)
    assert gap["served_by"] == ["a"]


def test_a_gap_shorter_than_the_route_delay_is_no_finding() -> None:
    rows = [
        r for r in cluster_story() if r["snapshot_ts"] != 95_000 or r["broker_name"] != "b" or r["kind"] == "broker"
    ]
    rows += table(45_000, "b", {"T": (4, 4, 6)}, table_ts=44_000)  # fixed 15 s after the join
    assert topic_gaps(passes(rows), 140_000, RULES) == []


def test_unwritable_in_the_table_or_in_the_route_is_not_writable() -> None:
    rows = cluster_story() + table(100_000, "b", {"T": (4, 4, 4)}, table_ts=99_000)
    rows += route(0, "T", {"a": (4, 4, 6)}) + route(120_000, "T", {"a": (4, 4, 6), "b": (4, 4, 6)})
    history = passes(rows)
    at = {p.ts: p for p in history}
    assert gaps_in(at[100_000])[("C", "b", "T")][0] == "NOT_WRITABLE"
    rows += table(115_000, "b", {"T": (4, 4, 6)}, table_ts=114_000) + route(
        115_000, "T", {"a": (4, 4, 6), "b": (4, 4, 4)}
    )
    at = {p.ts: p for p in passes(rows)}
    reason, serving, fix = gaps_in(at[115_000])[("C", "b", "T")]
    assert (reason, serving, fix) == ("NOT_WRITABLE", ["a"], "mqadmin addWritePerm -b b")
    assert gaps_in(at[120_000]) == {}
    # A topic nobody takes writes for is read-only on purpose: no gap.
    only = passes(table(0, "a", {"R": (4, 4, 4)}) + table(0, "b", {}) + [member(0, "a"), member(0, "b")])
    assert gaps_in(only[0]) == {}


def test_a_gap_still_open_at_as_of_goes_on() -> None:
    rows = [r for r in cluster_story() if not (r["snapshot_ts"] == 95_000 and r["kind"] in ("table", "topic"))]
    [gap] = topic_gaps(passes(rows), 140_000, RULES)
    assert (gap["since"], gap["until"], gap["table_ts"]) == (30_000, None, None)


def test_a_broker_storing_nothing_while_the_cluster_stores_is_idle_once_settled() -> None:
    history = passes(cluster_story())
    writes = {("a", k): 10 for k in range(14)} | {("b", 11): 3, ("b", 12): 7, ("b", 13): 1}
    [idle] = idle_brokers(history, writes, 140_000, RULES)
    # b joined at 30 s: judged from 50 s (route delay), idle until its topic came (95 s) and it stored at 110 s;
    # the windows from 95 s + 20 s are judged again, 100-110 s is not (settling after its table changed).
    assert (idle["broker_name"], idle["since"], idle["until"], idle["windows"]) == ("b", 50_000, 100_000, 5)
    assert idle["cluster_messages"] == 50 and idle["stored_by"] == ["a"]


def test_too_few_messages_in_the_cluster_and_the_last_window_ongoing() -> None:
    history = passes(cluster_story())
    quiet = {("a", k): 2 for k in range(14)}
    assert idle_brokers(history, quiet, 140_000, RULES) == []
    busy = {("a", k): 10 for k in range(14)}
    rows = [r for r in cluster_story() if not (r["snapshot_ts"] == 95_000 and r["kind"] in ("table", "topic"))]
    [idle] = idle_brokers(passes(rows), busy, 140_000, RULES)
    assert (idle["since"], idle["until"], idle["windows"]) == (50_000, None, 9)


def test_a_broker_not_listed_throughout_a_window_is_not_judged_in_it() -> None:
    rows = [
        r
        for r in cluster_story()
        if not (r["kind"] == "broker" and r["broker_name"] == "b" and r["snapshot_ts"] == 75_000)
    ]
    writes = {("a", k): 10 for k in range(14)}
    found = idle_brokers(passes(rows), writes, 140_000, RULES)
    # Gone from the pass at 75 s: 70-80 s is not judged; back at 80 s it settles again by 100 s, but its table
    # changed at 95 s, so it is judged again from 115 s: the window from 120 s on.
    assert [(f["since"], f["until"]) for f in found] == [(50_000, 70_000), (120_000, None)]


def test_clusters_collected_apart_are_judged_apart() -> None:
    """Another cluster's passes, landed by its own collector between this one's, change nothing here."""
    other = table(2_500, "x", {"T": (4, 4, 6)}) + table(2_500, "y", {})
    other += [member(ts, b, cluster="D") for ts in range(2_500, 140_000, 5_000) for b in ("x", "y")]
    history = passes(cluster_story() + other)
    gaps = {(g["cluster"], g["broker_name"]): (g["since"], g["until"]) for g in topic_gaps(history, 140_000, RULES)}
    assert gaps == {("C", "b"): (30_000, 95_000), ("D", "y"): (2_500, None)}
    writes = {("a", k): 10 for k in range(14)} | {("x", k): 10 for k in range(14)} | {("b", k): 3 for k in (11, 12, 13)}
    idle = {
        (f["cluster"], f["broker_name"]): (f["since"], f["until"])
        for f in idle_brokers(history, writes, 140_000, RULES)
    }
    assert idle == {("C", "b"): (50_000, 100_000), ("D", "y"): (30_000, None)}
