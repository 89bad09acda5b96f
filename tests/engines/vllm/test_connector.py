"""KVPoolConnector inside vLLM's real Scheduler and model-runner connector code, against real daemons.

Two engines share nothing but the pool: what engine A computed and saved, engine B (fresh
KV cache, empty local prefix cache) loads instead of computing, byte for byte. Each
scheduler path vLLM takes (preemption, abort during a load, speculative decoding's deferred
finalize, several tensor-parallel workers, a reset after a weight update) ends with every
block back in vLLM's free queue.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.v1.request import RequestStatus

from bench.vllm.harness import Engine, attention_spec, block_bytes, model_dir, vllm_config
from kvpool_client import BlockKey, KVPoolClient
from kvpool_client.core.errors import UsageError
from tests.engines.vllm.doc_configs import connector_config
from tests.support.daemon import DaemonProcess

BLOCK = 16
PROMPT = list(range(1000, 1100))  # 6 full blocks and 4 tokens


@pytest.fixture
def engines(tmp_path: Path) -> Any:
    """Build engines from a kv-transfer config; all are closed at the end, none holding a block."""
    made: list[Engine] = []

    def make(
        kv_transfer: dict[str, Any],
        layout: str = "LBNHC",
        mla: bool = False,
        blocks: int = 64,
        tp_size: int = 1,
        model: Path | None = None,
        defer_finalize: bool = False,
    ) -> Engine:
        spec = attention_spec(BLOCK, head_size=576 if mla else 64, mla=mla)
        config = vllm_config(model or model_dir(tmp_path), kv_transfer, BLOCK, layout, tp_size)
        engine = Engine(config, spec, num_blocks=blocks, defer_finalize=defer_finalize)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def no_block_held(engine: Engine) -> None:
    """Every block is back in vLLM's free queue (all but its null block)."""
    engine.run(engine.idle)
    total = engine.kv_cache_config.num_blocks
    assert engine.free_blocks() == total - 1, f"{total - 1 - engine.free_blocks()} blocks leaked"


def pool_counter(daemon: DaemonProcess, name: str) -> int:
    with KVPoolClient([daemon.address]) as pool:
        return int(pool.stats(daemon.address).counters[name])


def compute(engine: Engine, req_id: str, tokens: list[int], max_tokens: int = 1) -> None:
    """Run one request to its end, saves included (its blocks are freed only after them)."""
    engine.add(req_id, tokens, max_tokens)
    engine.run(engine.idle)


def first_schedule(
    engine: Engine,
    req_id: str,
    tokens: list[int] | None = None,
    after_forward: Callable[[Any], None] | None = None,
) -> tuple[int, int]:
    """Add a request (unless ``tokens`` is None: added already) and step until it is first
    computed: (tokens it starts from, tokens computed)."""
    request = engine.add(req_id, tokens) if tokens is not None else engine.scheduler.requests[req_id]
    seen: list[tuple[int, int]] = []

    def started() -> bool:
        return bool(seen)

    def hook(output: Any) -> None:
        for new in output.scheduled_new_reqs:
            if new.req_id == req_id:
                seen.append((new.num_computed_tokens, output.num_scheduled_tokens[req_id]))
        if after_forward is not None:
            after_forward(output)

    engine.run(started, after_forward=hook)
    assert seen, f"{req_id} never scheduled: {request.status}"
    return seen[0]


@pytest.mark.parametrize(
    ("layout", "mla"),
    [("LBNHC", False), ("BLHNC", False), ("LBNHC", True)],
    ids=["layer-major", "block-major-zero-copy", "mla"],
)
def test_a_shared_prefix_is_loaded_byte_exact_and_only_new_tokens_computed(
    daemon: DaemonProcess, engines: Callable[..., Engine], layout: str, mla: bool
) -> None:
    config = connector_config(daemon.address)
    a = engines(config, layout, mla)
    assert a.layers.direct == (layout == "BLHNC"), "block-major caches are read and written in place"
    compute(a, "A", PROMPT)

    b = engines(config, layout, mla)
    prompt_b = PROMPT[:96] + list(range(5000, 5040))
    start, computed = first_schedule(b, "B", prompt_b)
    assert (start, computed) == (96, len(prompt_b) - 96), "B computes only what the pool did not hold"
    request = b.scheduler.requests["B"]
    ids = b.block_ids("B")
    for index in range(6):
        got = b.read_block(ids[index])
        want = block_bytes(request.block_hashes[index], b.layers.block_nbytes)
        assert torch.equal(got, want), f"block {index} (vLLM block {ids[index]}) differs from what A saved"
    assert "B" in b.loaded and not b.load_errors


def test_a_load_from_a_killed_daemon_reports_its_blocks_and_they_are_recomputed(
    daemon: DaemonProcess, engines: Callable[..., Engine]
) -> None:
    config = connector_config(daemon.address)
    compute(engines(config), "A", PROMPT)
    c = engines(config)
    before: dict[int, torch.Tensor] = {}

    def kill_before_the_load(output: Any) -> None:
        plan = output.kv_connector_metadata.plan
        if plan.loads and daemon.process.poll() is None:
            for block_id in plan.loads[0].block_ids:
                before[block_id] = c.read_block(block_id)
            daemon.process.send_signal(signal.SIGKILL)
            daemon.process.wait(10)

    request = c.add("C", PROMPT)
    c.run(lambda: bool(before), after_forward=kill_before_the_load)
    c.run(lambda: "C" in c.loaded)
    assert c.load_errors == set(before), f"reported {c.load_errors}, the load was into {sorted(before)}"
    for block_id, bytes_before in before.items():
        assert torch.equal(c.read_block(block_id), bytes_before), f"a failed load wrote into block {block_id}"
    c.run(c.idle)
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    ids = c.computed["C"]
    assert sorted(ids[:6]) == sorted(before), "vLLM recomputes exactly the blocks that failed to load"
    for index, block_id in enumerate(ids[:6]):
        assert torch.equal(c.read_block(block_id), block_bytes(request.block_hashes[index], c.layers.block_nbytes))


def test_a_block_of_the_wrong_size_is_a_miss_never_a_load(
    daemon: DaemonProcess, engines: Callable[..., Engine]
) -> None:
    config = connector_config(daemon.address)
    d = engines(config)
    namespace = d.connector._plan.namespaces.of(0, 0).id  # what the engine's keys are in
    request = d.add("D", PROMPT)
    with KVPoolClient([daemon.address]) as pool:  # a foreign writer puts 1 KiB under D's first block
        assert pool.put([BlockKey(namespace, bytes(request.block_hashes[0]))], [bytes(1024)]).stored == 1
    d.run(d.idle)
    assert d.load_errors, "the lookup saw the block, the load must refuse it"
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    first = d.computed["D"][0]
    assert torch.equal(d.read_block(first), block_bytes(request.block_hashes[0], d.layers.block_nbytes))


def test_another_model_never_sees_the_blocks(daemon: DaemonProcess, engines: Callable[..., Engine]) -> None:
    config = connector_config(daemon.address)
    compute(engines(config), "A", PROMPT)
    other = dict(config, kv_connector_extra_config={**config["kv_connector_extra_config"], "model_id": "other"})
    assert first_schedule(engines(other), "E", PROMPT) == (0, len(PROMPT))


def test_a_pool_down_at_start_only_costs_hits(engines: Callable[..., Engine]) -> None:
    config = connector_config("127.0.0.1:9")  # nothing listens on the discard port
    e = engines(config)
    assert first_schedule(e, "F", PROMPT) == (0, len(PROMPT))
    e.run(e.idle)


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"nodez": "127.0.0.1:1"}, "'nodes'"),
        ({}, "kv_connector_extra_config"),
        ({"nodes": "127.0.0.1:1", "lookup_threads": 0}, "lookup_threads"),
    ],
)
def test_a_wrong_pool_configuration_stops_vllm_at_start_naming_the_setting(
    engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], names: str
) -> None:
    monkeypatch.delenv("KVPOOL_NODES", raising=False)
    monkeypatch.delenv("KVPOOL_ETCD_ENDPOINTS", raising=False)
    config = connector_config("unused")
    config["kv_connector_extra_config"] = extra
    with pytest.raises(UsageError, match=re.escape(names)):
        engines(config)


def test_a_finished_request_frees_its_blocks_under_speculative_decodings_call_order(
    daemon: DaemonProcess, engines: Callable[..., Engine]
) -> None:
    """With speculative decoding vLLM's model runner calls get_finished before wait_for_save."""
    a = engines(connector_config(daemon.address), defer_finalize=True)
    compute(a, "A", PROMPT, max_tokens=3)
    no_block_held(a)
    b = engines(connector_config(daemon.address))
    assert first_schedule(b, "B", PROMPT)[0] == 96, "the saves ran"


def test_an_abort_while_a_load_runs_holds_the_blocks_until_the_load_ends(
    daemon: DaemonProcess, engines: Callable[..., Engine]
) -> None:
    config = connector_config(daemon.address)
    # The load waits on a stopped daemon: over TCP (a same-node read of the arena would not).
    config["kv_connector_extra_config"].update(transport="tcp", request_timeout_s=60)
    a = engines(config)
    request = a.add("R", PROMPT, max_tokens=50)
    a.run(lambda: len(a.computed.get("R", ())) >= 6)  # its prompt is computed, its blocks are being saved
    with KVPoolClient([daemon.address]) as pool:
        a.run(lambda: pool.stats(daemon.address).tiers[0].blocks == 6)  # ... and saved
    assert a.scheduler.reset_prefix_cache(reset_running_requests=True), "R is preempted, the local cache emptied"
    stopped: list[bool] = []

    def stop_the_daemon_before_the_load(output: Any) -> None:
        if output.kv_connector_metadata.plan.loads and not stopped:
            daemon.process.send_signal(signal.SIGSTOP)  # the resumed request's load now hangs
            stopped.append(True)

    try:
        a.run(lambda: bool(stopped), after_forward=stop_the_daemon_before_the_load)
        assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        held = a.kv_cache_config.num_blocks - 1 - a.free_blocks()
        a.scheduler.finish_requests("R", RequestStatus.FINISHED_ABORTED)
        for _ in range(20):
            a.step()
        assert a.kv_cache_config.num_blocks - 1 - a.free_blocks() == held, "blocks freed under a running load"
        assert "R" in a.scheduler.requests
    finally:
        daemon.process.send_signal(signal.SIGCONT)
    no_block_held(a)


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"], ids=["layer-major", "block-major-zero-copy"])
def test_every_tensor_parallel_rank_saves_and_loads_its_own_shard(
    daemon: DaemonProcess, engines: Callable[..., Engine], layout: str
) -> None:
    config = connector_config(daemon.address)
    compute(engines(config, layout, tp_size=2), "A", PROMPT)
    b = engines(config, layout, tp_size=2)
    b.add("B", PROMPT, max_tokens=20)  # still running when first scheduled
    assert first_schedule(b, "B")[0] == 96
    request, ids = b.scheduler.requests["B"], b.block_ids("B")
    for rank in (0, 1):
        for index in range(6):
            want = block_bytes(request.block_hashes[index], b.rank_layers[rank].block_nbytes, rank)
            assert torch.equal(b.read_block(ids[index], rank), want), f"rank {rank} block {index} is not its shard"
    no_block_held(b)


def test_a_block_one_rank_lacks_is_not_offered(daemon: DaemonProcess, engines: Callable[..., Engine]) -> None:
    config = connector_config(daemon.address)
    compute(engines(config, tp_size=2), "A", PROMPT)
    b = engines(config, tp_size=2)
    request = b.add("B", PROMPT)
    rank1 = b.connector._plan.namespaces.of(1, 0).id
    with KVPoolClient([daemon.address]) as pool:  # rank 1's copy of block 3 is evicted
        assert pool.delete([BlockKey(rank1, bytes(request.block_hashes[3]))]) == [True]
    start, _ = first_schedule(b, "B")
    assert start == 3 * BLOCK, "blocks 0..2 come from the pool, block 3 on is computed"
    no_block_held(b)
    assert not b.load_errors, "no rank failed a load"


def test_after_a_reset_of_the_connector_the_engine_never_loads_blocks_stored_before(
    daemon: DaemonProcess, engines: Callable[..., Engine]
) -> None:
    """An RL weight update: vLLM resets the prefix cache and the connector's."""
    config = connector_config(daemon.address)
    a = engines(config)
    compute(a, "A", PROMPT)
    assert a.scheduler.reset_prefix_cache(reset_connector=True)
    assert first_schedule(a, "A2", PROMPT) == (0, len(PROMPT)), "KV of the old weights was loaded"
    no_block_held(a)
    assert first_schedule(engines(config), "B", PROMPT)[0] == 96, "an engine on the old weights still shares"


def test_checkpoints_in_folders_of_one_name_never_share_blocks(
    daemon: DaemonProcess, engines: Callable[..., Engine], tmp_path: Path
) -> None:
    config = connector_config(daemon.address)
    compute(engines(config, model=model_dir(tmp_path / "run42", "hf")), "A", PROMPT)
    assert first_schedule(engines(config, model=model_dir(tmp_path / "run43", "hf")), "B", PROMPT) == (0, len(PROMPT))
    assert first_schedule(engines(config, model=model_dir(tmp_path / "run42", "hf")), "C", PROMPT)[0] == 96


def test_a_prefix_vllm_holds_is_not_put_again(daemon: DaemonProcess, engines: Callable[..., Engine]) -> None:
    a = engines(connector_config(daemon.address))
    compute(a, "A", PROMPT)  # 6 blocks computed and saved
    compute(a, "A2", PROMPT[:96] + list(range(7000, 7030)), max_tokens=20)  # local hits, then decode fills more
    with KVPoolClient([daemon.address]) as pool:
        stats = pool.stats(daemon.address)
    assert stats.counters["puts_duplicate"] == 0, "blocks vLLM already held were put again"
    assert stats.tiers[0].blocks == 6 + 3, "A's 6 blocks, then A2's 3 new full blocks"


@pytest.mark.parametrize(
    ("parallel", "names"),
    [({"decode_context_parallel_size": 2, "tensor_parallel_size": 2}, "decode_context_parallel_size")],
)
def test_context_parallelism_is_refused_at_start(
    engines: Callable[..., Engine], parallel: dict[str, int], names: str, tmp_path: Path
) -> None:
    config = vllm_config(model_dir(tmp_path), connector_config("127.0.0.1:1"), BLOCK)
    for key, value in parallel.items():
        setattr(config.parallel_config, key, value)
    with pytest.raises(UsageError, match=names):
        Engine(config, attention_spec(BLOCK))


def test_failing_requests_on_a_load_error_is_refused_at_start(engines: Callable[..., Engine]) -> None:
    config = connector_config("127.0.0.1:1")
    del config["kv_load_failure_policy"]  # vLLM's default: "fail"
    with pytest.raises(UsageError, match="kv_load_failure_policy"):
        engines(config)
