"""The vLLM connector's scheduler plan, step by step, without vLLM: lookups, loads, saves, held blocks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvpool_client.core.keys import BlockKey, Namespace
from kvpool_client.integrations.vllm.scheduler import ScheduledRequest, SchedulerPlan

NS = Namespace("m", "bf16", "vllm-test")
BS = 4


class Request:
    """The attributes the plan reads of vLLM's Request."""

    def __init__(self, req_id: str, blocks: int, tail: int = 1) -> None:
        self.request_id = req_id
        self.block_hashes = [f"{req_id}-{i}".encode() for i in range(blocks)]
        self.num_tokens = blocks * BS + tail
        self.num_computed_tokens = 0


class Pool:
    """The lookup the plan calls: the keys it holds, and what it was asked."""

    def __init__(self) -> None:
        self.held: set[bytes] = set()
        self.asked: list[list[bytes]] = []

    def lookup(self, keys: list[BlockKey]) -> int:
        self.asked.append([k.hash for k in keys])
        return next((i for i, k in enumerate(keys) if k.hash not in self.held), len(keys))


@pytest.fixture
def pool() -> Pool:
    return Pool()


@pytest.fixture
def plan(pool: Pool) -> Iterator[SchedulerPlan]:
    with ThreadPoolExecutor(1) as executor:
        yield SchedulerPlan(pool.lookup, executor, NS, BS)


def answer(plan: SchedulerPlan, request: Request, computed: int = 0) -> tuple[int | None, bool]:
    """Ask until the lookup thread has answered (vLLM asks again each step)."""
    first = plan.matched_tokens(request, computed)
    assert first == (None, False), f"the first ask must not wait for the pool: {first}"
    deadline = time.monotonic() + 10
    while (result := plan.matched_tokens(request, computed))[0] is None:
        assert time.monotonic() < deadline, "the lookup never answered"
        time.sleep(0.001)
    return result


def test_a_hit_is_an_asynchronous_load_into_the_blocks_after_the_local_ones(plan: SchedulerPlan, pool: Pool) -> None:
    request = Request("a", 6)
    pool.held = set(request.block_hashes[:5])
    assert answer(plan, request, computed=2 * BS) == (3 * BS, True), "blocks 2..4 after two local ones"
    assert pool.asked == [request.block_hashes[2:6]], "asks only past the local prefix, up to the last full block"
    plan.after_alloc(request, [10, 11, 12, 13, 14, 15, 16], 3 * BS)
    step = plan.build([], [])
    (load,) = step.loads
    assert load.block_ids == (12, 13, 14)
    assert [k.hash for k in load.keys] == request.block_hashes[2:5]
    assert [k.depth for k in load.keys] == [2, 3, 4]
    assert not step.saves and plan.build([], []).loads == [], "a load is planned once"


def test_the_last_token_is_never_matched(plan: SchedulerPlan, pool: Pool) -> None:
    request = Request("a", 4, tail=0)  # block-aligned: the last block holds the last token
    pool.held = set(request.block_hashes)
    assert answer(plan, request) == (3 * BS, True)


def test_a_miss_loads_nothing_and_every_computed_block_is_saved_once(plan: SchedulerPlan) -> None:
    request = Request("a", 2, tail=3)  # 11 prompt tokens
    assert answer(plan, request) == (0, False)
    plan.after_alloc(request, [7, 8, 9], 0)
    first = plan.build([ScheduledRequest("a", 0, 6, (7, 8, 9), True)], [])
    assert [(j.req_id, j.block_ids) for j in first.saves] == [("a", (7,))], "one block is full after 6 tokens"
    second = plan.build([ScheduledRequest("a", 6, 5, (), False)], [])
    assert [j.block_ids for j in second.saves] == [(8,)]
    # The 12th token is sampled: its block now has a hash, but its last token has no KV.
    request.block_hashes.append(b"a-2")
    request.num_computed_tokens = 11
    assert plan.finished(request, [7, 8, 9]) is True, "its saves may be running: hold its blocks"
    last = plan.build([], [])
    assert last.saves == [], "a block whose KV is not all computed is never saved"
    assert last.finishing == frozenset({"a"})


def test_blocks_the_pool_has_are_not_saved_again(plan: SchedulerPlan, pool: Pool) -> None:
    request = Request("a", 4)
    pool.held = set(request.block_hashes[:2])
    assert answer(plan, request) == (2 * BS, True)
    plan.after_alloc(request, [1, 2, 3, 4, 5], 2 * BS)
    step = plan.build([ScheduledRequest("a", 2 * BS, 2 * BS + 1, (1, 2, 3, 4, 5), True)], [])
    assert [j.block_ids for j in step.saves] == [(3, 4)]


def test_a_request_without_saves_frees_its_blocks_at_once(plan: SchedulerPlan, pool: Pool) -> None:
    request = Request("a", 1, tail=0)  # nothing to match, nothing full to save before it ends
    assert plan.matched_tokens(request, 0) == (0, False)
    plan.after_alloc(request, [3], 0)
    assert plan.finished(request, []) is False
    assert plan.build([], []).finishing == frozenset()


def test_keys_that_failed_to_load_are_not_offered_again(plan: SchedulerPlan, pool: Pool) -> None:
    request = Request("a", 5)
    pool.held = set(request.block_hashes)
    assert answer(plan, request) == (5 * BS, True)
    plan.after_alloc(request, [1, 2, 3, 4, 5, 6], 5 * BS)
    (load,) = plan.build([], []).loads
    assert load.block_ids == (1, 2, 3, 4, 5)
    plan.worker_output(["a"], [3])  # block 2 (vLLM block 3) did not arrive
    again = Request("b", 5)
    again.block_hashes = request.block_hashes
    assert answer(plan, again) == (2 * BS, True), "the lookup stops before the key that failed"


def test_preempted_requests_reach_the_worker(plan: SchedulerPlan) -> None:
    assert plan.build([], ["x", "y"]).preempted == frozenset({"x", "y"})


def test_a_failing_pool_is_a_miss(pool: Pool) -> None:
    def broken(keys: list[BlockKey]) -> int:
        raise ConnectionError("pool down")

    with ThreadPoolExecutor(1) as executor:
        plan = SchedulerPlan(broken, executor, NS, BS)
        assert answer(plan, Request("a", 3)) == (0, False)
