"""What goes into a block's namespace besides its engine's layout: the model, the KV dtype, the TP shard.

Every integration writes its own layout field (what decides its blocks' bytes, in its
engine's terms) and decides which of its namespaces are per tensor-parallel rank. The model
and the KV dtype they all write alike: the model as
:func:`model_field` writes it, the dtype by the one
table :data:`DTYPES` (``bfloat16`` -> ``bf16``). :class:`NamespaceFields` holds the two and
builds the namespaces.

:class:`KVLayout` is the block layout of an engine with no integration of its own (the
reference engine in ``bench/engine``, or yours): five dimensions in a memory order, whose id
is the layout field.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool_client.core.errors import UsageError
from kvpool_client.core.keys import Namespace

# The namespace's dtype field -> (the torch dtype's name, bytes per element).
DTYPES: dict[str, tuple[str, int]] = {
    "fp32": ("float32", 4),
    "fp16": ("float16", 2),
    "bf16": ("bfloat16", 2),
    "fp8e4m3": ("float8_e4m3fn", 1),
    "fp8e5m2": ("float8_e5m2", 1),
    "u8": ("uint8", 1),
}
_FIELDS = {torch_name: field for field, (torch_name, _) in DTYPES.items()}
_DIMS = "LKHTD"


def model_field(model: str) -> str:
    """``model`` as a namespace field.

    A hub name keeps its name, '/' becoming '--' (``Qwen/Qwen2.5-0.5B`` -> ``Qwen--Qwen2.5-0.5B``). A
    local folder becomes its last part and a digest of its resolved path (``/ckpt/run42/hf`` ->
    ``hf-3f0c9a1e27``): checkpoints in folders of the same name never share blocks, and engines share
    a local checkpoint's blocks when they load it from the same path (or set the same ``model_id``).
    Whitespace and '@' become '_'.
    """
    text = model.rstrip("/")
    if text.startswith(("/", ".", "~")) or os.path.isdir(text):
        path = Path(text).expanduser().resolve()
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:_PATH_DIGEST_CHARS]
        text = f"{path.name}-{digest}"
    return "".join("_" if c.isspace() or c == "@" else c for c in text).replace("/", "--")


_PATH_DIGEST_CHARS = 10  # 40 bits: folders of one name on one cluster never collide by chance


def dtype_field(dtype: Any) -> str:
    """A torch dtype, or its name (``torch.bfloat16``, ``bfloat16``), as a namespace field (``bf16``).

    A dtype :data:`DTYPES` does not name keeps its torch name (``int8``).
    """
    name = str(dtype).removeprefix("torch.")
    return _FIELDS.get(name, name)


@dataclass(frozen=True, slots=True)
class NamespaceFields:
    """The fields all of one engine's namespaces share; the layout and the TP shard vary.

    Attributes:
        model: the model field.
        dtype: the KV dtype field.
    """

    model: str
    dtype: str

    @classmethod
    def of(cls, model: str, dtype: Any, revision: str | None = None) -> NamespaceFields:
        """The fields of an engine serving ``model`` (its name or local path) with a KV cache of
        ``dtype`` (a torch dtype or its name); the weights' ``revision``, where the engine has
        one, follows the model after '~'.

        Call it where the engine names its model, and pass the fields on: a relative path
        resolves against the calling process's directory.
        """
        field = model_field(model) + (f"~{model_field(revision)}" if revision else "")
        return cls(field, dtype_field(dtype))

    def namespace(self, layout: str, tp_rank: int = 0, tp_size: int = 1) -> Namespace:
        """The namespace of blocks in ``layout`` of TP rank ``tp_rank`` of ``tp_size``; blocks that
        every TP rank holds alike (MLA's latent cache) take the default, ``tp0of1``.

        Raises:
            UsageError: a field is no valid namespace field, or the rank is out of range.
        """
        return Namespace(self.model, self.dtype, layout, tp_rank, tp_size)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shape, order and dtype of one KV block.

    A block holds the K and V of ``block_size`` consecutive tokens for every layer: five
    dimensions, layers (``L``), K/V (``K``, always 2), kv heads (``H``), tokens (``T``) and
    head_dim (``D``), in the order :attr:`order` names. The layout and the dtype go into the
    namespace, so a block of another model, dtype, shape or dimension order never matches.

    Args:
        layers: transformer layers whose K/V a block holds (this rank's, under pipeline parallelism).
        kv_heads: KV heads per layer on this tensor-parallel rank.
        head_dim: channels per head.
        block_size: tokens per block.
        dtype: one of :data:`DTYPES` (``fp32``, ``fp16``, ``bf16``, ``fp8e4m3``...).
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
        return NamespaceFields(model, self.dtype).namespace(self.id, tp_rank, tp_size)

    def torch_dtype(self) -> Any:
        """The torch dtype of :attr:`dtype` (imports torch)."""
        import torch

        return getattr(torch, DTYPES[self.dtype][0])
