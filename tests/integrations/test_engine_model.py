"""Reference engine model: norm, rotary embeddings, and paged GQA against a dense reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from bench.engine.model import Model, ModelConfig, SeqBatch, apply_rope, greedy, rms_norm, rope_tables
from bench.engine.pages import PagedKVCache
from kvpool_client.integrations.namespaces import KVLayout

torch.set_num_threads(1)
TINY = ModelConfig(layers=2, hidden=64, q_heads=4, kv_heads=2, head_dim=16, mlp=96, vocab=101, max_positions=512)


def _layout(cfg: ModelConfig, block: int = 4) -> KVLayout:
    return KVLayout(cfg.layers, cfg.kv_heads, cfg.head_dim, block, "fp32")


def _dense_logits(model: Model, tokens: list[int]) -> torch.Tensor:
    """The same network without paging: full causal attention, K/V repeated per query group."""
    cfg = model.cfg
    pos = torch.arange(len(tokens))
    cos, sin = model.cos[pos], model.sin[pos]
    x = model.embed[torch.tensor(tokens)]
    group = cfg.q_heads // cfg.kv_heads
    for layer in model.layers:
        h = rms_norm(x, layer.attn_norm, cfg.rms_eps)
        q, k, v = (h @ layer.w_qkv + layer.b_qkv).split(
            [cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim], dim=-1
        )
        q = apply_rope(q.view(-1, cfg.q_heads, cfg.head_dim), cos, sin).transpose(0, 1)
        k = apply_rope(k.view(-1, cfg.kv_heads, cfg.head_dim), cos, sin).transpose(0, 1)
        v = v.view(-1, cfg.kv_heads, cfg.head_dim).transpose(0, 1)
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(len(tokens), -1)
        x = x + attn @ layer.w_o
        g, u = (rms_norm(x, layer.mlp_norm, cfg.rms_eps) @ layer.w_gate_up).chunk(2, dim=-1)
        x = x + (F.silu(g) * u) @ layer.w_down
    return rms_norm(x[-1:], model.final_norm, cfg.rms_eps) @ model.lm_head


def _paged_logits(
    model: Model, kv: PagedKVCache, tokens: list[int], chunks: list[int], pages: list[int]
) -> torch.Tensor:
    done = 0
    logits = torch.empty(0)
    for size in chunks:
        seq = SeqBatch(0, size, done + size, pages, done + size == len(tokens))
        logits = model.forward(torch.tensor(tokens[done : done + size]), torch.arange(done, done + size), [seq], kv)
        done += size
    return logits


def test_rms_norm_gives_unit_rms_times_weight() -> None:
    x = torch.randn(3, 64) * 5
    out = rms_norm(x, torch.full((64,), 2.0), 1e-6)
    assert torch.allclose(out.pow(2).mean(-1).sqrt(), torch.full((3,), 2.0), atol=1e-4)


def test_rope_preserves_norm_and_depends_on_relative_position_only() -> None:
    cos, sin = rope_tables(16, 64, 10000.0)
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)

    def dot(m: int, n: int) -> float:
        qm = apply_rope(q, cos[m : m + 1], sin[m : m + 1])
        kn = apply_rope(k, cos[n : n + 1], sin[n : n + 1])
        return float((qm * kn).sum())

    assert torch.allclose(apply_rope(q, cos[7:8], sin[7:8]).norm(), q.norm(), atol=1e-5)
    assert dot(10, 3) == pytest.approx(dot(40, 33), abs=1e-4)


def test_weights_are_a_function_of_the_seed() -> None:
    a, b, c = Model(TINY), Model(TINY), Model(dataclasses.replace(TINY, seed=1))
    assert torch.equal(a.layers[1].w_down, b.layers[1].w_down)
    assert not torch.equal(a.layers[1].w_down, c.layers[1].w_down)
    assert a.cfg.name != c.cfg.name


def test_paged_prefill_matches_dense_reference_in_any_chunking() -> None:
    model = Model(TINY)
    tokens = [int(t) for t in torch.randint(0, TINY.vocab, (23,), generator=torch.Generator().manual_seed(3))]
    dense = _dense_logits(model, tokens)
    pages = [5, 2, 7, 0, 3, 6]  # scattered, out of order: 6 pages x 4 tokens hold 23
    for chunks in ([23], [8, 15], [1, 4, 9, 9]):
        kv = PagedKVCache(_layout(TINY), 8)
        paged = _paged_logits(model, kv, tokens, chunks, pages)
        assert torch.allclose(paged, dense, atol=1e-5), chunks


def test_ragged_batch_matches_sequences_run_alone() -> None:
    model = Model(TINY)
    first, second = list(range(1, 11)), list(range(40, 46))
    kv = PagedKVCache(_layout(TINY), 8)
    seqs = [SeqBatch(0, 10, 10, [0, 1, 2], True), SeqBatch(10, 6, 6, [4, 5], True)]
    both = model.forward(torch.tensor(first + second), torch.tensor(list(range(10)) + list(range(6))), seqs, kv)
    assert torch.allclose(both[0], _dense_logits(model, first)[0], atol=1e-5)
    assert torch.allclose(both[1], _dense_logits(model, second)[0], atol=1e-5)
    assert greedy(both) == [int(both[0].argmax()), int(both[1].argmax())]


def test_flops_per_token_of_qwen_shapes() -> None:
    qwen = ModelConfig()
    per_layer = 896 * 1152 + 896 * 896 + 3 * 896 * 4864
    assert qwen.linear_flops_per_token() == 2 * 24 * per_layer
    assert qwen.attention_flops(1, 100) == 4 * 24 * 14 * 64 * 100
