"""LMCache chunk keys as pool keys.

An LMCache ``CacheEngineKey`` is ``(model_name, world_size, worker_id, chunk_hash, dtype,
tags)``; its bytes also depend on the engine's chunk format (memory format, chunk size,
the chunk's shapes and dtypes), which the key does not carry. A pool key splits that in two:

- the namespace ``model@dtype@layout@tp{worker_id}of{world_size}``: the model (``model_id``
  or the key's model name, as :func:`~kvpool_client.integrations.namespaces.model_field`
  writes it), the KV dtype (as :func:`~kvpool_client.integrations.namespaces.dtype_field`
  names it), and a layout ``lmcache-<fmt>-T<chunk size>-<shapes>`` that holds the rest of the
  format;
- the hash: the chunk hash as a 9-byte big-endian two's complement integer, so both the
  signed 64-bit hashes of Python's ``hash`` and the unsigned 64-bit ones LMCache folds
  vLLM's sha256 digests into are kept apart; a key with LMCache tags
  (``lmcache.tag.*`` request configs) appends the 32-byte sha256 of their text, as
  ``CacheEngineKey.to_string`` writes them.

Both depend only on the key and the config, never on the process (no seeds, no ids), so
every engine of a deployment computes the same pool key for the same chunk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvpool_client.core.keys import BlockKey
from kvpool_client.integrations.namespaces import NamespaceFields, dtype_field

HASH_BYTES = 9  # holds every int64 and every uint64
_LOW, _HIGH = -(1 << (8 * HASH_BYTES - 1)), 1 << (8 * HASH_BYTES - 1)


@dataclass(frozen=True, slots=True)
class ChunkFormat:
    """What decides an LMCache chunk's bytes besides its tokens and its key.

    Attributes:
        fmt: LMCache's memory format name (``KV_2LTD``, ``KV_MLA_FMT``).
        chunk_size: tokens per chunk.
        shapes: the full chunk's shape per KV group (``[2, layers, tokens, hidden]``).
        dtypes: the dtype per KV group.
    """

    fmt: str
    chunk_size: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, fmt: Any, chunk_size: int, shapes: Iterable[Iterable[int]], dtypes: Iterable[Any]) -> ChunkFormat:
        """From LMCache's objects (a ``MemoryFormat``, ``torch.Size``s, ``torch.dtype``s)."""
        return cls(
            getattr(fmt, "name", str(fmt)),
            chunk_size,
            tuple(tuple(int(d) for d in s) for s in shapes),
            tuple(dtype_field(d) for d in dtypes),
        )

    def layout(self, kv_dtype: str) -> str:
        """The namespace's layout field; a group dtype other than the key's is spelled out."""
        groups = []
        for shape, dtype in zip(self.shapes, self.dtypes, strict=True):
            dims = "x".join(str(d) for d in shape)
            groups.append(dims if dtype == kv_dtype else f"{dims}{dtype}")
        return f"lmcache-{self.fmt}-T{self.chunk_size}-{'+'.join(groups)}"


def chunk_hash_bytes(chunk_hash: int, tags: tuple[tuple[str, Any], ...] | None = None) -> bytes:
    """The pool hash of a chunk (module docstring).

    Raises:
        ValueError: ``chunk_hash`` is not an int within 72-bit two's complement (LMCache
            folds every hash to 64 bits, so this means a foreign key).
    """
    if type(chunk_hash) is not int or not _LOW <= chunk_hash < _HIGH:
        raise ValueError(f"chunk hash {chunk_hash!r} is not a 64-bit integer")
    head = chunk_hash.to_bytes(HASH_BYTES, "big", signed=True)
    if not tags:
        return head
    text = "@".join(f"{k}%{v}" for k, v in tags)
    return head + hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class ChunkKeys:
    """Maps ``CacheEngineKey`` objects to pool keys for one engine's chunk format.

    Args:
        chunk_format: the engine's chunk format.
        model_id: the model's name in the pool; None: each key's ``model_name``.
    """

    def __init__(self, chunk_format: ChunkFormat, model_id: str | None) -> None:
        self.chunk_format = chunk_format
        self._model_id = model_id
        # (model, world size, worker, dtype) -> namespace id: an engine has one or two.
        self._namespaces: dict[tuple[str, int, int, Any], str] = {}

    def namespace(self, key: Any) -> str:
        """The namespace id of ``key``'s chunk.

        Raises:
            UsageError: the key's fields cannot form a namespace (a worker id outside its
                world size, a model name too long).
        """
        ident = (key.model_name, key.world_size, key.worker_id, key.dtype)
        found = self._namespaces.get(ident)
        if found is None:
            fields = NamespaceFields.of(self._model_id or key.model_name, key.dtype)
            namespace = fields.namespace(self.chunk_format.layout(fields.dtype), key.worker_id, key.world_size)
            found = self._namespaces[ident] = namespace.id
        return found

    def key(self, key: Any) -> BlockKey:
        """The pool key of ``key``'s chunk.

        Raises:
            UsageError, ValueError: ``key`` cannot be mapped (:meth:`namespace`,
                :func:`chunk_hash_bytes`).
        """
        return BlockKey(self.namespace(key), chunk_hash_bytes(key.chunk_hash, key.tags))

    def keys(self, keys: Iterable[Any]) -> list[BlockKey]:
        return [self.key(k) for k in keys]
