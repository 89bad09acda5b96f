"""KVPoolTier as the secondary tier of vLLM's OffloadingConnector (TieringOffloadingSpec), against real daemons.

vLLM's scheduler, tiering manager, primary tier and tier loading are its own; the GPU <-> CPU
copies of its worker side (CUDA only) are done by bench.vllm.offloading.PrimaryTierCopier.
Engine A's chunks cascade to the pool; engine B (its own primary tier, empty) promotes them
from the pool instead of computing them.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

from bench.vllm.harness import block_bytes, model_dir
from bench.vllm.offloading import TieredEngine
from kvpool_client.integrations.vllm.tier import tier_namespace
from tests.engines.vllm.doc_configs import tier_config
from tests.support.daemon import DaemonProcess

PROMPT = list(range(3000, 3100))  # 6 full blocks


@pytest.fixture
def tiered(tmp_path: Path) -> Any:
    made: list[TieredEngine] = []

    def make(tier: dict[str, Any], name: str) -> TieredEngine:
        engine = TieredEngine(model_dir(tmp_path), tier_config(**tier), engine_id=name)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def first_computed(engine: TieredEngine, req_id: str) -> int:
    """Step until ``req_id`` is first scheduled; the tokens it starts from (what the tiers supplied)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        output = engine.step()
        new = [r for r in output.scheduled_new_reqs if r.req_id == req_id]
        if new:
            return int(new[0].num_computed_tokens)
    raise TimeoutError(f"{req_id} was not scheduled in 30 s: {engine.scheduler.requests}")


def store_prompt(engine: TieredEngine) -> None:
    engine.add("A", PROMPT)
    engine.run(engine.idle)


def test_chunks_cascade_to_the_pool_and_another_engine_promotes_them_byte_exact(
    daemon: DaemonProcess, tiered: Callable[..., TieredEngine]
) -> None:
    a = tiered({"nodes": daemon.address}, "a")
    store_prompt(a)
    b = tiered({"nodes": daemon.address}, "b")
    request = b.add("B", PROMPT)
    hashes = list(request.block_hashes)
    first = first_computed(b, "B")
    assert first == 96, "B starts after the six blocks the pool held"
    assert len(b.loaded_rows) == 6
    want = {block_bytes(h, b.block_nbytes).numpy().tobytes() for h in hashes[:6]}
    got = {row.tobytes() for row in b.loaded_rows.values()}
    assert got == want, "the promoted rows hold exactly what engine A's blocks held"
    b.run(b.idle)


def test_a_pool_that_dies_turns_promotions_into_misses(
    daemon: DaemonProcess, tiered: Callable[..., TieredEngine]
) -> None:
    a = tiered({"nodes": daemon.address, "request_timeout_s": 2}, "a")
    store_prompt(a)
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(10)
    b = tiered({"nodes": daemon.address, "request_timeout_s": 2}, "b")
    b.add("B", PROMPT)
    first = first_computed(b, "B")
    assert first == 0 and not b.loaded_rows, "nothing promoted from a dead pool: B computes all"
    b.run(b.idle)


def test_models_do_not_share_chunks(daemon: DaemonProcess, tiered: Callable[..., TieredEngine]) -> None:
    a = tiered({"nodes": daemon.address}, "a")
    store_prompt(a)
    other = tiered({"nodes": daemon.address, "model_id": "another-model"}, "o")
    assert other.tier.namespace != a.tier.namespace
    other.add("B", PROMPT)
    first = first_computed(other, "B")
    assert first == 0
    assert not other.loaded_rows


def test_byte_formats_and_cache_groups_have_their_own_namespaces(
    daemon: DaemonProcess, tiered: Callable[..., TieredEngine]
) -> None:
    a = tiered({"nodes": daemon.address}, "a")
    config, size = a.tier._offloading_spec.config, a.tier.block_size_bytes
    base = tier_namespace(config, size, None)
    group = dataclasses.replace(config.groups[0], layer_names=(*config.groups[0].layer_names, "mtp.attn"))
    others = [
        dataclasses.replace(config, canonical_layout=True),
        dataclasses.replace(config, replicated_layout=True),
        dataclasses.replace(config, groups=(group,)),
    ]
    spaces = {base.id, *(tier_namespace(c, size, None).id for c in others)}
    assert len(spaces) == 4, "formats vLLM does not interchange must not share chunks"


def offloading_config(**fields: Any) -> OffloadingConfig:
    """vLLM's offloading config of a 2-layer model at TP 2, four 16-token blocks a chunk."""
    base: dict[str, Any] = dict(
        groups=(OffloadingGroupConfig(16, ("model.layers.0.attn", "model.layers.1.attn"), 0),),
        worker_kv_bytes_per_block=4096,
        enable_kv_cache_events=False,
        extra_config={},
        engine_id="e",
        model=OffloadingModelConfig("Qwen/Qwen2.5-0.5B", "bfloat16"),
        cache=OffloadingCacheConfig(16, 4),
        parallel=OffloadingParallelConfig(0, 2, 2, 1, 1, 1, 0, 1, None, False),
        kv_cache_layout="NHD",
    )
    return OffloadingConfig(**(base | fields))


def test_chunks_stay_in_the_namespaces_a_deployment_stored_them_in() -> None:
    """Literal ids: a change orphans every chunk stored before (the dtype stays vLLM's name)."""
    canonical = offloading_config(canonical_layout=True, replicated_layout=True, kv_cache_layout="LBNHC")
    fp8 = offloading_config(model=OffloadingModelConfig("Qwen/Qwen2.5-0.5B", "float8_e4m3fn"), kv_cache_layout=None)
    assert [
        tier_namespace(offloading_config(), 16384, None).id,
        tier_namespace(canonical, 65536, "qwen-prod").id,
        tier_namespace(fp8, 1024, None).id,
    ] == [
        "Qwen--Qwen2.5-0.5B@bfloat16@vllm-offload-NHD-B16384-T64-tp2-pp1-pcp1-dcp1-g5ee35b437e-direct@tp0of1",
        "qwen-prod@bfloat16@vllm-offload-LBNHC-B65536-T64-tp2-pp1-pcp1-dcp1-g5ee35b437e-v1-nhd-replicated@tp0of1",
        "Qwen--Qwen2.5-0.5B@float8_e4m3fn@vllm-offload-default-B1024-T64-tp2-pp1-pcp1-dcp1-g5ee35b437e-direct@tp0of1",
    ]
