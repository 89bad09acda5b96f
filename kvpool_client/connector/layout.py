"""The KV layout of one block, and the namespace that keeps layouts apart.

A block holds the K and V of ``block_size`` consecutive tokens for every layer:
five dimensions, layers (``L``), K/V (``K``, always 2), kv heads (``H``), tokens
(``T``) and head_dim (``D``), in the order :attr:`KVLayout.order` names. The layout
and the dtype go into the :class:`~kvpool_client.core.keys.Namespace`, so a block of
another model, dtype, shape or dimension order lives under another key and never
matches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpool_client.core.errors import UsageError
from kvpool_client.core.keys import Namespace

# Namespace dtype name -> (torch dtype attribute, bytes per element).
DTYPES: dict[str, tuple[str, int]] = {
    "fp32": ("float32", 4),
    "fp16": ("float16", 2),
    "bf16": ("bfloat16", 2),
    "fp8e4m3": ("float8_e4m3fn", 1),
}
_DIMS = "LKHTD"


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shape, order and dtype of one KV block.

    Args:
        layers: transformer layers whose K/V a block holds (this rank's, under pipeline parallelism).
        kv_heads: KV heads per layer on this tensor-parallel rank.
        head_dim: channels per head.
        block_size: tokens per block (vLLM block size, SGLang page size).
        dtype: one of :data:`DTYPES` (``fp32``, ``fp16``, ``bf16``, ``fp8e4m3``).
        order: the five letters ``LKHTD`` in the block's memory order, outermost first.

    Raises:
        UsageError: a size is not a positive int, an unknown dtype, or ``order`` is not a
            permutation of ``LKHTD``.
    """

    layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: str = "bf16"
    order: str = "LKHTD"

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise UsageError(f"KVLayout.{name} must be a positive int, got {value!r}")
        if self.dtype not in DTYPES:
            raise UsageError(f"KVLayout.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.order, str) or sorted(self.order) != sorted(_DIMS):
            raise UsageError(f"KVLayout.order must be a permutation of {_DIMS!r}, got {self.order!r}")

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The block's dimensions in :attr:`order`."""
        sizes = {"L": self.layers, "K": 2, "H": self.kv_heads, "T": self.block_size, "D": self.head_dim}
        return tuple(sizes[dim] for dim in self.order)

    @property
    def element_size(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.block_size * self.element_size

    @property
    def token_nbytes(self) -> int:
        """KV bytes per token (all layers, K and V)."""
        return self.block_nbytes // self.block_size

    @property
    def id(self) -> str:
        """``L{layers}-KV2-H{kv_heads}-D{head_dim}-T{block_size}-{order}``: the namespace's layout field."""
        return f"L{self.layers}-KV2-H{self.kv_heads}-D{self.head_dim}-T{self.block_size}-{self.order}"

    def namespace(self, model: str, tp_rank: int = 0, tp_size: int = 1) -> Namespace:
        """The namespace of ``model``'s blocks in this layout on one tensor-parallel rank.

        Raises:
            UsageError: ``model`` is not a valid namespace field, or the TP rank is out of range.
        """
        return Namespace(model, self.dtype, self.id, tp_rank, tp_size)

    def torch_dtype(self) -> Any:
        """The torch dtype of :attr:`dtype` (imports torch)."""
        import torch

        return getattr(torch, DTYPES[self.dtype][0])
