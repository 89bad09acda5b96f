"""KVPoolConnector inside vLLM's real Scheduler and model-runner connector code, against real daemons.

Two engines share nothing but the pool: what engine A computed and saved, engine B (fresh
KV cache, empty local prefix cache) loads instead of computing, byte for byte.
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
from kvpool_client.integrations.vllm.shape import CacheShape
from tests.engines.vllm.doc_configs import connector_config
from tests.support.daemon import DaemonProcess

BLOCK = 16
PROMPT = list(range(1000, 1100))  # 6 full blocks and 4 tokens


@pytest.fixture
def engines(tmp_path: Path) -> Any:
    """Build engines from a kv-transfer config; all are closed at the end."""
    made: list[Engine] = []

    def make(kv_transfer: dict[str, Any], layout: str = "LBNHC", mla: bool = False, blocks: int = 64) -> Engine:
        spec = attention_spec(BLOCK, head_size=576 if mla else 64, mla=mla)
        engine = Engine(vllm_config(model_dir(tmp_path), kv_transfer, BLOCK, layout), spec, num_blocks=blocks)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def compute(engine: Engine, req_id: str, tokens: list[int]) -> None:
    """Run one request to its end, saves included (its blocks are freed only after them)."""
    engine.add(req_id, tokens)
    engine.run(engine.idle)


def first_schedule(
    engine: Engine, req_id: str, tokens: list[int], after_forward: Callable[[Any], None] | None = None
) -> tuple[int, int]:
    """Add a request and step until it is first computed: (tokens it starts from, tokens computed)."""
    request = engine.add(req_id, tokens)
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
    namespace = d.connector._plan._namespace  # what the engine's keys are in
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


def test_ranks_and_models_have_their_own_namespaces() -> None:
    shape = CacheShape("Qwen/Qwen2.5-0.5B", "bfloat16", "LBNHC", "mha", 24, 2, 64, 16, tp_rank=0, tp_size=2)
    rank1 = CacheShape("Qwen/Qwen2.5-0.5B", "bfloat16", "LBNHC", "mha", 24, 2, 64, 16, tp_rank=1, tp_size=2)
    other = CacheShape("Qwen/Qwen2.5-1.5B", "bfloat16", "LBNHC", "mha", 24, 2, 64, 16, tp_rank=0, tp_size=2)
    assert len({shape.namespace(), rank1.namespace(), other.namespace()}) == 3
    assert shape.namespace().id == "Qwen--Qwen2.5-0.5B@bf16@vllm-LBNHC-mha-L24-H2-D64-T16-pp0of1@tp0of2"
    mla = [CacheShape("ds", "bfloat16", "LBNHC", "mla", 4, 1, 576, 16, tp_rank=r, tp_size=2) for r in (0, 1)]
    assert mla[0].namespace() == mla[1].namespace(), "MLA's latent cache is the same on every TP rank"


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
