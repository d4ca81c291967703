"""What the scenario driver's record says the pipeline must find (DESIGN §2), one transaction at a time.

The driver records what it did and saw: each transaction's fate, its local decision and every check the
broker sent it with the answer. What follows from that on the broker is mechanical:
- every COMMIT answer, local or to a check, that reaches the broker writes one final message (the broker
  never asks whether the half was committed already, reference §1.4). The client sends each answer oneway
  and never learns whether it arrived (a CI run on 5.5.0 stored one final where the driver had
  answered COMMIT twice), so the finals are what the group's consumers received, each (queue, offset) once;
- the copy a check was about is resolved by the op of a COMMIT or ROLLBACK answer, and stays open after
  an UNKNOW; an open last copy is checked again until `check_max` copies, then discarded;
- the copies nobody is asked about: a gone producer group's (checks go nowhere) and the immunity copies
  written inside `CHECK_IMMUNITY_TIME_IN_SECONDS` (never resolved, reference §1.5);
- a transaction decided after its discard is never checked again: the driver records no check after its
  late commit, so it is ORPHANED_COMMIT AFTER_DISCARD and not RECHECKED_AFTER_RESOLUTION (DESIGN §2);
- the copy the check_max-th check is about is discarded as soon as the check pass reaches it, unless its
  op came first: the pass tests the check count before it stops at copies stored since it began
  (TransactionalMessageServiceImpl.check), and it put that copy back a moment before. An answer to that
  check races the discard, which the driver cannot see: a final it writes may land after the discard or
  before. On a loaded machine a 5.5.0 broker applied no op before a check pass, checked all 125
  transactions three times and discarded each; of the 60 whose third answer was COMMIT, 58 finals
  landed after the discard. That finding is `either` for them: found or not, both follow.

A RIP-82 broker (`rip_82_expected`) checks the original half alone, deletes it from RocksDB at once when
an end request comes, and deletes an unresolved one at its check_max + 1-th check. Which it deleted, and at
which count, is the broker's own record (`rip_82_deletions`, its transaction.log): the driver cannot count
them, since the broker counts a check before it sends it, oneway, and a check it failed to send is never
seen (a CI run on 5.5.0 deleted a half whose application had seen 3 of its 4 checks).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

DECIDED = ("COMMIT", "ROLLBACK")
UNSEEN_OPEN_COPIES = ("GONE", "IMMUNITY")  # open copies the driver is never asked about


@dataclass(frozen=True)
class Expected:
    state: str
    anomalies: frozenset[tuple[str, str | None]]  # (type, reason)
    either: frozenset[tuple[str, str | None]] = frozenset()  # may follow or not: a race the driver cannot see


def expected(t: dict[str, Any], check_max: int, check_interval_ms: int) -> Expected:
    answers = [c["answer"] for c in t["checks"]]
    resolved = t["local"] in DECIDED or any(a in DECIDED for a in answers)
    last_open = answers[-1] == "UNKNOW" if answers else t["fate"] in UNSEEN_OPEN_COPIES
    discarded = last_open and t["fate"] != "YOUNG"  # the driver waited until every open copy was discarded
    # A local decision after the last check of a discarded transaction came after the discard: the discard
    # follows the check_max-th check in that pass or a later one, and the driver decides 4 check intervals
    # after it, which leaves a slow machine a pass or two of margin. No check follows such a resolution.
    after = t["local_at"] - t["checks"][-1]["at"] if answers and discarded and t["local"] in DECIDED else 0
    if 0 < after <= 3 * check_interval_ms:
        raise AssertionError(f"{t['uniq_key']}: decided {after} ms after its last check: too close to call")
    # A live producer is asked about every copy up to the discard (a gone group may answer a first check
    # while it is still up, then nobody is asked). The broker numbers each check before it sends it, and a
    # check that reaches a member shutting down is lost: the last one seen must still be the check_max-th.
    last = t["checks"][-1]["times"] if answers else 0
    if answers and answers[-1] == "UNKNOW" and last < check_max and discarded and t["fate"] != "GONE":
        raise AssertionError(f"{t['uniq_key']}: its last check before the discard was #{last}, expected {check_max}")
    outcome = _outcome(t, resolved, discarded, rechecked=resolved and last_open and after <= 0, late=after > 0)
    if answers and last == check_max and answers[-1] == "COMMIT":  # its final races the discard (above)
        return dataclasses.replace(outcome, either=frozenset({("ORPHANED_COMMIT", "AFTER_DISCARD")}))
    return outcome


def rip_82_deletions(transaction_log: str) -> dict[str, int]:
    """The halves a RIP-82 broker deleted unresolved, by UNIQ_KEY, with its check count then (5.5.0 logs
    `need delete, checkTimes: N, msgId: KEY` at INFO in transaction.log, TransactionalMessageRocksDBService)."""
    return {key: int(n) for n, key in re.findall(r"need delete, checkTimes: (\d+), msgId: (\w+)", transaction_log)}


def rip_82_expected(t: dict[str, Any], check_max: int, deletions: dict[str, int]) -> Expected:
    """What follows on a RIP-82 broker: no check copies, so nothing is checked after its resolution, and a
    half the broker deleted unresolved is DISCARDED; a later decision cannot undo that."""
    answers = [c["answer"] for c in t["checks"]]
    answered = any(a in DECIDED for a in answers)
    deleted = t["uniq_key"] in deletions
    if deleted and (answered or deletions[t["uniq_key"]] != check_max + 1 or len(answers) > check_max + 1):
        raise AssertionError(f"{t['uniq_key']}: deleted at check {deletions[t['uniq_key']]}, seen {answers}")
    if not deleted and t["fate"] != "YOUNG" and not answered and t["local"] not in DECIDED:
        raise AssertionError(f"{t['uniq_key']}: never resolved and never deleted")
    # An end request deletes the half at once, so a local decision of a half the checks deleted came after.
    late = deleted and t["local"] in DECIDED
    return _outcome(t, t["local"] in DECIDED or answered, deleted, rechecked=False, late=late)


def _outcome(t: dict[str, Any], resolved: bool, discarded: bool, rechecked: bool, late: bool) -> Expected:
    """The state and findings of a transaction, from what happened to it (`late`: decided after its discard)."""
    answers = [c["answer"] for c in t["checks"]]
    commits = t["finals"]
    if commits > (t["local"] == "COMMIT") + answers.count("COMMIT"):
        raise AssertionError(f"{t['uniq_key']}: {commits} final messages for fewer COMMIT answers")
    found: set[tuple[str, str | None]] = set()
    if commits > 1:
        found.add(("DUPLICATE_COMMIT", None))
    if rechecked:
        found.add(("RECHECKED_AFTER_RESOLUTION", None))
    if late and t["local"] == "COMMIT":
        found.add(("ORPHANED_COMMIT", "AFTER_DISCARD"))
    if commits:
        state = "COMMITTED"
    elif resolved:
        state = "ROLLED_BACK"
    elif discarded:
        state = "DISCARDED"
        found.add(("DISCARDED_AFTER_MAX_CHECKS", "MAX_CHECKS"))
    else:
        state = "PENDING"
    return Expected(state, frozenset(found))
