"""LMCache memory objects as the pool's read and write buffers.

A get allocates its memory objects from LMCache's ``LocalCPUBackend`` (the caller owns
them, one reference each) and the pool client receives straight into their bytes; a put
sends straight from them. Nothing here copies a chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from kvpool_client.core.errors import UsageError


def payload(memory_obj: Any) -> torch.Tensor:
    """The chunk's bytes: a flat uint8 view of ``memory_obj`` (no copy).

    ``raw_tensor`` may be longer than the chunk (allocator alignment), so the view stops
    at ``get_size()``; ``byte_array`` is a read-only memoryview and cannot be read into.

    Raises:
        UsageError: the object has no host tensor (invalidated, or on a device).
    """
    raw = memory_obj.raw_tensor
    if raw is None or raw.device.type != "cpu":
        raise UsageError(f"LMCache memory object without a host tensor: {memory_obj!r}")
    host: torch.Tensor = raw.view(-1).view(torch.uint8)[: memory_obj.get_size()]
    return host


def release(memory_objs: Iterable[Any]) -> None:
    """Drop the reference an allocation gave us, returning the memory to LMCache."""
    for memory_obj in memory_objs:
        memory_obj.ref_count_down()


class ChunkAllocator:
    """Allocates full chunks, and partial last chunks, in LMCache's local CPU memory.

    Args:
        backend: LMCache's ``LocalCPUBackend``.
        shapes, dtypes, fmt: a full chunk's shapes, dtypes and memory format.
        token_bytes: bytes per token of a full chunk (for partial chunks).
    """

    def __init__(
        self, backend: Any, shapes: Sequence[torch.Size], dtypes: Sequence[torch.dtype], fmt: Any, token_bytes: int
    ) -> None:
        self._backend = backend
        self._shapes = list(shapes)
        self._dtypes = list(dtypes)
        self._fmt = fmt
        self.token_bytes = token_bytes
        self.chunk_bytes = sum(s.numel() * d.itemsize for s, d in zip(self._shapes, self._dtypes, strict=True))

    def full(self, count: int) -> list[Any]:
        """Up to ``count`` full-chunk objects; fewer when LMCache's memory runs out.

        Never waits for memory: it runs on LMCache's event loop, which must keep moving
        (LMCache's own allocate busy-loops unless told not to). What could not be
        allocated is a miss, and a miss ends a prefix, so allocation stops at the first.
        """
        made: list[Any] = []
        for _ in range(count):
            memory_obj = self._backend.allocate(self._shapes, self._dtypes, self._fmt, busy_loop=False)
            if memory_obj is None:
                break
            made.append(memory_obj)
        return made

    def partial(self, nbytes: int) -> Any | None:
        """An object for a partial chunk of ``nbytes``, or None when ``nbytes`` is not a
        whole number of tokens shorter than a chunk, the chunk has several KV groups, or
        memory ran out."""
        tokens, rest = divmod(nbytes, self.token_bytes)
        if rest or not 0 < tokens < self._shapes[0][2] or len(self._shapes) != 1:
            return None
        shape = list(self._shapes[0])
        shape[2] = tokens  # [2 or 1, layers, tokens, hidden]: tokens are dimension 2
        return self._backend.allocate([torch.Size(shape)], self._dtypes, self._fmt, busy_loop=False)
