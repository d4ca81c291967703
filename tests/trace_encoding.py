"""Trace bodies as RocketMQ's client writes them (`TraceDataEncoder.encoderFromContextBean`, 5.3.3): the test
vectors of `sources.trace` and the seeds of its fuzzing. A context's fields joined by 0x01, each context ended
by 0x02; Java writes an absent value as "null" and a message type as its ordinal."""

from __future__ import annotations

C, F = "\x01", "\x02"


def pub(ts: int, group: str, topic: str, key: str, keys: str | None, store: str, cost: int, msg_type: int,
        offset_id: str, success: bool = True) -> str:  # fmt: skip
    return C.join([ "Pub", str(ts), "DefaultRegion", group, topic, key, "null", _s(keys), store, "12", str(cost),
                    str(msg_type), offset_id, _b(success)]) + F  # fmt: skip


def sub_before(ts: int, group: str, request: str, key: str, retry: int, keys: str | None) -> str:
    return C.join(["SubBefore", str(ts), "DefaultRegion", group, request, key, str(retry), _s(keys)]) + F


def sub_after(ts: int, group: str, request: str, key: str, cost: int, success: bool, keys: str | None,
              code: int = 0) -> str:  # fmt: skip
    return C.join(["SubAfter", request, key, str(cost), _b(success), _s(keys), str(code), str(ts), group]) + F


def end_transaction(ts: int, group: str, topic: str, key: str, keys: str | None, store: str, state: str,
                    from_check: bool) -> str:  # fmt: skip
    return C.join(["EndTransaction", str(ts), "DefaultRegion", group, topic, key, "null", _s(keys), store, "2",
                   "null", state, _b(from_check)]) + F  # fmt: skip


def _s(value: str | None) -> str:
    return "null" if value is None else value


def _b(value: bool) -> str:
    return "true" if value else "false"


KEY = "7F00000100002A9F0000000000000001"
TRACE_BODIES = (
    (pub(1_700_000_000_000, "PG_MAIN", "TxnTopic", KEY, "FATE-1", "127.0.0.1:10911", 3, 1, "7F00000100002A9F")
     + end_transaction(1_700_000_000_004, "PG_MAIN", "TxnTopic", KEY, "FATE-1", "127.0.0.1:10911", "UNKNOW", False)
     + end_transaction(1_700_000_006_000, "PG_MAIN", "TxnTopic", KEY, "FATE-1", "127.0.0.1:10911", "UNKNOW", True)
     ).encode(),
    (sub_before(1_700_000_001_000, "CG_RECON", "REQ1", KEY, 0, "FATE-1")
     + sub_after(1_700_000_001_000, "CG_RECON", "REQ1", KEY, 5, True, "FATE-1")).encode(),
)  # fmt: skip
