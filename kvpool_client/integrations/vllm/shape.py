"""What decides a vLLM block's bytes besides its tokens, and the namespaces that hold them.

vLLM's block hashes name token content only. The namespace adds the rest: the weights (the
model, its revision and quantization, and a generation that changes when vLLM resets the
connector's cache after a weight update), the KV dtype, the cache layout and shape, and the
parallel rank whose shard a block is.
"""

from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass, replace

from kvpool_client.core.keys import Namespace
from kvpool_client.integrations.namespaces import NamespaceFields


@dataclass(frozen=True, slots=True)
class CacheShape:
    """What decides a vLLM block's bytes besides its tokens, on every rank of one engine.

    Attributes:
        model: the model's name or local path (vLLM's ``model`` setting, or ``model_id``).
        dtype: the KV cache's torch dtype name (``bfloat16``).
        layout: vLLM's resolved KV cache layout (``NHD``, ``HND``, ``LBNHC``...), or None.
        kind: ``mha`` or ``mla``.
        layers: attention layers in the scheduler's KV cache group.
        kv_heads: KV heads per layer on one rank; head_size: channels per head.
        block_size: tokens per block.
        tp_size, pp_size: the tensor- and pipeline-parallel sizes.
        revision: the weights' revision, when vLLM was given one.
        quantization: the weights' quantization method, when there is one.
    """

    model: str
    dtype: str
    layout: str | None
    kind: str
    layers: int
    kv_heads: int
    head_size: int
    block_size: int
    tp_size: int = 1
    pp_size: int = 1
    revision: str | None = None
    quantization: str | None = None

    def namespaces(self) -> EngineNamespaces:
        """The namespaces of this engine's blocks, one per rank that writes them.

        Raises:
            UsageError: the model name cannot be a namespace field even after cleaning.
        """
        quant = f"-q{self.quantization}" if self.quantization else ""
        layout = (
            f"vllm-{self.layout or 'default'}-{self.kind}{quant}-L{self.layers}-H{self.kv_heads}"
            f"-D{self.head_size}-T{self.block_size}"
        )
        per_tp_rank = self.kind == "mha"
        fields = NamespaceFields.of(self.model, self.dtype, self.revision)
        spaces = EngineNamespaces(fields, layout, self.tp_size, self.pp_size, per_tp_rank)
        spaces.of(0, 0)  # checks the fields now, not on the first transfer
        return spaces


@dataclass(frozen=True, slots=True)
class EngineNamespaces:
    """The namespaces one engine's ranks store their blocks in (what a step plan carries).

    MHA blocks are per tensor-parallel rank (each holds its own KV heads); MLA's latent cache
    is the same on every TP rank, so MLA blocks are shared across TP ranks and rank 0 alone
    writes them. Pipeline stages hold different layers: their blocks are always apart.
    """

    fields: NamespaceFields
    layout: str
    tp_size: int
    pp_size: int
    per_tp_rank: bool
    generation: str = ""  # set by renewed(): blocks of earlier weights are never read

    def of(self, tp_rank: int, pp_rank: int) -> Namespace:
        """The namespace of the blocks of rank (``tp_rank``, ``pp_rank``)."""
        generation = f"-g{self.generation}" if self.generation else ""
        layout = f"{self.layout}{generation}-pp{pp_rank}of{self.pp_size}"
        if self.per_tp_rank:
            return self.fields.namespace(layout, tp_rank, self.tp_size)
        return self.fields.namespace(layout)

    def writes(self, tp_rank: int) -> bool:
        """Whether TP rank ``tp_rank`` stores blocks (MLA: rank 0 alone)."""
        return self.per_tp_rank or tp_rank == 0

    def writers(self) -> list[str]:
        """The namespace id of every rank that stores blocks: a block is in the pool when it is in each."""
        tp_ranks = range(self.tp_size) if self.per_tp_rank else range(1)
        return [namespace_id(self, tp, pp) for pp in range(self.pp_size) for tp in tp_ranks]

    def renewed(self) -> EngineNamespaces:
        """The same namespaces under a new random generation: no block stored before is read again."""
        return replace(self, generation=secrets.token_hex(4))


@functools.lru_cache(maxsize=256)
def namespace_id(spaces: EngineNamespaces, tp_rank: int, pp_rank: int) -> str:
    """``spaces.of(tp_rank, pp_rank).id``, built and checked once: every transfer and lookup asks."""
    return spaces.of(tp_rank, pp_rank).id
