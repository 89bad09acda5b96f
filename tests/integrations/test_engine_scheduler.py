"""Engine loop and workload: token budget, admission by pages, prefix hits, determinism."""

from __future__ import annotations

import dataclasses

import torch

from bench.engine.engine import Engine, EngineConfig
from bench.engine.model import Model, ModelConfig
from bench.engine.request import Finished, FirstToken, Request
from bench.engine.workload import WorkloadSpec, build_workload
from kvpool_client.integrations.namespaces import KVLayout

torch.set_num_threads(1)
CFG = ModelConfig(layers=1, hidden=32, q_heads=2, kv_heads=1, head_dim=16, mlp=64, vocab=50, max_positions=256)
LAYOUT = KVLayout(CFG.layers, CFG.kv_heads, CFG.head_dim, 4, "fp32")
MODEL = Model(CFG)


def _engine(pages: int, budget: int, prefix_cache: bool = True) -> Engine:
    return Engine(MODEL, LAYOUT, LAYOUT.namespace(CFG.name), EngineConfig(pages, budget, prefix_cache))


def test_prefill_is_chunked_by_the_token_budget_and_decodes_ride_along() -> None:
    engine = _engine(pages=16, budget=8)
    engine.submit(Request("a", list(range(1, 21)), 3, 0.0))
    steps = [engine.step() for _ in range(3)]
    assert [len(s) for s in steps] == [0, 0, 1] and isinstance(steps[2][0], FirstToken)
    engine.submit(Request("b", list(range(30, 40)), 2, 0.0))
    engine.step()  # a's decode (1 token) + b's first 7 prompt tokens
    assert engine.stats.computed_tokens == 20 + 8
    events = engine.drain()
    assert sorted(e.rid for e in events if isinstance(e, Finished)) == ["a", "b"]
    engine.cache.check_idle()


def test_a_request_waits_for_pages_then_reuses_the_cached_prefix() -> None:
    engine = _engine(pages=6, budget=64)
    prompt = list(range(1, 18))  # 17 tokens + 2 fed output tokens: 5 pages
    engine.submit(Request("first", prompt, 3, 0.0))
    engine.submit(Request("second", [*prompt[:16], 49], 3, 0.0))
    engine.step()
    assert engine.stats.computed_tokens == 17  # the second did not fit beside the first
    done = {e.rid: e for e in engine.drain() if isinstance(e, Finished)}
    assert done["second"].local_hit_tokens == 16 and done["first"].local_hit_tokens == 0
    engine.cache.check_idle()


def test_without_prefix_cache_nothing_is_reused_but_tokens_match() -> None:
    outputs = []
    for prefix_cache in (False, True):
        engine = _engine(pages=12, budget=32, prefix_cache=prefix_cache)
        engine.submit(Request("x", list(range(5, 26)), 4, 0.0))
        events = engine.step()  # x's whole prompt: its 5 full blocks are cached from now on
        engine.submit(Request("y", list(range(5, 26)), 4, 0.0))
        done = {e.rid: e for e in events + engine.drain() if isinstance(e, Finished)}
        assert done["y"].local_hit_tokens == (20 if prefix_cache else 0)
        outputs.append({rid: f.output for rid, f in done.items()})
        engine.cache.check_idle()
    assert outputs[0] == outputs[1]


def test_workload_is_deterministic_and_turns_extend_the_previous_turn() -> None:
    spec = WorkloadSpec(seed=3, documents=3, document_tokens=20, conversations=5, turns=2, message_tokens=(2, 4))
    one, two = build_workload(spec), build_workload(spec)
    assert one == two and one != build_workload(dataclasses.replace(spec, seed=4))
    assert sorted(c.document for c in one.conversations) == [0, 0, 1, 1, 2]
    conversation = one.conversations[0]
    first = one.first_prompt(conversation)
    assert first[: 64 + 20] == [*one.system, *one.documents[conversation.document]]
    second = one.next_prompt(conversation, 1, first, [7, 7])
    assert second == [*first, 7, 7, *conversation.messages[1]]
    lengths = [len(m) for c in one.conversations for m in c.messages]
    assert one.working_set_tokens() == 64 + 3 * 20 + sum(lengths) + 10 * spec.output_tokens
