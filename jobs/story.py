"""`txn-recon trace UNIQ_KEY [--broker NAME] [--format table|json]`: the story of one message, from every table,
in time order (docs/concepts/trace.md): its half and each check copy, each answer its producer traced, the op,
the message stored, in each group that wants it the delivery and each consumption attempt, its retry and
dead-letter copies, and every finding that names it. `serve` answers the same at /trace/<key>.

Each table is read by key within the times the transaction's lifecycle row gives (Delta skips the files of
other times by their statistics), so a lookup costs about the same on a large warehouse as on a small one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import sys
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from jobs.catalog import table_exists
from jobs.config import Config
from jobs.errors import TxnReconError
from jobs.session import build_session
from schemas.bronze import BRONZE
from schemas.reconciled import ANOMALIES, DELIVERIES, TXN_LIFECYCLE

Event = dict[str, Any]
# The events of one millisecond in the order they happen.
ORDER = ("half stored", "sent", "end request", "check", "answer", "finding", "stored", "op", "discarded",
         "consumption", "scheduled copy", "retry copy", "dead_letter copy", "delivery", "state")  # fmt: skip
SLACK_MS = 10 * 60_000  # a trace message is stored after its batch is sent: up to seconds after the event


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uniq_key", metavar="UNIQ_KEY", help="the message's UNIQ_KEY (its client message id)")
    parser.add_argument("--broker", metavar="NAME", help="only this broker's records of it")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="table (default) or json")


def run(args: argparse.Namespace, config: Config) -> int:
    events = story(build_session(config), config, args.uniq_key, args.broker)
    print(json.dumps(events, indent=1) if args.format == "json" else table(events))
    return 0


def story(spark: SparkSession, config: Config, key: str, broker: str | None = None) -> list[Event]:
    """Every event of the message `key`, in time order; a TxnReconError when no table knows it."""
    if not table_exists(spark, config.table(BRONZE["half"].name)):
        raise TxnReconError(f"no tables in {config.database} yet; run `txn-recon ingest` first")

    def rows(name: str, *where: Column) -> list[dict[str, Any]]:
        df = spark.table(config.table(name)).where(F.col("uniq_key") == key)
        if broker is not None and name != BRONZE["trace"].name:
            df = df.where(F.col("broker_name") == broker)
        for condition in where:
            df = df.where(condition)
        return [r.asDict() for r in df.collect()]

    life = rows(TXN_LIFECYCLE.name)
    times = [t for r in life for t in (r["born_ts"], r["first_copy_ts"], r["last_copy_ts"], r["resolved_ts"],
                                         r["first_commit_ts"], r["discard_ts"]) if t is not None]  # fmt: skip
    ts = F.col("store_timestamp")
    # Within the transaction's times when it has a lifecycle (Delta skips other files); else whole.
    span = [ts.between(min(times) - SLACK_MS, max(times) + SLACK_MS)] if times else []
    events = [*_halves(rows(BRONZE["half"].name, *span)), *_lifecycle(life)]
    # Its first commit and its discard are among the lifecycle's times; a later commit may come any time after.
    again = any(r["commit_count"] > 1 for r in life)
    stored = rows(BRONZE["real"].name, *([ts >= min(times) - SLACK_MS] if again else span))
    events += [_stored(r) for r in stored]
    since = [ts >= min([*times, *(r["store_timestamp"] for r in stored)]) - SLACK_MS] if times or stored else []
    events += _traced(rows(BRONZE["trace"].name, *since))
    events += [_copy(r) for r in rows(BRONZE["copy"].name, *since)]
    at = sorted({r["store_timestamp"] for r in stored})  # a delivery row keeps its message's store time
    events += [_delivery(r) for r in rows(DELIVERIES.name, *([ts.isin(at)] if at else since))]
    events += [_finding(r) for r in rows(ANOMALIES.name)]
    if not events:
        raise TxnReconError(f"no message with UNIQ_KEY {key}{f' on broker {broker}' if broker else ''} "
                            f"in {config.database}")  # fmt: skip
    return sorted(events, key=lambda e: (e["at"] is None, e["at"] or 0, ORDER.index(e["event"])))


def _event(at: int | None, broker: str | None, event: str, what: str, **more: Any) -> Event:
    return {"at": at, "broker": broker, "event": event, "what": what, **more}


def _stored(r: dict[str, Any]) -> Event:
    committed = " (committed)" if r["transactional"] else ""
    return _event(r["store_timestamp"], r["broker_name"], "stored",
                  f"{r['topic']} queue {r['queue_id']} offset {r['queue_offset']}{committed}")  # fmt: skip


def _copy(r: dict[str, Any]) -> Event:
    return _event(r["store_timestamp"], r["broker_name"], f"{r['kind']} copy",
                  f"group {r['consumer_group']}: {r['topic']} queue {r['queue_id']} offset {r['queue_offset']}, "
                  f"reconsumed {r['reconsume_times']} times")  # fmt: skip


def _delivery(r: dict[str, Any]) -> Event:
    return _event(r["store_timestamp"], r["broker_name"], "delivery",
                  f"group {r['consumer_group']}: {r['status']}, {r['retries']} retries, "
                  f"{r['duplicates_expected']} duplicates expected")  # fmt: skip


def _finding(r: dict[str, Any]) -> Event:
    what = r["anomaly_type"] + (f" {r['reason']}" if r["reason"] else "")
    what += f" in {r['consumer_group']}" if r["consumer_group"] else ""
    return _event(r["event_ts"], r["broker_name"], "finding", what, detail=json.loads(r["detail"]))


def _halves(halves: list[dict[str, Any]]) -> list[Event]:
    out = []
    for r in halves:
        where = f"queue {r['queue_id']} offset {r['queue_offset']}, producer group {r['producer_group']}"
        if r["check_times"] is None:
            out.append(_event(r["store_timestamp"], r["broker_name"], "half stored", f"{where}, for {r['real_topic']}"))
        else:
            out.append(_event(r["store_timestamp"], r["broker_name"], "check", f"check {r['check_times']}: copy at "
                              f"{where}"))  # fmt: skip
    return out


def _lifecycle(life: list[dict[str, Any]]) -> list[Event]:
    out = []
    for r in life:
        b = r["broker_name"]
        if r["resolved_ts"] is not None:
            out.append(_event(r["resolved_ts"], b, "op", "the op resolving it (first one)"))
        if r["discard_ts"] is not None:
            out.append(_event(r["discard_ts"], b, "discarded", f"after {r['check_times']} checks ({r['reason']})"))
        out.append(_event(None, b, "state", f"{r['state']}" + (f" ({r['reason']})" if r["reason"] else "")
                          + f", {r['commit_count']} commit(s), {r['copies']} half record(s)"))  # fmt: skip
    return out


def _traced(trace: list[dict[str, Any]]) -> list[Event]:
    """Trace contexts as events at their broker time (`transforms.trace.broker_time`): sends, end requests and
    check answers, consumption attempts (a SubBefore and its SubAfter told as one)."""
    after = {r["request_id"]: r for r in trace if r["trace_type"] == "SubAfter"}
    out = []
    for r in trace:
        host, at = r["born_host"], _broker_time(r)
        if r["trace_type"] == "Pub":
            to = f" to {r['store_host']}" if r["store_host"] else ""
            out.append(_event(at, None, "sent", f"by {r['group_name']} from {host}{to}: "
                              f"{r['msg_type']}, {'ok' if r['success'] else 'failed'}, {r['cost_ms']} ms"))  # fmt: skip
        elif r["trace_type"] == "EndTransaction":
            kind = "answer to a check" if r["from_check"] else "end request"
            out.append(_event(at, None, "answer" if r["from_check"] else "end request",
                              f"{kind}: {r['transaction_state']} by {r['group_name']} from {host}"))  # fmt: skip
        elif r["trace_type"] == "SubBefore":
            done = after.pop(r["request_id"], None)
            result = "no result traced" if done is None else (
                f"{'consumed' if done['success'] else 'FAILED'} in {done['cost_ms']} ms")  # fmt: skip
            out.append(_event(at, None, "consumption", f"group {r['group_name']} on {host}: {result}, "
                              f"retry {r['retry_times']}"))  # fmt: skip
    for r in after.values():  # a result whose start was not traced
        out.append(_event(_broker_time(r), None, "consumption", f"group {r['group_name']} on {r['born_host']}: "
                          f"{'consumed' if r['success'] else 'FAILED'} (start not traced)"))  # fmt: skip
    return out


def _broker_time(r: dict[str, Any]) -> int | None:
    """A context's time on the broker's clock: its client time moved by its trace message's store minus born."""
    if r["timestamp"] is None:
        return None
    return int(r["timestamp"] + r["store_timestamp"] - r["born_timestamp"])


def table(events: list[Event]) -> str:
    """Events as aligned lines: time (UTC), broker, event, what."""
    lines = []
    for e in events:
        at = "" if e["at"] is None else _time(e["at"])
        lines.append(f"{at:<23}  {e['broker'] or '':<10}  {e['event']:<13}  {e['what']}")
    return "\n".join(lines)


def _time(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def page(key: str, events: list[Event]) -> str:
    """The story as a small HTML page (serve's /trace/<key>)."""
    return (f"<!doctype html><meta charset='utf-8'><title>txn-recon trace {html.escape(key)}</title>"
            f"<h1>{html.escape(key)}</h1><pre>{html.escape(table(events))}</pre>")  # fmt: skip


if __name__ == "__main__":
    from jobs.cli import main

    sys.exit(main(["trace", *sys.argv[1:]]))
