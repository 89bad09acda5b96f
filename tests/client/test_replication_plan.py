"""The pure planning of replicated writes and failover reads: quorum, DRAINING spares, read rounds."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from kvpool_client.batching import Job
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import KeyPlacement, Member
from kvpool_client.failover import ReadPlan
from kvpool_client.replication import DeleteTally, WritePlan, fan_out, quorum_for
from kvpool_client.results import PutResult, most_telling

OK, EXISTS, BUSY = ErrorCode.OK, ErrorCode.ALREADY_EXISTS, ErrorCode.BUSY
DOWN, SLOW, MISS = ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT, ErrorCode.NOT_FOUND
DRAINING, FULL, CORRUPT = ErrorCode.DRAINING, ErrorCode.OUT_OF_SPACE, ErrorCode.CHECKSUM_MISMATCH
A, B, C, D = (Member(n, f"{n}:1") for n in "abcd")
NS = "m@fp16@L@tp0of1"


def keys(n: int) -> list[BlockKey]:
    return [BlockKey(NS, bytes([i]) * 32) for i in range(n)]


def everyone(_: str) -> bool:
    return True


def down(*node_ids: str):  # type: ignore[no-untyped-def]
    return lambda node_id: node_id not in node_ids


def by_node(jobs: Iterable[Job]) -> dict[str, list[int]]:
    return {job.member.node_id: job.indices for job in jobs}


def answer(plan: WritePlan | ReadPlan, jobs: list[Job], table: dict[tuple[str, int], ErrorCode]) -> None:
    """Record for each job's keys the code in ``table`` (default OK)."""
    for job in jobs:
        plan.record(job, [table.get((job.member.node_id, i), OK) for i in job.indices])


# -- quorum ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("quorum", "owners", "expected"), [(2, 3, 2), (3, 2, 2), (1, 0, 1), (2, 1, 1), (1, 3, 1)])
def test_quorum_is_clamped_to_the_owners_placed(quorum: int, owners: int, expected: int) -> None:
    assert quorum_for(quorum, owners) == expected


def test_put_goes_to_every_write_owner_in_one_round() -> None:
    placements = [KeyPlacement((A, B), (A, B), (C,)), KeyPlacement((B, C), (B, C), (A,))]
    plan = WritePlan(keys(2), placements, 2)
    jobs = plan.next_round(everyone)
    assert by_node(jobs) == {"a": [0], "b": [0, 1], "c": [1]}
    answer(plan, jobs, {})
    assert plan.next_round(everyone) == [], "nothing left once every owner answered"
    assert plan.statuses() == [OK, OK]
    assert plan.stored_on() == (("a:1", "b:1"), ("b:1", "c:1")), "addresses, not node ids"


def test_quorum_two_of_three_with_one_owner_down() -> None:
    placements = [KeyPlacement((A, B, C), (A, B, C))] * 3
    plan = WritePlan(keys(3), placements, 2)
    jobs = plan.next_round(down("b"))  # b's circuit is open: it is not even asked
    assert by_node(jobs) == {"a": [0, 1, 2], "c": [0, 1, 2]}
    answer(plan, jobs, {("c", 1): DOWN, ("a", 2): FULL})
    assert plan.statuses() == [OK, DOWN, FULL], "key 1: a alone; key 2: c alone, a's own verdict tells most"
    assert plan.stored_on() == (("a:1", "c:1"), ("a:1",), ("c:1",))
    result = PutResult(tuple(plan.statuses()), stored_on=plan.stored_on())
    assert [i for i, _ in result.failures()] == [1, 2]


def test_status_when_quorum_met_without_new_copies() -> None:
    placements = [KeyPlacement((A, B), (A, B))] * 3
    plan = WritePlan(keys(3), placements, 2)
    jobs = plan.next_round(everyone)
    answer(plan, jobs, {("a", 0): EXISTS, ("a", 1): EXISTS, ("b", 1): EXISTS, ("a", 2): BUSY, ("b", 2): EXISTS})
    assert plan.statuses() == [OK, EXISTS, EXISTS], "OK if any owner stored it now, else ALREADY_EXISTS"
    only_busy = WritePlan(keys(1), [KeyPlacement((A,), (A,))], 1)
    answer(only_busy, only_busy.next_round(everyone), {("a", 0): BUSY})
    assert only_busy.statuses() == [BUSY]


def test_a_draining_owner_is_replaced_by_the_next_spare() -> None:
    placements = [KeyPlacement((A, B), (A, B), (C, D)), KeyPlacement((B, A), (B, A), (D,))]
    plan = WritePlan(keys(2), placements, 2)
    first = plan.next_round(everyone)
    answer(plan, first, {("b", 0): DRAINING, ("b", 1): DRAINING})
    second = plan.next_round(everyone)
    assert by_node(second) == {"c": [0], "d": [1]}, "each refused key goes to its own first spare"
    answer(plan, second, {("d", 1): DRAINING})
    assert plan.next_round(everyone) == [], "key 1 has no spare left"
    assert plan.statuses() == [OK, DRAINING]
    assert plan.stored_on() == (("a:1", "c:1"), ("a:1",))


def test_a_spare_that_is_down_is_not_chased_further() -> None:
    plan = WritePlan(keys(1), [KeyPlacement((A, B), (A, B), (C, D))], 1)
    answer(plan, plan.next_round(everyone), {("b", 0): DRAINING})
    assert plan.next_round(down("c")) == []
    assert plan.statuses() == [OK] and plan.stored_on() == (("a:1",),)


def test_no_active_owner_fails_unavailable() -> None:
    plan = WritePlan(keys(1), [KeyPlacement((), (A,))], 1)
    assert plan.next_round(everyone) == []
    assert plan.statuses() == [DOWN] and plan.stored_on() == ((),)


def test_most_telling_failure() -> None:
    assert most_telling([DOWN, SLOW, FULL]) is FULL
    assert most_telling([DOWN, SLOW]) is SLOW
    assert most_telling([DRAINING, DOWN]) is DOWN
    assert most_telling([DRAINING]) is DRAINING
    assert most_telling([MISS, CORRUPT]) is MISS, "the first node verdict wins"
    assert most_telling([]) is DOWN
    assert most_telling([99]) is ErrorCode.INTERNAL, "an unknown code is INTERNAL"


# -- reads -------------------------------------------------------------------------------------


def test_get_asks_the_first_reader_then_the_next_for_retryable_answers() -> None:
    orders = [(A, B), (A, B), (B, A), (A, B), (A, B)]
    plan = ReadPlan(keys(5), orders)
    first = plan.next_round(everyone)
    assert by_node(first) == {"a": [0, 1, 3, 4], "b": [2]}
    answer(plan, first, {("a", 1): MISS, ("a", 3): CORRUPT, ("a", 4): ErrorCode.SIZE_MISMATCH})
    second = plan.next_round(everyone)
    assert by_node(second) == {"b": [1, 3]}, "NOT_FOUND and CHECKSUM_MISMATCH retry; SIZE_MISMATCH is final"
    answer(plan, second, {("b", 1): MISS})
    assert plan.next_round(everyone) == []
    assert plan.statuses() == (OK, MISS, OK, OK, ErrorCode.SIZE_MISMATCH)
    assert plan.served_by() == ("a", "", "b", "b", "a")


def test_a_node_known_down_is_skipped_without_a_request() -> None:
    plan = ReadPlan(keys(3), [(A, B, C), (B, C), (A,)])
    jobs = plan.next_round(down("a"))
    assert by_node(jobs) == {"b": [0, 1]}, "key 2 has only a: it settles at once"
    assert plan.settled(2) and plan.statuses()[2] is DOWN
    answer(plan, jobs, {("b", 0): SLOW})
    assert by_node(plan.next_round(down("a"))) == {"c": [0]}
    answer(plan, [Job(C, NS, [0], [keys(1)[0].hash], [None])], {})
    assert plan.statuses() == (OK, OK, DOWN)


def test_a_node_failure_fails_over_every_key_it_had() -> None:
    plan = ReadPlan(keys(4), [(A, B)] * 4)
    answer(plan, plan.next_round(everyone), {("a", i): DOWN for i in range(4)})
    assert by_node(plan.next_round(down("a"))) == {"b": [0, 1, 2, 3]}


def test_lookup_stops_at_the_first_key_missing_everywhere() -> None:
    plan = ReadPlan(keys(6), [(A, B), (B, A), (A, B), (B, A), (A, B, C), (B, A)], prefix=True)
    first = plan.next_round(everyone)
    # Key 2 is missing on a; a's prefix scan reports the keys after it missing too, unasked.
    answer(plan, first, {("a", 2): MISS, ("a", 4): MISS, ("b", 5): MISS})
    second = plan.next_round(everyone)
    assert by_node(second) == {"b": [2, 4], "a": [5]}, by_node(second)
    answer(plan, second, {("b", 2): MISS, ("b", 4): MISS})
    assert plan.next_round(everyone) == [], "key 2 is missing everywhere: key 4 is not asked of c"
    assert plan.statuses() == (OK, OK, MISS, OK, MISS, OK)


def test_lookup_does_not_ask_beyond_a_key_with_no_reachable_reader() -> None:
    plan = ReadPlan(keys(4), [(B,), (A,), (B,), (B,)], prefix=True)
    jobs = plan.next_round(down("a"))
    assert by_node(jobs) == {"b": [0]}, "keys after the unreachable key 1 cannot extend the prefix"
    assert plan.statuses()[1:] == (DOWN, MISS, MISS)


# -- delete fan-out -----------------------------------------------------------------------------


def test_delete_goes_to_every_reachable_reader() -> None:
    orders = [(A, B), (B, C), (C,)]
    jobs = fan_out(keys(3), orders, down("c"))
    assert by_node(jobs) == {"a": [0], "b": [0, 1]}
    tally = DeleteTally(3)
    for job in jobs:
        tally.record(job, [MISS if job.member is A else OK for _ in job.indices])
    assert tally.removed == [True, True, False]
    assert tally.unreached() == [2]
    failed = DeleteTally(1)
    failed.record(Job(A, NS, [0], [b"x"], [None]), None)
    assert failed.unreached() == [0] and failed.removed == [False]
