"""KVPoolConnector inside a real vLLM engine (vLLM's CPU build) that computes real attention.

Every case compares greedy tokens and their top-5 logprobs, bit for bit, with an engine that
ran without the pool: KV loaded from the pool must be the KV the engine would have computed.
Each case ends with the engine holding no KV block (a leaked block is a request vLLM keeps for
a transfer the connector never reports). Daemons are real processes; the engine runs in this
process so a case can step it, stop its daemon mid-load, or abort a request.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.vllm import cpu_engine as ce
from kvpool_client import KVPoolClient
from tests.support.daemon import DaemonProcess

BLOCK = ce.BLOCK_SIZE
SYSTEM = list(range(100, 100 + 9 * BLOCK))  # a 288-token "system prompt": 9 full blocks
PROMPT = SYSTEM + list(range(600, 640))  # 10 full blocks and 8 tokens


def tail(seed: int, length: int = 40) -> list[int]:
    """``length`` token ids of their own (the model's vocabulary is 1000 tokens)."""
    generator = random.Random(seed)
    return [generator.randrange(3, 1000) for _ in range(length)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ce.model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def engines() -> Iterator[Callable[..., Any]]:
    """Start engines one at a time (starting one stops the one before); the last is stopped at the end."""
    running: list[Any] = []

    def start(model: Path, kv_transfer: dict[str, Any] | None = None, **engine: Any) -> Any:
        while running:
            ce.stop(running.pop())
        running.append(ce.start(model, kv_transfer, **engine))
        return running[-1]

    yield start
    while running:
        ce.stop(running.pop())


def reference(engines: Callable[..., Any], model: Path, prompts: list[list[int]], **engine: Any) -> list[ce.Completion]:
    """What an engine without the pool makes of ``prompts``."""
    return ce.generate(engines(model, **engine), prompts)


def store(engines: Callable[..., Any], model: Path, daemon: DaemonProcess, prompts: list[list[int]]) -> None:
    """An engine with the pool computes ``prompts``; its saves end before it stops."""
    llm = engines(model, ce.pool_config(daemon.address))
    ce.generate(llm, prompts)
    ce.drain(llm)


def counters(daemon: DaemonProcess) -> Any:
    with KVPoolClient([daemon.address]) as pool:
        return pool.stats(daemon.address)


def no_block_held(llm: Any) -> None:
    ce.drain(llm)
    assert ce.blocks_held(llm) == 0, f"{ce.blocks_held(llm)} KV blocks leaked"


def loaded(result: ce.Completion, blocks: int) -> None:
    assert result.cached_tokens == blocks * BLOCK, f"{result.cached_tokens} tokens not computed, want {blocks} blocks"


def test_a_fresh_engine_loads_a_stored_prefix_and_computes_only_the_rest(
    engines: Callable[..., Any], model: Path, daemon: DaemonProcess
) -> None:
    prompt = SYSTEM + tail(700)
    (want,) = reference(engines, model, [prompt])
    store(engines, model, daemon, [PROMPT])
    llm = engines(model, ce.pool_config(daemon.address))
    (got,) = ce.generate(llm, [prompt])
    loaded(got, 9)
    assert got.tokens == want.tokens and got.logprobs == want.logprobs, "KV from the pool is not what vLLM computes"
    no_block_held(llm)


def test_prompts_that_share_parts_of_stored_prefixes_load_exactly_those(
    engines: Callable[..., Any], model: Path, daemon: DaemonProcess
) -> None:
    other = tail(3000, 5 * BLOCK + 10)
    prompts = [SYSTEM[: 3 * BLOCK] + tail(800), SYSTEM + tail(900), other[: 2 * BLOCK] + tail(1000), tail(4000)]
    want = reference(engines, model, prompts)
    store(engines, model, daemon, [PROMPT, other])
    llm = engines(model, ce.pool_config(daemon.address))
    got = ce.generate(llm, prompts)
    assert [g.cached_tokens // BLOCK for g in got] == [3, 9, 2, 0]
    assert [(g.tokens, g.logprobs) for g in got] == [(w.tokens, w.logprobs) for w in want]
    no_block_held(llm)


def test_requests_preempted_under_a_small_kv_cache_match(
    engines: Callable[..., Any], model: Path, daemon: DaemonProcess
) -> None:
    prompts = [tail(1100 + i, 7 * BLOCK + 8) for i in range(4)]  # 4 x 7 blocks, nothing shared
    params = ce.greedy(64)
    want = ce.generate(engines(model), prompts, params)
    tiny = {"num_gpu_blocks_override": 20, "max_model_len": 512, "max_num_seqs": 4, "disable_log_stats": False}
    llm = engines(model, ce.pool_config(daemon.address), **tiny)
    got = ce.generate(llm, prompts, params)
    assert [(g.tokens, g.logprobs) for g in got] == [(w.tokens, w.logprobs) for w in want]
    preempted = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    assert preempted > 0, "the cache was big enough: nothing was preempted"
    no_block_held(llm)


def test_requests_preempted_with_vllms_cache_emptied_resume_from_the_pool(
    engines: Callable[..., Any], model: Path, daemon: DaemonProcess
) -> None:
    prompts = [tail(1200 + i, 6 * BLOCK + 8) for i in range(3)]
    params = ce.greedy(48)
    want = ce.generate(engines(model), prompts, params)
    llm = engines(model, ce.pool_config(daemon.address))
    for index, prompt in enumerate(prompts):
        llm.llm_engine.add_request(f"P{index}", {"prompt_token_ids": prompt}, params)
    ce.step_until(llm, lambda: counters(daemon).tiers[0].blocks >= 18)  # every prompt computed and saved
    assert llm.reset_prefix_cache(reset_running_requests=True), "every request preempted, vLLM's cache emptied"
    outputs = ce.step_until(llm, lambda: not ce.scheduler(llm).has_requests())
    got = {o.request_id: ce.completion(o) for o in outputs if o.finished}
    assert [(g.tokens, g.logprobs) for g in (got[f"P{i}"] for i in range(3))] == [(w.tokens, w.logprobs) for w in want]
    assert ce.worker_connector().client.counters().get_hits >= 18, "the preempted requests did not load their prompts"
    assert ce.blocks_held(llm) == 0


def test_an_abort_while_a_resumed_requests_load_runs_keeps_the_engine_alive_and_its_kv_right(
    engines: Callable[..., Any], model: Path, daemon: DaemonProcess
) -> None:
    after = SYSTEM + tail(1500)
    (want,) = reference(engines, model, [after])
    # Over TCP, so that stopping the daemon stops the load (a same-node read needs no daemon).
    llm = engines(model, ce.pool_config(daemon.address, transport="tcp", request_timeout_s=60))
    llm.llm_engine.add_request("R", {"prompt_token_ids": PROMPT}, ce.greedy(400))
    ce.step_until(llm, lambda: counters(daemon).tiers[0].blocks >= 10)  # R's prompt blocks are saved
    assert llm.reset_prefix_cache(reset_running_requests=True), "R is preempted, vLLM's own cache emptied"
    (rid,) = ce.scheduler(llm).requests
    plan = ce.scheduler(llm).connector._plan
    ce.step_until(llm, lambda: rid in plan._lookups and plan._lookups[rid].answer.done())  # resumed: pool hit
    daemon.process.send_signal(signal.SIGSTOP)
    try:
        ce.step_until(llm, lambda: ce.scheduler(llm).requests[rid].status.name == "WAITING_FOR_REMOTE_KVS")
        held = ce.blocks_held(llm)
        llm.llm_engine.abort_request(["R"])
        for _ in range(20):
            llm.llm_engine.step()
        assert ce.blocks_held(llm) == held, "blocks were freed while the load still writes them"
    finally:
        daemon.process.send_signal(signal.SIGCONT)
    no_block_held(llm)
    (got,) = ce.generate(llm, [after])
    assert got.tokens == want.tokens and got.logprobs == want.logprobs


def test_a_daemon_killed_mid_load_costs_a_recompute_and_nothing_else(
    engines: Callable[..., Any], model: Path, daemon: DaemonProcess
) -> None:
    (want,) = reference(engines, model, [PROMPT])
    store(engines, model, daemon, [PROMPT])
    llm = engines(model, ce.pool_config(daemon.address, transport="tcp"))
    llm.llm_engine.add_request("K", {"prompt_token_ids": PROMPT}, ce.greedy())
    (rid,) = ce.scheduler(llm).requests
    plan = ce.scheduler(llm).connector._plan
    ce.step_until(llm, lambda: rid in plan._lookups and plan._lookups[rid].answer.done())  # a hit: the load is next
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(10)
    outputs = ce.step_until(llm, lambda: not ce.scheduler(llm).has_requests(), timeout_s=60)
    (got,) = [ce.completion(o) for o in outputs if o.finished]
    assert got.tokens == want.tokens and got.logprobs == want.logprobs
    assert ce.blocks_held(llm) == 0


def test_speculative_decoding_leaks_no_block(model: Path, daemon: DaemonProcess) -> None:
    """ngram proposals: vLLM's model runner calls get_finished before wait_for_save. (Each engine runs
    in a child process: after one with ngram, vLLM 0.32 cannot start another in the same process.)"""
    ngram = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}}
    prompts = [SYSTEM + tail(1700, 60), SYSTEM + (tail(1800, 8) * 6)]  # the second repeats: ngram proposes
    want, _ = ce.generate_apart(model, prompts, 40, **ngram)
    _, stored_held = ce.generate_apart(model, [PROMPT], 8, ce.pool_config(daemon.address), **ngram)
    got, held = ce.generate_apart(model, prompts, 40, ce.pool_config(daemon.address), **ngram)
    assert (stored_held, held) == (0, 0), "blocks of finished requests were never given back"
    assert [g.cached_tokens // BLOCK for g in got] == [9, 9]
    assert [(g.tokens, g.logprobs) for g in got] == [(w.tokens, w.logprobs) for w in want]


def test_checkpoints_in_folders_of_one_name_share_no_blocks(
    engines: Callable[..., Any], tmp_path: Path, daemon: DaemonProcess
) -> None:
    run42, run43 = ce.model_dir(tmp_path / "run42", name="hf"), ce.model_dir(tmp_path / "run43", name="hf")
    store(engines, run42, daemon, [PROMPT])
    (other,) = ce.generate(engines(run43, ce.pool_config(daemon.address)), [PROMPT])
    (same,) = ce.generate(engines(run42, ce.pool_config(daemon.address)), [PROMPT])
    loaded(other, 0)
    loaded(same, 10)


def test_after_a_reset_of_the_connector_no_block_stored_before_is_loaded(
    engines: Callable[..., Any], model: Path, daemon: DaemonProcess
) -> None:
    """An RL weight update: vLLM resets its prefix cache and the connector's."""
    store(engines, model, daemon, [PROMPT])
    llm = engines(model, ce.pool_config(daemon.address))
    assert llm.reset_prefix_cache(reset_connector=True)
    (got,) = ce.generate(llm, [PROMPT])
    loaded(got, 0)
    no_block_held(llm)


def test_a_prefix_vllm_holds_is_not_put_again(engines: Callable[..., Any], model: Path, daemon: DaemonProcess) -> None:
    llm = engines(model, ce.pool_config(daemon.address))
    ce.generate(llm, [PROMPT])
    ce.generate(llm, [PROMPT + tail(2000, 20)], ce.greedy(40))  # local hits, then decode fills 2 more blocks
    no_block_held(llm)
    stats = counters(daemon)
    assert stats.counters["puts_duplicate"] == 0, "blocks vLLM already held were put again"
    assert stats.tiers[0].blocks == 10 + 2
