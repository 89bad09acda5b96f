"""A decoder-only transformer in the shape of Qwen2.5-0.5B, with random weights.

RMSNorm, rotary position embeddings, grouped-query attention over a paged KV cache
and a SwiGLU MLP. Weights come from a fixed seed: no checkpoint is downloaded, and
two processes that build the same :class:`ModelConfig` hold bit-identical weights.

One forward pass runs a ragged batch: the new tokens of several sequences are
concatenated so the projections and the MLP are single large matmuls; attention
runs per sequence over that sequence's pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.engine.pages import PagedKVCache


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes of the model. Defaults: Qwen2.5-0.5B's layer and head shapes.

    ``layers`` and ``vocab`` are the two knobs scaled down for a CPU benchmark:
    fewer layers leave the prefill FLOPs per KV byte unchanged (both scale with
    depth), and a smaller vocabulary only shrinks the embedding and LM head.
    """

    layers: int = 24
    hidden: int = 896
    q_heads: int = 14
    kv_heads: int = 2
    head_dim: int = 64
    mlp: int = 4864
    vocab: int = 151936
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    max_positions: int = 32768
    seed: int = 0

    @property
    def name(self) -> str:
        """A model id that changes with any shape or the seed (the pool namespace uses it)."""
        return (
            f"randqwen-l{self.layers}-h{self.hidden}-q{self.q_heads}-kv{self.kv_heads}"
            f"-d{self.head_dim}-m{self.mlp}-v{self.vocab}-s{self.seed}"
        )

    def linear_flops_per_token(self) -> int:
        """Multiply-add FLOPs (x2) of every projection and MLP matmul for one token, all layers."""
        qkv = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
        out = self.q_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.mlp
        return 2 * self.layers * (qkv + out + mlp)

    def attention_flops(self, new_tokens: int, context: int) -> int:
        """FLOPs of QK^T and PV for ``new_tokens`` queries over ``context`` keys (causal, all layers)."""
        return 4 * self.layers * self.q_heads * self.head_dim * new_tokens * context


@dataclass(frozen=True, slots=True)
class SeqBatch:
    """One sequence's slice of a ragged batch.

    Attributes:
        start: offset of its first new token in the batch.
        length: new tokens this step.
        context: tokens in its KV cache after this step (position of the last new token + 1).
        pages: its page table: page ids holding positions ``[i * block, (i + 1) * block)``.
        wants_logits: whether the caller needs the logits of its last new token.
    """

    start: int
    length: int
    context: int
    pages: Sequence[int]
    wants_logits: bool


class _Layer:
    """One decoder layer's weights (fused QKV and fused gate/up projections)."""

    __slots__ = ("attn_norm", "w_qkv", "b_qkv", "w_o", "mlp_norm", "w_gate_up", "w_down")

    def __init__(self, cfg: ModelConfig, gen: torch.Generator) -> None:
        qkv = (cfg.q_heads + 2 * cfg.kv_heads) * cfg.head_dim
        std = 0.02
        self.attn_norm = 1.0 + 0.1 * torch.randn(cfg.hidden, generator=gen)
        self.w_qkv = torch.randn(cfg.hidden, qkv, generator=gen) * std
        self.b_qkv = torch.randn(qkv, generator=gen) * 0.1
        self.w_o = torch.randn(cfg.q_heads * cfg.head_dim, cfg.hidden, generator=gen) * std
        self.mlp_norm = 1.0 + 0.1 * torch.randn(cfg.hidden, generator=gen)
        self.w_gate_up = torch.randn(cfg.hidden, 2 * cfg.mlp, generator=gen) * std
        self.w_down = torch.randn(cfg.mlp, cfg.hidden, generator=gen) * std


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(head_dim: int, max_positions: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[max_positions, head_dim]`` in the rotate-half convention."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[tokens, heads, head_dim]`` by per-token ``cos``/``sin`` ``[tokens, head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def swiglu(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))`` with gate and up fused in one matmul."""
    gate, up = (x @ w_gate_up).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ w_down


class Model:
    """The transformer; :meth:`forward` reads and writes a :class:`PagedKVCache`.

    Args:
        cfg: shapes and the weight seed.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        gen = torch.Generator().manual_seed(cfg.seed)
        self.embed = torch.randn(cfg.vocab, cfg.hidden, generator=gen)
        self.layers = [_Layer(cfg, gen) for _ in range(cfg.layers)]
        self.final_norm = 1.0 + 0.1 * torch.randn(cfg.hidden, generator=gen)
        self.lm_head = torch.randn(cfg.hidden, cfg.vocab, generator=gen) * 0.05
        self.cos, self.sin = rope_tables(cfg.head_dim, cfg.max_positions, cfg.rope_theta)

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, seqs: Sequence[SeqBatch], kv: PagedKVCache
    ) -> torch.Tensor:
        """Run the new ``tokens`` of ``seqs``, writing their K/V into ``kv``.

        Args:
            tokens: int64 ``[n]``, the concatenated new tokens of every sequence.
            positions: int64 ``[n]``, each token's position in its sequence.
            seqs: the slices of the batch, in order.
            kv: the paged cache; every sequence's pages must already hold the K/V of
                positions before its first new token.

        Returns:
            float32 logits ``[k, vocab]`` for the last token of each sequence with
            ``wants_logits``, in ``seqs`` order.
        """
        cfg = self.cfg
        slots = kv.slot_mapping(seqs, positions)
        cos, sin = self.cos[positions], self.sin[positions]
        x = self.embed[tokens]
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, cfg.rms_eps)
            qkv = torch.addmm(layer.b_qkv, h, layer.w_qkv)
            q, k, v = qkv.split(
                [cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim], dim=-1
            )
            q = apply_rope(q.view(-1, cfg.q_heads, cfg.head_dim), cos, sin)
            k = apply_rope(k.view(-1, cfg.kv_heads, cfg.head_dim), cos, sin)
            kv.write(index, slots, k, v.view(-1, cfg.kv_heads, cfg.head_dim))
            x = x + self._attention(index, q, seqs, slots.tables, kv) @ layer.w_o
            x = x + swiglu(rms_norm(x, layer.mlp_norm, cfg.rms_eps), layer.w_gate_up, layer.w_down)
        last = [s.start + s.length - 1 for s in seqs if s.wants_logits]
        if not last:
            return torch.empty(0, cfg.vocab)
        return rms_norm(x[last], self.final_norm, cfg.rms_eps) @ self.lm_head

    def _attention(
        self, layer: int, q: torch.Tensor, seqs: Sequence[SeqBatch], tables: Sequence[torch.Tensor], kv: PagedKVCache
    ) -> torch.Tensor:
        """Causal GQA of each sequence's new queries over its cached keys; ``[n, q_heads * head_dim]``."""
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2])
        for s, table in zip(seqs, tables, strict=True):
            keys, values = kv.gather(layer, table, s.context)  # [kv_heads, context, head_dim]
            query = q[s.start : s.start + s.length].transpose(0, 1)  # [q_heads, length, head_dim]
            mask = None
            if s.length > 1:  # query i sits at position context - length + i
                mask = torch.ones(s.length, s.context, dtype=torch.bool).tril(s.context - s.length)
            attn = F.scaled_dot_product_attention(
                query[None], keys[None], values[None], attn_mask=mask, enable_gqa=True
            )[0]
            out[s.start : s.start + s.length] = attn.transpose(0, 1).reshape(s.length, -1)
        return out


def greedy(logits: torch.Tensor) -> list[int]:
    """The argmax token of each row."""
    return [int(t) for t in logits.argmax(dim=-1)]
