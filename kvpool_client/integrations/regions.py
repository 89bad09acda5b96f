"""An engine's KV cache blocks where they lie in memory, and in host memory as the client's targets.

Block ``b`` of a paged cache (a vLLM block of every layer, one part of a SGLang page) lies
in one or more regions of the cache's storage: :class:`Region` ``r`` holds bytes
``r.offset + b * r.stride`` to that plus ``r.nbytes``, and the block's bytes are its
regions' in order. :class:`HostBlocks` hands the blocks of a cache in host memory to the
client where they lie: one slice of the storage where a block's regions follow one another,
else its regions as one :class:`~kvpool_client.buffers.Regions`, which the client receives
into and sends from as one I/O vector. No byte is copied here either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvpool_client.buffers import Regions, Target


@dataclass(frozen=True, slots=True)
class Region:
    """Where one region of block ``b`` lies: ``raw[offset + b * stride:][:nbytes]``."""

    raw: torch.Tensor  # the whole storage as uint8 (storage_bytes)
    offset: int
    stride: int
    nbytes: int

    def of(self, block_id: int) -> torch.Tensor:
        start = self.offset + block_id * self.stride
        return self.raw[start : start + self.nbytes]


def storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage ``tensor`` is a view of, as a flat uint8 tensor on its device (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())


def adjacent(regions: Sequence[Region]) -> bool:
    """Whether every block's regions follow one another in one storage, at one block stride."""
    first = regions[0]
    at = first.offset
    for region in regions:
        same = region.raw.untyped_storage().data_ptr() == first.raw.untyped_storage().data_ptr()
        if not same or region.offset != at or region.stride != first.stride:
            return False
        at += region.nbytes
    return first.stride >= at - first.offset


class HostBlocks:
    """The blocks of a cache in host memory, each where it lies.

    Args:
        regions: where a block's bytes lie, in its byte order; each in host memory.
        keep: keep each block's :class:`~kvpool_client.buffers.Regions` once made, for a
            cache whose blocks are few enough that their views cost less than remaking them.

    Attributes:
        nbytes: a block's size.
        direct: whether a block is one slice of its storage (its regions follow one another).
    """

    def __init__(self, regions: Sequence[Region], keep: bool = False) -> None:
        self.nbytes = sum(r.nbytes for r in regions)
        self.direct = adjacent(regions)
        # Each region's storage as one memoryview, sliced per block: no tensor per block.
        self._spans = [(r.raw.numpy().data, r.offset, r.stride, r.nbytes) for r in regions]
        self._kept: dict[int, Regions] | None = {} if keep else None

    def target(self, block_id: int) -> Target:
        """Block ``block_id`` as the client reads into and sends from it: one slice
        (:attr:`direct`), else its regions in block-byte order."""
        if self.direct:
            memory, offset, stride, _ = self._spans[0]
            start = offset + block_id * stride
            return memory[start : start + self.nbytes]
        if self._kept is None:
            return self._regions(block_id)
        regions = self._kept.get(block_id)
        if regions is None:  # its spans never move
            regions = self._kept[block_id] = self._regions(block_id)
        return regions

    def _regions(self, block_id: int) -> Regions:
        views = [memory[o + block_id * s : o + block_id * s + n] for memory, o, s, n in self._spans]
        return Regions(tuple(views), self.nbytes, True)
