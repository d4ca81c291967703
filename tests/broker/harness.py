"""Run the broker model in memory, and an independent statement of DESIGN §2 over its records.

`reference_findings` recomputes states and anomalies from the landing records alone (the way the
pipeline must), without any of the model's code, so comparing it with `_truth` checks that the
model's truth agrees with the rules.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from broker.profiles import PROFILES, BrokerSettings, Profile
from broker.simulation import Summary, simulate
from broker.truth import Thresholds
from schemas import LANDING
from schemas.truth import TRUTH_TRANSACTION, truth_key
from transforms.lifecycle import Rules
from transforms.topology import anomaly_rows, idle_brokers, passes, topic_gaps

DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"


@dataclass
class Run:
    summary: Summary
    records: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {s: [] for s in LANDING})
    truth_transactions: list[dict[str, Any]] = field(default_factory=list)
    truth_anomalies: list[dict[str, Any]] = field(default_factory=list)


class MemorySink:
    def __init__(self, run: Run) -> None:
        self.run = run

    def record(self, stream: str, rec: tuple[Any, ...]) -> None:
        names = LANDING[stream].names
        self.run.records[stream].append({k: v for k, v in zip(names, rec, strict=True) if v is not None})

    def truth_transaction(self, rec: tuple[Any, ...]) -> None:
        self.run.truth_transactions.append(dict(zip(TRUTH_TRANSACTION.names, rec, strict=True)))

    def truth_anomaly(self, rec: dict[str, Any]) -> None:
        self.run.truth_anomalies.append(rec)


def run_model(
    n: int, seed: int, profile: str | Profile = "default", broker: BrokerSettings | None = None, **changes: Any
) -> Run:
    p = PROFILES[profile] if isinstance(profile, str) else profile
    if changes:
        p = dataclasses.replace(p, **changes)
    run = Run(Summary(seed, p.name, n))
    run.summary = simulate(n, seed, p, MemorySink(run), broker)
    return run


def truth_keys(run: Run) -> set[tuple[Any, ...]]:
    return {_key(a) for a in run.truth_anomalies}


def _key(a: dict[str, Any]) -> tuple[Any, ...]:
    return (a["anomaly_type"], *truth_key(a))


def reference_findings(
    records: dict[str, list[dict[str, Any]]],
    as_of: int,
    cfg: BrokerSettings | None = None,
    thr: Thresholds | None = None,
) -> tuple[dict[tuple[str, str], tuple[str, str | None]], set[tuple[Any, ...]]]:
    """(state and reason per (broker, uniq_key), anomaly keys) by DESIGN §2, from records alone."""
    cfg, thr = cfg or BrokerSettings(), thr or Thresholds()
    resolved_at: dict[tuple[str, int, int], int] = {}
    for op in records["op"]:
        for token in op["body"].split(","):
            if token:
                at = (op["broker_name"], op["queue_id"], int(token))
                resolved_at[at] = min(resolved_at.get(at, op["store_timestamp"]), op["store_timestamp"])
    copies: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for h in records["half"]:
        copies[(h["broker_name"], h["uniq_key"])].append(h)
    commits: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    discards: dict[tuple[str, str], int] = {}
    for r in records["real"]:
        if "uniq_key" not in r:
            continue
        k = (r["broker_name"], r["uniq_key"])
        if r["topic"] == DISCARD_TOPIC:
            discards[k] = min(discards.get(k, r["store_timestamp"]), r["store_timestamp"])
        elif r["sys_flag"] & 0xC == 8 or r["transactional"]:
            commits[k].append(r)
    states: dict[tuple[str, str], tuple[str, str | None]] = {}
    found: set[tuple[Any, ...]] = set()
    trace = Traced(records["trace"])
    for k in sorted(set(copies) | set(commits)):
        halves, cs = copies.get(k, []), commits.get(k, [])
        times = [resolved_at.get((h["broker_name"], h["queue_id"], h["queue_offset"])) for h in halves]
        resolved = min((t for t in times if t is not None), default=None)
        if halves and trace.answer_lost(k[1], halves, resolved_at, [c["store_timestamp"] for c in cs], thr):
            found.add(("CHECK_ANSWER_LOST", *k, None))
        checked = [h for h in halves if h.get("check_times")]
        if resolved is not None and checked:
            last = max(checked, key=lambda h: h["queue_offset"])
            # A discard ends the checks: a discarded transaction was checked after its resolution only if a check
            # copy came after its first final message or its op (which may follow the discard).
            settled = min([resolved, *(c["store_timestamp"] for c in cs)])
            quiet = k in discards and max(h["store_timestamp"] for h in checked) <= settled
            if not quiet and (last["broker_name"], last["queue_id"], last["queue_offset"]) not in resolved_at:
                found.add(("RECHECKED_AFTER_RESOLUTION", *k, None))
        if cs:
            states[k] = ("COMMITTED", None)
            first = min(c["store_timestamp"] for c in cs)
            if not halves:
                found.add(("ORPHANED_COMMIT", *k, "NO_HALF"))
            elif resolved is None and as_of - first > thr.op_grace_ms:
                found.add(("ORPHANED_COMMIT", *k, "NO_OP"))
            if k in discards and any(c["store_timestamp"] > discards[k] for c in cs):
                found.add(("ORPHANED_COMMIT", *k, "AFTER_DISCARD"))
            physical = {h["commit_log_offset"] for h in halves}
            if halves and any(c.get("prepared_transaction_offset") not in physical for c in cs):
                found.add(("ORPHANED_COMMIT", *k, "OFFSET_MISMATCH"))
            if len(cs) > 1:
                found.add(("DUPLICATE_COMMIT", *k, None))
            continue
        if resolved is not None:
            states[k] = ("ROLLED_BACK", None)
            continue
        born = min(h["born_timestamp"] for h in halves)
        last = max(h["store_timestamp"] for h in halves)
        checks = max(h.get("check_times", 0) for h in halves)
        reason = None
        if k in discards:
            reason = "MAX_CHECKS" if checks >= cfg.check_max else "EXPIRED"
        elif checks >= cfg.check_max and as_of - last > cfg.check_interval_ms + cfg.transaction_timeout_ms:
            reason = "MAX_CHECKS"
        elif as_of - born > cfg.file_reserved_hours * 3_600_000:
            reason = "EXPIRED"
        if reason is not None:
            states[k] = ("DISCARDED", reason)
            if reason == "MAX_CHECKS":
                until = discards.get(k, last + cfg.check_interval_ms)
                found.add(("DISCARDED_AFTER_MAX_CHECKS", *k, reason, trace.cause(k[1], halves, until, cfg)))
            else:
                found.add(("DISCARDED_EXPIRED", *k, reason))
        else:
            states[k] = ("PENDING", None)
            if as_of - born >= thr.stuck_after_ms:
                found.add(("STUCK_HALF", *k, None))
    last_offset: dict[tuple[str, str, str, int], tuple[int, str | None]] = {}
    for o in sorted(records["offset"], key=lambda o: (o["commit_timestamp"], o.get("seq", 0))):
        q = (o["broker_name"], o["consumer_group"], o["topic"], o["queue_id"])
        before = last_offset.get(q)
        if before is not None and o["offset"] < before[0]:
            found.add(("OFFSET_REGRESSION", *q, o["commit_timestamp"], o.get("seq")))
        if before is not None and o["offset"] > before[0] and before[1] and not o.get("client_id"):
            found.add(("OFFSET_JUMP", *q, o["commit_timestamp"], o.get("seq")))
        last_offset[q] = (o["offset"], o.get("client_id"))
    found |= cluster_findings(records, as_of, thr)
    found |= trace.consumption()
    return states, found | group_findings(records, thr) | dead_letters(records, as_of) | undelivered(records)


class Traced:
    """The trace rules (docs/concepts/trace.md) over the trace records; times on the broker's clock (a context's
    client time plus its message's store time minus born time)."""

    def __init__(self, trace: list[dict[str, Any]]) -> None:
        self.answers: dict[str, list[tuple[int, str]]] = defaultdict(list)  # key -> (at, state) of check answers
        self.sent: dict[str, list[tuple[int, str]]] = defaultdict(list)  # producer group -> (at, key)
        before: dict[tuple[str, str], str] = {}
        after: list[dict[str, Any]] = []
        for t in trace:
            at = t.get("timestamp", 0) + t["store_timestamp"] - t["born_timestamp"]
            if t["trace_type"] in ("Pub", "EndTransaction"):
                self.sent[t["group_name"]].append((at, t["uniq_key"]))
            if t["trace_type"] == "EndTransaction" and t.get("from_check"):
                self.answers[t["uniq_key"]].append((at, t["transaction_state"]))
            if t["trace_type"] == "SubBefore":
                before[(t["request_id"], t["uniq_key"])] = t["group_name"]
            if t["trace_type"] == "SubAfter":
                after.append(t)
        self.results: dict[tuple[str, str], list[bool]] = defaultdict(list)
        for t in after:
            group = before.get((t["request_id"], t["uniq_key"]), t.get("group_name"))
            if group is not None:
                self.results[(group, t["uniq_key"])].append(t["success"])

    def consumption(self) -> set[tuple[Any, ...]]:
        out = set()
        for (group, key), results in self.results.items():
            if results.count(True) > 1:
                out.add(("DUPLICATE_CONSUMPTION", group, key, results.count(True)))
            if results.count(False):
                out.add(("CONSUME_FAILED", group, key, results.count(False)))
        return out

    def answer_lost(self, key: str, halves: list[dict[str, Any]], resolved_at: dict[tuple[str, int, int], int],
                    commits: list[int], thr: Thresholds) -> bool:  # fmt: skip
        decided = sorted(at for at, s in self.answers.get(key, []) if s == "COMMIT_MESSAGE")
        if not decided:
            return False
        at, n = decided[0], decided.count(decided[0])  # n answers at one instant answered the last n copies
        checks = sorted((h["store_timestamp"], h["queue_offset"], h["queue_id"], h["broker_name"])
                        for h in halves if h.get("check_times"))  # fmt: skip
        answered = [c for c in checks if c[0] <= at]
        if not answered:
            return False
        _, offset, queue, broker = answered[-min(n, len(answered))]
        committed = sum(at <= t <= at + thr.op_grace_ms for t in commits)
        last = max(h["store_timestamp"] for h in halves)
        return (broker, queue, offset) not in resolved_at and committed < n and last > at

    def cause(self, key: str, halves: list[dict[str, Any]], until: int, cfg: BrokerSettings) -> str | None:
        group = halves[0]["producer_group"]
        first, last = min(h["store_timestamp"] for h in halves), max(h["store_timestamp"] for h in halves)
        seen = [(at, k) for at, k in self.sent.get(group, []) if k == key or first <= at <= until]
        if not seen:
            return None
        states = [s for _, s in self.answers.get(key, [])]
        if any(s != "UNKNOW" for s in states):
            return "ANSWER_LOST"
        if states:
            return "ANSWERED_UNKNOWN"
        alive = any(k != key and at >= last for at, k in seen)
        return "CHECKS_WITHOUT_CALLBACK" if alive else "UNANSWERED"


def cluster_findings(records: dict[str, list[dict[str, Any]]], as_of: int, thr: Thresholds) -> set[tuple[Any, ...]]:
    """TOPIC_NOT_ON_BROKER and BROKER_WITHOUT_WRITES by the pipeline's own cluster rules (plain Python, so they
    run here on the records as landed), with the writes counted from the half and real records."""
    rules = Rules(**{f.name: getattr(thr, f.name) for f in dataclasses.fields(Thresholds)})
    rows = [{name: r.get(name) for name in LANDING["topology"].names} for r in records["topology"]]
    writes: dict[tuple[str, int], int] = defaultdict(int)
    for h in records["half"]:
        if "check_times" not in h:
            writes[(h["broker_name"], h["store_timestamp"] // thr.idle_window_ms)] += 1
    for r in records["real"]:
        if r["topic"] != DISCARD_TOPIC:
            writes[(r["broker_name"], r["store_timestamp"] // thr.idle_window_ms)] += 1
    history = passes(rows)
    rows_found = anomaly_rows(topic_gaps(history, as_of, rules), idle_brokers(history, writes, as_of, rules), as_of,
                              thr.idle_window_ms)  # fmt: skip
    return {_key({**r, "detail": json.loads(r["detail"])}) for r in rows_found}


def dead_letters(records: dict[str, list[dict[str, Any]]], as_of: int) -> set[tuple[Any, ...]]:
    """DEAD_LETTERED keys: each DLQ copy, with the queue of the first message of its original topic and UNIQ_KEY."""
    first: dict[tuple[str, str], dict[str, Any]] = {}
    for r in sorted(records["real"], key=lambda r: (r["store_timestamp"], r["broker_name"], r["queue_id"])):
        first.setdefault((r["topic"], r.get("uniq_key") or ""), r)
    found = set()
    for c in records.get("copy", []):
        if c["kind"] == "dead_letter" and c["store_timestamp"] <= as_of:
            original = first.get((c["origin_topic"], c["uniq_key"]), {})
            found.add(("DEAD_LETTERED", c["broker_name"], c["consumer_group"], c["origin_topic"],
                       original.get("queue_id"), c["store_timestamp"], c["uniq_key"], c["queue_offset"],
                       c["reconsume_times"], original.get("transaction_id") or c.get("transaction_id")))  # fmt: skip
    return found


def group_findings(records: dict[str, list[dict[str, Any]]], thr: Thresholds) -> set[tuple[Any, ...]]:
    """SUBSCRIPTION_CONFLICT, STRANDED_QUEUE and REDELIVERY_AT_HANDOFF keys by DESIGN §2, from the consumer
    snapshots, offset commits and stored messages alone."""
    snaps: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in records["consumer"]:
        s = snaps[r["consumer_group"]].setdefault(r["snapshot_ts"], {"subs": defaultdict(set), "queues": [],
                                                                     "tables": set()})  # fmt: skip
        if r["kind"] == "queue":
            s["queues"].append(r)
        elif "client_id" in r:
            s["subs"][r["client_id"]].add((r["topic"], r.get("expression")))
        else:
            s["tables"].add(r["broker_name"])
    stored: dict[tuple[str, str, int], list[tuple[int, int]]] = defaultdict(list)
    for r in records["real"]:
        stored[(r["broker_name"], r["topic"], r["queue_id"])].append((r["store_timestamp"], r["queue_offset"]))
    commits: dict[tuple[str, str, str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for o in records["offset"]:
        key = (o["consumer_group"], o["broker_name"], o["topic"], o["queue_id"])
        commits[key].append((o["commit_timestamp"], o.get("seq", 0), o["offset"]))

    def end(q: tuple[str, str, int], ts: int) -> int:
        return max((off + 1 for t, off in stored[q] if t <= ts), default=0)

    def committed(group: str, q: tuple[str, str, int], ts: int) -> int:
        done = [c for c in commits[(group, *q)] if c[0] <= ts]
        return max(done)[2] if done else min((off for _, off in stored[q]), default=0)

    found: set[tuple[Any, ...]] = set()
    for group, by_ts in snaps.items():
        conflict_since: int | None = None
        brokers: set[str] = set()
        stranded: dict[tuple[str, str, int], tuple[int, int]] = {}  # queue -> (since, until)
        held_before: dict[tuple[tuple[str, str, int], str], int] = {}
        before: int | None = None
        episodes: list[tuple[tuple[str, str, int], tuple[int, int]]] = []
        for ts in sorted(by_ts):
            s = by_ts[ts]
            if len({frozenset(v) for v in s["subs"].values()}) > 1:
                conflict_since = ts if conflict_since is None else conflict_since
                brokers |= s["tables"]
            elif conflict_since is not None:
                found |= {("SUBSCRIPTION_CONFLICT", b, group, conflict_since) for b in brokers}
                conflict_since, brokers = None, set()
            topics = {t for subs in s["subs"].values() for t, _ in subs}
            held = {((r["broker_name"], r["topic"], r["queue_id"]), r["client_id"]): r["offset"] for r in s["queues"]
                    if r["topic"] in {t for t, _ in s["subs"][r["client_id"]]}}  # fmt: skip
            held_queues = {q for q, _ in held}
            now = {q for q in stored
                   if q[1] in topics and q not in held_queues and end(q, ts) > committed(group, q, ts)}  # fmt: skip
            episodes += [(q, stranded.pop(q)) for q in [q for q in stranded if q not in now]]
            for q in now:
                stranded[q] = (stranded.get(q, (ts, ts))[0], ts)
            for (q, client), offset in held_before.items():
                if (q, client) not in held and before is not None and offset > committed(group, q, before):
                    found.add(("REDELIVERY_AT_HANDOFF", q[0], group, q[1], q[2], ts, client))
            held_before, before = held, ts
        if conflict_since is not None:
            found |= {("SUBSCRIPTION_CONFLICT", b, group, conflict_since) for b in brokers}
        for q, (since, until) in episodes + list(stranded.items()):
            if until - since >= thr.stranded_after_ms:
                found.add(("STRANDED_QUEUE", q[0], group, q[1], q[2], since))
    return found


def _takes(expression: str | None, tag: str | None) -> bool:
    """A tag expression's verdict on a tag: `*` (or none) takes all, `A || B` those tagged A or B."""
    tags = {t.strip() for t in (expression or "*").split("||")}
    return "*" in tags or tag in tags


def undelivered(records: dict[str, list[dict[str, Any]]]) -> set[tuple[Any, ...]]:
    """UNDELIVERED keys by DESIGN §2 from the records alone: per group and queue, each run of consecutive
    snapshot windows in which a filter could refuse, from the first window in which the committed offset
    passed a wanted message that one of the window's filters (those of its two snapshots and of the one
    before) refused; messages an admin jump skipped do not count."""
    subs: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    held: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records["consumer"]:
        (held if r["kind"] == "queue" else subs)[(r["consumer_group"], r["snapshot_ts"])].append(r)
    tags: dict[tuple[str, str, int], dict[int, str | None]] = defaultdict(dict)
    for m in records["real"]:
        tags[(m["broker_name"], m["topic"], m["queue_id"])][m["queue_offset"]] = m.get("tags")
    commits: dict[tuple[str, str, str, int], list[tuple[int, int, int, str | None]]] = defaultdict(list)
    for o in records["offset"]:
        key = (o["consumer_group"], o["broker_name"], o["topic"], o["queue_id"])
        commits[key].append((o["commit_timestamp"], o.get("seq", 0), o["offset"], o.get("client_id")))
    for chain in commits.values():
        chain.sort(key=lambda c: c[:3])

    def filters_at(group: str, ts: int) -> dict[tuple[str, str, int], set[tuple[Any, ...]]]:
        own = {(r["client_id"], r["topic"]): r.get("expression") for r in subs[(group, ts)] if r.get("client_id")}
        table = {(r["broker_name"], r["topic"]): r.get("expression") for r in subs[(group, ts)]
                 if not r.get("client_id")}  # fmt: skip
        wanted: dict[str, set[str]] = defaultdict(set)
        for (_, topic), e in own.items():
            wanted[topic].add(e or "*")
        out: dict[tuple[str, str, int], set[tuple[Any, ...]]] = defaultdict(set)
        for q in held[(group, ts)]:
            mine, theirs = (q["client_id"], q["topic"]), (q["broker_name"], q["topic"])
            if mine in own and theirs in table:
                out[(q["broker_name"], q["topic"], q["queue_id"])].add(
                    (own[mine], table[theirs], tuple(sorted(wanted[q["topic"]])))
                )
        return out

    def committed(group: str, q: tuple[str, str, int], ts: int) -> int:
        done = [c for c in commits[(group, *q)] if c[0] <= ts]
        return done[-1][2] if done else min(tags[q], default=0)

    def skipped(group: str, q: tuple[str, str, int], after: int, until: int) -> set[int]:
        chain, out = commits[(group, *q)], set()
        for before, c in pairwise(chain):
            if c[2] > before[2] and c[3] is None and before[3] is not None and after < c[0] <= until:
                out |= set(range(before[2], c[2]))
        return out

    found: set[tuple[Any, ...]] = set()
    for group in sorted({g for g, _ in subs}):
        times = sorted({ts for g, ts in subs if g == group} | {ts for g, ts in held if g == group})
        at = [filters_at(group, ts) for ts in times]
        last_window: dict[tuple[str, str, int], int] = {}  # queue -> the last window that could refuse
        since: dict[tuple[str, str, int], int | None] = {}  # queue -> its run's first lossy window, if any
        for k in range(len(times) - 1):
            sides = [at[k - 1]] if k > 0 else []
            sides += [at[k], at[k + 1]]
            for q in sorted({q for side in sides for q in side}):
                configs = set().union(*(side.get(q, set()) for side in sides))
                if all(_takes(member, None) and _takes(table, None) for member, table, _ in configs):
                    continue
                if last_window.get(q) != k - 1 and since.get(q) is not None:
                    found.add(("UNDELIVERED", q[0], group, q[1], q[2], since[q]))
                if last_window.get(q) != k - 1:
                    since[q] = None
                last_window[q] = k
                c0, c1 = committed(group, q, times[k]), committed(group, q, times[k + 1])
                jumped = skipped(group, q, times[k], times[k + 1])
                lost = any(
                    any(_takes(e, tags[q].get(o)) for e in wanted)
                    and not (_takes(table, tags[q].get(o)) and _takes(member, tags[q].get(o)))
                    for o in range(c0, c1) if o in tags[q] and o not in jumped
                    for member, table, wanted in configs
                )  # fmt: skip
                if lost and since.get(q) is None:
                    since[q] = times[k]
        found |= {("UNDELIVERED", q[0], group, q[1], q[2], t) for q, t in since.items() if t is not None}
    return found
