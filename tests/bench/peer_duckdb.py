"""The peer of `make bench`: DuckDB computing DESIGN §2's lifecycle, transaction rules and offset regressions
over the same Parquet landing txn-recon ingests, so both can be timed in one run and their findings compared.

    python -m tests.bench.peer_duckdb LANDING RULES_JSON OUT

reads LANDING/{half,op,real,offset}/ (and consumer/, copy/ for the default data time), and writes OUT: one
JSON object a line, each finding as `finding_key` keys it, then one line of lifecycle state counts. Ingest's
part is taken as the landing holds it: exact repeats dropped, nothing to quarantine (the model's Parquet
breaks no contract). It imports no Spark, so its wall time is DuckDB's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq

from schemas.landing import HALF_TOPIC_OF_OP, LANDING, ROCKSDB_HALF_TOPIC

TIME = {"half": "store_timestamp", "op": "store_timestamp", "real": "store_timestamp", "offset": "commit_timestamp",
        "consumer": "snapshot_ts", "copy": "store_timestamp", "trace": "store_timestamp"}  # fmt: skip
# The columns a finding is compared by: its key, its time, and an offset regression's redelivery estimate.
FINDING = ("anomaly_type", "reason", "broker_name", "uniq_key", "consumer_group", "topic", "queue_id", "event_ts",
           "seq", "redelivery_estimate")  # fmt: skip


def finding_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(c) for c in FINDING)


def view(con: duckdb.DuckDBPyConnection, landing: Path, stream: str) -> bool:
    """`stream` as a view of its Parquet files, repeats dropped and defaults filled as ingest fills them."""
    files = sorted((landing / stream).rglob("*.parquet"))
    if not files:
        return False
    present = set(pq.read_schema(files[0]).names)
    cols = []
    for f in LANDING[stream].fields:
        default = None if f.default is None else "'" + f.default.replace("'", "''") + "'"
        name = f'"{f.name}"'
        if f.name in present:
            cols.append(f"coalesce({name}, {default}) AS {name}" if default else name)
        else:
            cols.append(f"{default or 'NULL'} AS {name}")
    paths = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
    con.execute(
        f"CREATE VIEW {stream}_all AS SELECT DISTINCT {', '.join(cols)} "
        f"FROM read_parquet([{paths}], union_by_name = true)"
    )
    return True


def lifecycle_sql(as_of: int, r: dict[str, int]) -> str:
    half_of_op = " ".join(f"WHEN '{op}' THEN '{half}'" for op, half in HALF_TOPIC_OF_OP.items())
    slack = r["check_interval_ms"] + r["transaction_timeout_ms"]
    deleted_at = f"first_copy_ts + {r['transaction_timeout_ms'] + r['check_max'] * r['check_interval_ms']}"
    return f"""
CREATE TABLE resolved AS
  SELECT broker_name, half_topic, queue_id, CAST(t AS BIGINT) AS half_offset, min(store_timestamp) AS resolved_ts
  FROM (SELECT broker_name, CASE topic {half_of_op} END AS half_topic, queue_id, store_timestamp,
               unnest(string_split(body, ',')) AS t
        FROM op_all WHERE store_timestamp <= {as_of})
  WHERE t <> '' GROUP BY ALL;
CREATE TABLE half AS SELECT * FROM half_all WHERE store_timestamp <= {as_of};
CREATE TABLE real AS SELECT * FROM real_all WHERE store_timestamp <= {as_of};
CREATE TABLE h AS
  SELECT broker_name, uniq_key, min(producer_group) AS producer_group, min(born_timestamp) AS born_ts,
         min(store_timestamp) AS first_copy_ts, max(store_timestamp) AS last_copy_ts, count(*) AS copies,
         max(coalesce(check_times, 0)) AS check_times, list_sort(list(DISTINCT commit_log_offset)) AS copy_offsets,
         max(queue_offset) FILTER (WHERE coalesce(check_times, 0) > 0) AS last_check,
         max(store_timestamp) FILTER (WHERE coalesce(check_times, 0) > 0) AS last_check_ts,
         list(DISTINCT queue_offset) FILTER (WHERE coalesce(check_times, 0) > 0) AS checks,
         min(topic) AS half_topic
  FROM half GROUP BY ALL;
CREATE TABLE res AS
  SELECT h.broker_name, h.uniq_key, min(r.resolved_ts) AS resolved_ts, list(DISTINCT r.half_offset) AS resolved
  FROM half h JOIN resolved r
    ON h.broker_name = r.broker_name AND h.topic = r.half_topic AND h.queue_id = r.queue_id
   AND h.queue_offset = r.half_offset
  GROUP BY ALL;
CREATE TABLE c AS
  SELECT broker_name, uniq_key, count(*) AS commit_count, list_sort(list(store_timestamp)) AS commit_ts,
         min(store_timestamp) AS first_commit_ts,
         list_sort(list(DISTINCT prepared_transaction_offset) FILTER (WHERE prepared_transaction_offset IS NOT NULL))
           AS prepared_offsets
  FROM real
  WHERE uniq_key IS NOT NULL AND topic <> 'TRANS_CHECK_MAX_TIME_TOPIC'
    AND ((sys_flag & 12) = 8 OR coalesce(transactional, false))
  GROUP BY ALL;
CREATE TABLE d AS
  SELECT broker_name, uniq_key, min(store_timestamp) AS evidence_ts FROM real
  WHERE topic = 'TRANS_CHECK_MAX_TIME_TOPIC' AND uniq_key IS NOT NULL GROUP BY ALL;
CREATE TABLE agg AS
  SELECT * EXCLUDE (copies, commit_count, check_times, checks, resolved),
         coalesce(copies, 0) AS copies, coalesce(commit_count, 0) AS commit_count,
         coalesce(check_times, 0) AS check_times, coalesce(checks, []) AS checks, coalesce(resolved, []) AS resolved
  FROM h FULL JOIN res USING (broker_name, uniq_key) FULL JOIN c USING (broker_name, uniq_key)
         FULL JOIN d USING (broker_name, uniq_key);
CREATE TABLE deleted AS
  SELECT *, CASE WHEN half_topic = '{ROCKSDB_HALF_TOPIC}' AND {as_of} - ({deleted_at}) > {slack}
                  AND coalesce(least(resolved_ts, first_commit_ts) > {deleted_at}, true)
             THEN {deleted_at} END AS deleted_ts
  FROM agg WHERE copies > 0 OR commit_count > 0;
CREATE TABLE reasoned AS
  SELECT *, CASE WHEN evidence_ts IS NOT NULL THEN CASE WHEN check_times >= {r["check_max"]} THEN 'MAX_CHECKS'
                                                          ELSE 'EXPIRED' END
                 WHEN deleted_ts IS NOT NULL THEN 'MAX_CHECKS'
                 WHEN check_times >= {r["check_max"]} AND {as_of} - last_copy_ts > {slack} THEN 'MAX_CHECKS'
                 WHEN {as_of} - born_ts > {r["file_reserved_hours"] * 3_600_000} THEN 'EXPIRED' END AS why
  FROM deleted;
CREATE TABLE lifecycle AS
  SELECT broker_name, uniq_key, born_ts, first_copy_ts, last_copy_ts, copies, check_times, resolved_ts,
         commit_count, commit_ts, first_commit_ts, prepared_offsets, copy_offsets,
         coalesce(evidence_ts, deleted_ts) AS discard_ts,
         CASE WHEN commit_count > 0 THEN 'COMMITTED' WHEN resolved_ts IS NOT NULL THEN 'ROLLED_BACK'
              WHEN why IS NOT NULL THEN 'DISCARDED' ELSE 'PENDING' END AS state,
         why,
         CASE WHEN last_check IS NOT NULL THEN list_contains(resolved, last_check) END AS last_check_resolved,
         last_check_ts > least(first_commit_ts, resolved_ts) AS checked_after_resolution
  FROM reasoned;
"""


def findings_sql(as_of: int, r: dict[str, int]) -> str:
    after_discard = "list_filter(commit_ts, lambda t: t > discard_ts)"
    stray = "list_filter(prepared_offsets, lambda p: NOT list_contains(copy_offsets, p))"
    parts = [
        ("'STUCK_HALF'", "NULL", f"state = 'PENDING' AND {as_of} - born_ts >= {r['stuck_after_ms']}", "born_ts"),
        ("CASE why WHEN 'MAX_CHECKS' THEN 'DISCARDED_AFTER_MAX_CHECKS' ELSE 'DISCARDED_EXPIRED' END", "why",
         "state = 'DISCARDED'", "coalesce(discard_ts, last_copy_ts)"),
        ("'ORPHANED_COMMIT'", "'NO_HALF'", "commit_count > 0 AND copies = 0", "first_commit_ts"),
        ("'ORPHANED_COMMIT'", "'NO_OP'", f"commit_count > 0 AND copies > 0 AND resolved_ts IS NULL "
                                         f"AND {as_of} - first_commit_ts > {r['op_grace_ms']}", "first_commit_ts"),
        ("'ORPHANED_COMMIT'", "'AFTER_DISCARD'", f"commit_count > 0 AND len({after_discard}) > 0",
         f"{after_discard}[1]"),
        ("'ORPHANED_COMMIT'", "'OFFSET_MISMATCH'", f"commit_count > 0 AND copies > 0 AND len({stray}) > 0",
         "first_commit_ts"),
        ("'DUPLICATE_COMMIT'", "NULL", "commit_count > 1", "commit_ts[2]"),
        ("'RECHECKED_AFTER_RESOLUTION'", "NULL",
         "resolved_ts IS NOT NULL AND NOT coalesce(last_check_resolved, true) "
         "AND (discard_ts IS NULL OR coalesce(checked_after_resolution, false))", "resolved_ts"),
    ]  # fmt: skip
    transactions = " UNION ALL ".join(
        f"SELECT {kind} AS anomaly_type, {reason} AS reason, broker_name, uniq_key, NULL AS consumer_group, "
        f"NULL AS topic, NULL::INT AS queue_id, {ts} AS event_ts, NULL::BIGINT AS seq, "
        f"NULL::BIGINT AS redelivery_estimate FROM lifecycle WHERE {holds}"
        for kind, reason, holds, ts in parts
    )
    return f"""
CREATE TABLE regressions AS
  SELECT * FROM (
    SELECT broker_name, consumer_group, topic, queue_id, commit_timestamp, seq, "offset",
           lag("offset") OVER (PARTITION BY broker_name, consumer_group, topic, queue_id
                             ORDER BY commit_timestamp, seq NULLS FIRST, "offset", client_id NULLS FIRST)
             AS prev_offset
    FROM offset_all WHERE commit_timestamp <= {as_of})
  WHERE "offset" < prev_offset;
CREATE TABLE findings AS
  {transactions}
  UNION ALL
  SELECT 'OFFSET_REGRESSION', NULL, g.broker_name, NULL, g.consumer_group, g.topic, g.queue_id,
         g.commit_timestamp, g.seq, count(m.queue_offset)
  FROM regressions g LEFT JOIN real m
    ON m.broker_name = g.broker_name AND m.topic = g.topic AND m.queue_id = g.queue_id
   AND m.queue_offset >= g."offset" AND m.queue_offset < g.prev_offset
  GROUP BY g.broker_name, g.consumer_group, g.topic, g.queue_id, g.commit_timestamp, g.seq, g."offset", g.prev_offset;
"""


def run(landing: Path, rules: dict[str, int], out: Path) -> None:
    con = duckdb.connect()
    con.execute(f"SET threads = {os.cpu_count() or 1}")
    present = [s for s in TIME if view(con, landing, s)]
    as_of = con.execute(
        "SELECT max(t) FROM (" + " UNION ALL ".join(f"SELECT max({TIME[s]}) AS t FROM {s}_all" for s in present) + ")"
    ).fetchone()[0]  # type: ignore[index]
    con.execute(lifecycle_sql(as_of, rules))
    con.execute(findings_sql(as_of, rules))
    cursor = con.execute(f"SELECT {', '.join(FINDING)} FROM findings")
    with out.open("w", encoding="utf-8") as f:
        for row in cursor.fetchall():
            f.write(json.dumps(dict(zip(FINDING, row, strict=True))) + "\n")
        states = dict(con.execute("SELECT state, count(*) FROM lifecycle GROUP BY state").fetchall())
        f.write(json.dumps({"states": states, "as_of": as_of}) + "\n")


if __name__ == "__main__":
    run(Path(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3]))
