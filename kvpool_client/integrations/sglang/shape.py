"""What decides a SGLang HiCache page's bytes besides its tokens, and the namespaces that hold it.

SGLang's page keys name token content only (a sha256 chain over the page's token ids). The
namespace adds the model, the KV dtype, the host pool's layout and shape, and the parallel
position. A page is stored as one pool block per *part*: MHA pages have two parts (K and V,
each one span of host memory in the page-first layouts), MLA pages one (the latent cache).
Each part has its own namespace, so every pool block keeps the page's own hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kvpool_client.core.keys import BlockKey, Namespace
from kvpool_client.integrations.namespaces import NamespaceFields

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
MHA_PARTS = ("k", "v")
MLA_PARTS = ("kv",)


def page_hash(key: str) -> bytes:
    """A SGLang page key as a pool block hash.

    SGLang's keys are lowercase hex sha256 digests (64 characters): those become their 32
    bytes, so the pool holds SGLang's own hash. Any other string (a custom key scheme) is
    hashed: the sha256 of ``b"sglang-key:" + key.encode()``, also 32 bytes, distinct from
    every page hash as long as sha256 has no collisions.
    """
    if len(key) == 64 and _HEX_DIGITS.issuperset(key):
        return bytes.fromhex(key)
    return hashlib.sha256(b"sglang-key:" + key.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class PageShape:
    """What decides a page's bytes besides its tokens.

    Attributes:
        model: the model's name (SGLang's model name, or ``model_id``).
        dtype: the host pool's torch dtype name (``bfloat16``).
        kind: ``mha`` or ``mla``.
        host_layout: the host pool's layout (``page_first``, ``layer_first``...).
        layers: layers in the host pool (this pipeline stage's, draft layers included).
        heads: KV heads per layer on this rank (1 for MLA).
        head_dim: channels per head (MLA: the latent dimension, ``kv_lora_rank + rope``).
        v_head_dim: V channels per head when they differ from ``head_dim`` (MHA), else None.
        page_size: tokens per page.
        tp_rank, tp_size, pp_rank, pp_size, cp_rank, cp_size: the parallel position
            (``cp``: SGLang's attention context parallelism, each rank holds a slice of a page).
    """

    model: str
    dtype: str
    kind: str
    host_layout: str
    layers: int
    heads: int
    head_dim: int
    page_size: int
    v_head_dim: int | None = None
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1

    @property
    def parts(self) -> tuple[str, ...]:
        """The page's parts, in the order of its flat bytes (SGLang's ``get_data_page``)."""
        return MLA_PARTS if self.kind == "mla" else MHA_PARTS

    def namespaces(self) -> tuple[Namespace, ...]:
        """One namespace per part. MLA's latent cache is the same on every TP rank, so MLA
        pages are shared across TP ranks (tp0of1); MHA pages are per rank.

        Raises:
            UsageError: the model name cannot be a namespace field even after cleaning.
        """
        vdim = f"-V{self.v_head_dim}" if self.v_head_dim not in (None, self.head_dim) else ""
        cp = f"-cp{self.cp_rank}of{self.cp_size}" if self.cp_size > 1 else ""
        base = (
            f"sglang-{self.kind}-{self.host_layout}-L{self.layers}-H{self.heads}-D{self.head_dim}{vdim}"
            f"-P{self.page_size}-pp{self.pp_rank}of{self.pp_size}{cp}"
        )
        fields = NamespaceFields.of(self.model, self.dtype)
        tp = (0, 1) if self.kind == "mla" else (self.tp_rank, self.tp_size)
        return tuple(fields.namespace(f"{base}-{part}", *tp) for part in self.parts)


class PageKeys:
    """SGLang page keys as pool keys: every part of every page, page after page.

    Args:
        namespaces: one namespace per part (:meth:`PageShape.namespaces`).
    """

    def __init__(self, namespaces: tuple[Namespace, ...]) -> None:
        self._ids = tuple(n.id for n in namespaces)

    @property
    def parts(self) -> int:
        return len(self._ids)

    @property
    def namespace_ids(self) -> tuple[str, ...]:
        return self._ids

    def of(self, keys: list[str], first_depth: int | None = None) -> list[BlockKey]:
        """The pool keys of ``keys``' pages: ``[p0 part0, p0 part1, p1 part0, ...]``.

        ``first_depth``: the chain position of ``keys[0]`` when known (a hint for eviction).
        """
        out: list[BlockKey] = []
        for index, key in enumerate(keys):
            digest = page_hash(key)
            depth = None if first_depth is None else first_depth + index
            out.extend(BlockKey(ns, digest, depth) for ns in self._ids)
        return out
