"""Every decoder of outside bytes under Hypothesis (tests/fuzz.py says what each must hold), on a budget the
suite can afford, and every input a longer campaign (`make fuzz`) saved as a regression, replayed. No Spark.

FUZZ_EXAMPLES sets the inputs per decoder (the suite's budget below; `make fuzz` sets more). The time per
input is bounded by Hypothesis' deadline: a decoder that loops without progress fails it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sources.commitlog import Message, scan
from tests.fuzz import DECODERS, mutated, regressions, run
from tests.store_encoding import encode

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "2000"))
BUDGET = settings(max_examples=EXAMPLES, deadline=2_000, derandomize=not os.environ.get("FUZZ_SAVE"),
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], database=None)  # fmt: skip


@pytest.mark.parametrize("decoder", sorted(DECODERS))
def test_a_decoder_yields_records_or_its_own_error_whatever_the_bytes(decoder: str) -> None:
    seeds = DECODERS[decoder][1]()
    for seed in seeds:  # the unchanged seeds decode
        run(decoder, seed)

    @BUDGET
    @given(mutated(seeds))
    def fuzz(data: bytes) -> None:
        run(decoder, data)

    fuzz()


SAVED = [p for d in sorted(DECODERS) for p in regressions(d)]


@pytest.mark.parametrize("path", SAVED, ids=[f"{p.parent.name}/{p.name}" for p in SAVED])
def test_saved_inputs_stay_fixed(path: Path) -> None:
    run(path.parent.name, path.read_bytes())


def _records(n: int) -> list[bytes]:
    """`n` records back to back, of both magic codes and host kinds, each with its own position."""
    out, at = [], 0
    for i in range(n):
        out.append(encode(f"topic-{i}", {"UNIQ_KEY": f"k{i}", "TAGS": "t" * i}, body=bytes(range(i * 7 % 50)),
                          position=at, queue_offset=i, v2=i == 3, ipv6=i == 4))  # fmt: skip
        at += len(out[-1])
    return out


RECORDS = _records(7)


# The first input this found, before the decoder kept its reads within the record: a length pointing past it.
@example(k=3, where=250, width=1, value=b"\x03\x00\x00\x00")
@settings(max_examples=EXAMPLES, deadline=2_000, database=None, derandomize=not os.environ.get("FUZZ_SAVE"))
@given(k=st.integers(0, len(RECORDS) - 1), where=st.integers(0, 10_000), width=st.integers(1, 4),
       value=st.binary(min_size=4, max_size=4))  # fmt: skip
def test_a_corrupt_record_hides_and_changes_no_other_record(k: int, where: int, width: int, value: bytes) -> None:
    """One field of one record overwritten (its length, magic, a count, body bytes): the scan resyncs past
    it, and every other record decodes as it did before."""
    clean = b"".join(RECORDS) + bytes(16)
    start = sum(len(r) for r in RECORDS[:k])
    at = start + where % len(RECORDS[k])
    end = min(at + width, start + len(RECORDS[k]))
    corrupt = clean[:at] + value[: end - at] + clean[end:]
    before = [e for e in scan(clean, 0) if isinstance(e, Message)]
    after = {e.position: e for e in scan(corrupt, 0) if isinstance(e, Message)}
    assert len(before) == len(RECORDS)
    for j, m in enumerate(before):
        if j != k:
            assert after.get(m.position) == m, (j, m.position)
