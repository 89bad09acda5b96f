"""What decides a vLLM block's bytes besides its tokens, and the namespace that holds it.

vLLM's block hashes name token content only; the namespace adds the model, the KV dtype, the
cache layout and shape, and the parallel rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool_client.core.keys import Namespace
from kvpool_client.integrations.settings import dtype_field, model_field


@dataclass(frozen=True, slots=True)
class CacheShape:
    """What decides a vLLM block's bytes besides its tokens.

    Attributes:
        model: the model's name (vLLM's ``model`` setting, or ``model_id``).
        dtype: the KV cache's torch dtype name (``bfloat16``).
        layout: vLLM's resolved KV cache layout (``NHD``, ``HND``, ``LBNHC``...), or None.
        kind: ``mha`` or ``mla``.
        layers: attention layers on this pipeline stage.
        kv_heads: KV heads per layer on this rank; head_size: channels per head.
        block_size: tokens per block.
        tp_rank, tp_size, pp_rank, pp_size: the parallel position.
    """

    model: str
    dtype: str
    layout: str | None
    kind: str
    layers: int
    kv_heads: int
    head_size: int
    block_size: int
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    def namespace(self) -> Namespace:
        """The namespace of this shape's blocks. MLA's latent cache is the same on every TP
        rank, so MLA blocks are shared across ranks (tp0of1); MHA blocks are per rank.

        Raises:
            UsageError: the model name cannot be a namespace field even after cleaning.
        """
        dtype = dtype_field(self.dtype)
        layout = (
            f"vllm-{self.layout or 'default'}-{self.kind}-L{self.layers}-H{self.kv_heads}"
            f"-D{self.head_size}-T{self.block_size}-pp{self.pp_rank}of{self.pp_size}"
        )
        if self.kind == "mla":
            return Namespace(model_field(self.model), dtype, layout)
        return Namespace(model_field(self.model), dtype, layout, self.tp_rank, self.tp_size)
