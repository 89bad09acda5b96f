"""The vLLM connector's scheduler plan, step by step, without vLLM: lookups, loads, saves, held blocks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvpool_client.integrations.vllm.scheduler import ScheduledRequest, SchedulerPlan
from kvpool_client.integrations.vllm.shape import CacheShape, EngineNamespaces

NAMESPACES = CacheShape("m", "bfloat16", "NHD", "mha", 2, 2, 64, 4).namespaces()
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
        self.generations: list[str] = []

    def lookup(self, namespaces: EngineNamespaces, hashes: list[bytes], first: int) -> int:
        self.asked.append(list(hashes))
        self.generations.append(namespaces.generation)
        return next((i for i, h in enumerate(hashes) if h not in self.held), len(hashes))


@pytest.fixture
def pool() -> Pool:
    return Pool()


@pytest.fixture
def plan(pool: Pool) -> Iterator[SchedulerPlan]:
    with ThreadPoolExecutor(1) as executor:
        yield SchedulerPlan(pool.lookup, executor, NAMESPACES, BS)


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
    assert list(load.hashes) == request.block_hashes[2:5] and load.first == 2
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
    def broken(namespaces: EngineNamespaces, hashes: list[bytes], first: int) -> int:
        raise ConnectionError("pool down")

    with ThreadPoolExecutor(1) as executor:
        plan = SchedulerPlan(broken, executor, NAMESPACES, BS)
        assert answer(plan, Request("a", 3)) == (0, False)


def test_blocks_in_vllms_local_cache_are_not_saved_again(plan: SchedulerPlan, pool: Pool) -> None:
    request = Request("a", 3, tail=1)  # vLLM's local prefix cache holds all 3 full blocks
    assert plan.matched_tokens(request, 3 * BS) == (0, False), "nothing left to look up"
    assert pool.asked == []
    plan.after_alloc(request, [1, 2, 3, 4], 0)
    step = plan.build([ScheduledRequest("a", 3 * BS, 1, (1, 2, 3, 4), True)], [])
    assert step.saves == [], "blocks vLLM had cached were stored when they were computed"
    request.block_hashes.append(b"a-3")  # decode completes block 3
    step = plan.build([ScheduledRequest("a", 4 * BS, 1, (), False)], [])
    assert [(j.first, j.block_ids) for j in step.saves] == [(3, (4,))], "only the new block is saved"


def test_a_request_finished_while_its_load_runs_is_left_to_vllm(plan: SchedulerPlan, pool: Pool) -> None:
    request = Request("a", 4)
    assert answer(plan, request) == (0, False)
    plan.after_alloc(request, [1, 2, 3, 4, 5], 0)
    computed = plan.build([ScheduledRequest("a", 0, 4 * BS + 1, (1, 2, 3, 4, 5), True)], [])
    assert len(computed.saves) == 1, "its prompt's blocks are saved"
    plan.build([], ["a"])  # preempted: its blocks are freed once the saves end
    pool.held = set(request.block_hashes)  # ... and resumed from the pool
    assert answer(plan, request) == (4 * BS, True)
    plan.after_alloc(request, [6, 7, 8, 9, 10], 4 * BS)
    (load,) = plan.build([], []).loads
    assert plan.finished(request, [6, 7, 8, 9, 10]) is False, "vLLM holds the blocks until the load reports"
    step = plan.build([], [])
    assert step.saves == [] and step.finishing == frozenset(), "no save of, and no claim on, blocks being loaded"
    plan.worker_output(["a"], [load.block_ids[0]])
    again = Request("b", 4)
    again.block_hashes = request.block_hashes
    assert answer(plan, again) == (0, False), "the aborted load's report still marks what failed to arrive"


def test_a_reset_plans_new_work_in_a_new_generation_and_keeps_planned_jobs(plan: SchedulerPlan, pool: Pool) -> None:
    request = Request("a", 3)
    assert answer(plan, request) == (0, False)
    plan.after_alloc(request, [1, 2, 3, 4], 0)
    before = plan.build([ScheduledRequest("a", 0, 3 * BS + 1, (1, 2, 3, 4), True)], [])
    plan.reset()
    other = Request("b", 3)
    pool.held = set(other.block_hashes)
    assert answer(plan, other) == (3 * BS, True)
    plan.after_alloc(other, [5, 6, 7, 8], 3 * BS)
    after = plan.build([], [])
    (save,), (load,) = before.saves, after.loads
    assert save.namespaces == NAMESPACES, "a job planned before the reset keeps its generation"
    assert load.namespaces != NAMESPACES and pool.generations[-1] == load.namespaces.generation != ""
    assert load.namespaces.of(0, 0) != NAMESPACES.of(0, 0)


def test_every_rank_that_writes_blocks_has_its_own_namespace() -> None:
    mha = CacheShape("Qwen/Qwen2.5-0.5B", "bfloat16", "NHD", "mha", 24, 2, 64, 16, tp_size=2, pp_size=2).namespaces()
    assert len(set(mha.writers())) == 4
    assert mha.of(1, 0).id == "Qwen--Qwen2.5-0.5B@bf16@vllm-NHD-mha-L24-H2-D64-T16-pp0of2@tp1of2"
    mla = CacheShape("ds", "bfloat16", "NHD", "mla", 4, 1, 576, 16, tp_size=2).namespaces()
    assert mla.of(0, 0) == mla.of(1, 0), "MLA's latent cache is the same on every TP rank"
    assert mla.writers() == [mla.of(0, 0).id] and not mla.writes(1)


def test_the_weights_are_in_the_namespace() -> None:
    def space(**fields: object) -> str:
        args = {"model": "org/m", "dtype": "bfloat16", "layout": "NHD", "kind": "mha"} | fields
        return CacheShape(**args, layers=2, kv_heads=2, head_size=64, block_size=16).namespaces().of(0, 0).id  # type: ignore[arg-type]

    ids = {space(), space(revision="v2"), space(quantization="fp8")}
    ids |= {space(model="/ckpt/run42/hf"), space(model="/ckpt/run43/hf")}
    assert len(ids) == 5, ids
