"""The reference engine on a real daemon: same greedy tokens in every mode, and pool loads exact.

A tiny model with a tiny page budget, so later requests find their prefixes evicted
locally and (c) loads them from the pool. Modes: (a) no prefix cache, (b) local
prefix cache, (c) local + pool (save on evict), and the disaggregated pair (prefill
engine writes, decode engine reads).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import pytest
import torch

from bench.engine.engine import Engine, EngineConfig
from bench.engine.model import Model, ModelConfig
from bench.engine.pages import PagedKVCache
from bench.engine.pool_tier import PoolTier, SavePolicy
from bench.engine.request import Finished, Request
from kvpool_client import KVPoolClient
from kvpool_client.integrations.namespaces import KVLayout
from tests.support.daemon import DaemonProcess, start_daemon

torch.set_num_threads(1)
CFG = ModelConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=97, max_positions=1024)
LAYOUT = KVLayout(CFG.layers, CFG.kv_heads, CFG.head_dim, 4, "fp32")
MODEL = Model(CFG)
OUT = 6


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    """One daemon for the module: each test hashes with its own seed, so tests never see each other's blocks."""
    process = start_daemon("--dram-capacity", "64MiB", "--slab-size", "1MiB")
    yield process
    process.stop()
    process.remove_files()


def _engine(
    pages: int,
    prefix_cache: bool = True,
    client: KVPoolClient | None = None,
    policy: SavePolicy = SavePolicy.EVICT,
    model: Model = MODEL,
    seed: str = "t",
) -> Engine:
    namespace = LAYOUT.namespace(model.cfg.name)

    def tier(kv: PagedKVCache) -> PoolTier:
        assert client is not None
        return PoolTier(client, namespace, kv, policy)

    config = EngineConfig(pages, max_batch_tokens=32, prefix_cache=prefix_cache, seed=seed)
    return Engine(model, LAYOUT, namespace, config, tier if client is not None else None, keep_logits=True)


def _prompts() -> list[list[int]]:
    rng = random.Random(5)
    docs = [[rng.randrange(CFG.vocab) for _ in range(37)] for _ in range(3)]
    return [doc + [rng.randrange(CFG.vocab) for _ in range(rng.randint(3, 9))] for _ in range(2) for doc in docs]


def _serve(engine: Engine, prompts: list[list[int]], together: bool) -> dict[str, Finished]:
    """Serve prompts one after another, or all at once (continuous batching); check no page leaked."""
    done: dict[str, Finished] = {}
    for index, prompt in enumerate(prompts):
        engine.submit(Request(f"r{index}", prompt, OUT, 0.0))
        if not together:
            done.update((e.rid, e) for e in engine.drain() if isinstance(e, Finished))
    done.update((e.rid, e) for e in engine.drain() if isinstance(e, Finished))
    engine.cache.check_idle()
    return done


def test_greedy_outputs_are_identical_across_modes(daemon: DaemonProcess) -> None:
    prompts = _prompts()
    with KVPoolClient([daemon.address]) as client:
        for together in (False, True):
            seed = f"modes-{together}"
            runs = {
                "a": _serve(_engine(16, prefix_cache=False, seed=seed), prompts, together),
                "b": _serve(_engine(16, seed=seed), prompts, together),
                "c": _serve(_engine(16, client=client, seed=seed), prompts, together),
            }
            outputs = {mode: {rid: f.output for rid, f in done.items()} for mode, done in runs.items()}
            assert outputs["a"] == outputs["b"] == outputs["c"], together
            assert len(outputs["a"]) == len(prompts) and all(len(o) == OUT for o in outputs["a"].values())
            reused = {
                mode: sum(f.local_hit_tokens + f.pool_hit_tokens for f in done.values()) for mode, done in runs.items()
            }
            if not together:  # one at a time, the 16-page budget holds about one document
                assert reused["c"] == 3 * 36 > reused["b"]  # each document's 9 full blocks, second time round
                assert all(f.loaded_bytes == f.pool_hit_tokens // 4 * LAYOUT.block_nbytes for f in runs["c"].values())


def test_logits_after_a_pool_load_match_recompute(daemon: DaemonProcess) -> None:
    first, second = _prompts()[0], _prompts()[3]  # the same document, different questions
    with KVPoolClient([daemon.address]) as client:
        pooled = _engine(32, client=client, seed="logits")
        _serve(pooled, [first], together=False)
        full_blocks = (len(first) + OUT - 1) // 4  # prompt and fed output tokens
        assert pooled.evict_all() == full_blocks and pooled.tier is not None
        assert pooled.tier.stats.saved_blocks == full_blocks
        finished = _serve(pooled, [second], together=False)["r0"]
        assert finished.pool_hit_tokens == 36 and finished.local_hit_tokens == 0
    recompute = _engine(32, prefix_cache=False, seed="logits")
    reference = _serve(recompute, [second], together=False)["r0"]
    diff = (pooled.first_logits["r0"] - recompute.first_logits["r0"]).abs().max().item()
    assert diff < 1e-5, diff
    assert finished.output == reference.output


def test_disaggregated_prefill_writes_decode_reads(daemon: DaemonProcess) -> None:
    prompts = _prompts()[:3]
    reference = _serve(_engine(32, prefix_cache=False, seed="pd"), prompts, together=True)
    with KVPoolClient([daemon.address]) as prefill_client, KVPoolClient([daemon.address]) as decode_client:
        prefill = _engine(32, client=prefill_client, policy=SavePolicy.FINISH, seed="pd")
        decode = _engine(32, client=decode_client, policy=SavePolicy.FINISH, seed="pd")
        for index, prompt in enumerate(prompts):
            prefill.submit(Request(f"r{index}", prompt, 1, 0.0))
        firsts = {e.rid: e for e in prefill.drain() if isinstance(e, Finished)}
        for rid, first in firsts.items():
            decode.submit(Request(rid, prompts[int(rid[1:])] + list(first.output), OUT - 1, 0.0))
        rest = {e.rid: e for e in decode.drain() if isinstance(e, Finished)}
    for rid, done in reference.items():
        assert firsts[rid].output + rest[rid].output == done.output
        assert rest[rid].pool_hit_tokens == (len(prompts[int(rid[1:])]) // 4) * 4  # every full prompt block
    prefill.cache.check_idle()
    decode.cache.check_idle()


def test_blocks_of_another_model_never_match(daemon: DaemonProcess) -> None:
    prompt = _prompts()[0]
    other = Model(dataclasses.replace(CFG, seed=1))
    with KVPoolClient([daemon.address]) as client:
        writer = _engine(16, client=client, policy=SavePolicy.FINISH, seed="ns")
        _serve(writer, [prompt], together=False)
        reader = _engine(16, client=client, model=other, seed="ns")
        done = _serve(reader, [prompt], together=False)
        assert done["r0"].pool_hit_tokens == 0
        again = _serve(_engine(16, client=client, seed="ns"), [prompt], together=False)
        assert again["r0"].pool_hit_tokens == (len(prompt) - 1) // 4 * 4
