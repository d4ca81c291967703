"""broker.rebalance.allocate against reference §2.4-2.5."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.rebalance import allocate, md5_hash, queue_string

QUEUES = [("topic", "brokerName", i) for i in range(10)]
CIDS = ["c0", "c1", "c2", "c3"]


def _ids(result: list[tuple[str, str, int]]) -> list[int]:
    return [q[2] for q in result]


def test_averagely_worked_example() -> None:
    assert [_ids(allocate("AVG", "g", c, QUEUES, CIDS)) for c in CIDS] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


def test_averagely_by_circle_worked_example() -> None:
    got = [_ids(allocate("AVG_BY_CIRCLE", "g", c, QUEUES, CIDS)) for c in CIDS]
    assert got == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]


def test_fewer_queues_than_consumers() -> None:
    queues = QUEUES[:2]
    assert [_ids(allocate("AVG", "g", c, queues, CIDS)) for c in CIDS] == [[0], [1], [], []]
    assert [_ids(allocate("AVG_BY_CIRCLE", "g", c, queues, CIDS)) for c in CIDS] == [[0], [1], [], []]


def test_inputs_are_sorted_like_rebalance_by_topic() -> None:
    # Client ids sort as strings ("c10" < "c2"); queues by topic, broker, then queue id.
    cids = ["c2", "c10"]
    queues = [("t", "b", 1), ("a", "z", 5), ("t", "a", 0), ("t", "b", 0)]
    assert allocate("AVG", "g", "c10", queues, cids) == [("a", "z", 5), ("t", "a", 0)]
    assert allocate("AVG", "g", "c2", queues, cids) == [("t", "b", 0), ("t", "b", 1)]


def test_java_string_order_is_by_utf16_code_unit() -> None:
    # U+1F600 is a surrogate pair (0xD83D...), which Java sorts before U+FF5E; Python's code points would not.
    cids = ["\uff5e", "\U0001f600"]
    assert allocate("AVG", "g", "\U0001f600", [("t", "b", 0), ("t", "b", 1)], cids) == [("t", "b", 0)]


def test_unknown_client_gets_nothing() -> None:
    assert allocate("AVG", "g", "stranger", QUEUES, CIDS) == []
    assert allocate("CONSISTENT_HASH", "g", "stranger", QUEUES, CIDS) == []


@pytest.mark.parametrize(
    ("cid", "mqs", "cids", "message"),
    [
        ("", QUEUES, CIDS, "currentCID is empty"),
        ("c0", [], CIDS, "mqAll is null or mqAll empty"),
        ("c0", QUEUES, [], "cidAll is null or cidAll empty"),
    ],
)
def test_illegal_arguments(cid: str, mqs: list[tuple[str, str, int]], cids: list[str], message: str) -> None:
    for strategy in ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "MACHINE_ROOM"):
        with pytest.raises(ValueError, match=message):
            allocate(strategy, "g", cid, mqs, cids)


def test_by_config_gives_everyone_the_list_without_checks() -> None:
    configured = [("t", "b", 3), ("t", "b", 1)]
    for cid in ("c0", "stranger", ""):
        assert allocate("CONFIG", "g", cid, [], [], message_queue_list=configured) == configured


def test_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="unknown allocation strategy 'LIFO'"):
        allocate("LIFO", "g", "c0", QUEUES, CIDS)


def test_md5_hash_is_first_four_digest_bytes() -> None:
    # MD5("a") = 0cc175b9c0f1b6a831c399e269772661
    assert md5_hash("a") == 0x0CC175B9
    assert queue_string(("t", "b", 3)) == "MessageQueue [topic=t, brokerName=b, queueId=3]"


def _brute_force_owner(mq: tuple[str, str, int], cids: list[str], vnodes: int) -> str:
    """Independent oracle: scan every virtual node for the smallest hash >= the queue's, else the smallest."""
    ring = {}
    for cid in sorted(cids):
        for r in range(vnodes):
            ring[int(hashlib.md5(f"{cid}-{r}".encode()).hexdigest()[:8], 16)] = cid
    h = int(hashlib.md5(queue_string(mq).encode()).hexdigest()[:8], 16)
    at_or_after = [p for p in ring if p >= h]
    return ring[min(at_or_after) if at_or_after else min(ring)]


@pytest.mark.parametrize("vnodes", [1, 3, 10])
def test_consistent_hash_matches_brute_force_ring(vnodes: int) -> None:
    queues = [("orders", b, q) for b in ("broker-a", "broker-b") for q in range(8)]
    cids = ["10.0.0.1@101#7", "10.0.0.2@102#9", "10.0.0.3@103#11"]
    for cid in cids:
        expected = [mq for mq in sorted(queues) if _brute_force_owner(mq, cids, vnodes) == cid]
        assert allocate("CONSISTENT_HASH", "g", cid, queues, cids, virtual_nodes=vnodes) == expected


def test_consistent_hash_edge_cases() -> None:
    with pytest.raises(ValueError, match="illegal virtual node counts"):
        allocate("CONSISTENT_HASH", "g", "c0", QUEUES, CIDS, virtual_nodes=-1)
    assert allocate("CONSISTENT_HASH", "g", "c0", QUEUES, CIDS, virtual_nodes=0) == []


def test_machine_room() -> None:
    queues = [("t", "room1@b1", 0), ("t", "room1@b1", 1), ("t", "room2@b2", 0), ("t", "room1@", 0),
              ("t", "b3", 0), ("t", "room1@b4", 0), ("t", "room1@b4", 1)]  # fmt: skip
    # Eligible (sorted): room1@b1 q0, q1, room1@b4 q0, q1 -- "room1@" splits to one part, "b3" has no room.
    got = [allocate("MACHINE_ROOM", "g", c, queues, ["a", "b", "c"], consumeridcs={"room1"}) for c in "abc"]
    assert got == [
        [("t", "room1@b1", 0), ("t", "room1@b4", 1)],
        [("t", "room1@b1", 1)],
        [("t", "room1@b4", 0)],
    ]


queue_lists = st.lists(
    st.tuples(st.sampled_from(["t1", "t2"]), st.sampled_from(["broker-a", "broker-b"]), st.integers(0, 15)),
    min_size=1, max_size=40, unique=True,
)  # fmt: skip
cid_lists = st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=6), min_size=1, max_size=8, unique=True)


@given(queue_lists, cid_lists, st.sampled_from(["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"]))
def test_every_queue_has_exactly_one_owner(queues: list, cids: list[str], strategy: str) -> None:
    owned = [mq for cid in cids for mq in allocate(strategy, "g", cid, queues, cids)]
    assert sorted(owned) == sorted(queues)


@given(queue_lists, cid_lists)
def test_averagely_is_balanced_and_contiguous(queues: list, cids: list[str]) -> None:
    sizes = [len(allocate("AVG", "g", cid, queues, cids)) for cid in cids]
    assert max(sizes) - min(sizes) <= 1
    ordered = [mq for cid in sorted(cids, key=lambda s: s.encode("utf-16-be", "surrogatepass"))
               for mq in allocate("AVG", "g", cid, queues, cids)]  # fmt: skip
    assert ordered == sorted(queues)
