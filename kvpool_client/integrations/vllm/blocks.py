"""vLLM's per-layer KV cache tensors as the bytes of one pool block per vLLM block.

A pool block holds one vLLM block of every layer, layer after layer, each layer's part
exactly as that layer's tensor holds it (whatever the attention backend's dimension order
inside a block: the layout is in the namespace, so bytes are never reinterpreted). A layer
tensor indexes blocks in dimension 0 (``(num_blocks, ...)``, one region per block) or in
dimension 1 under a leading K/V dimension (``(2, num_blocks, ...)``, two regions).

In host memory a block goes to and from the pool with no copy of ours: where every region
of a block follows the previous one (a block-major cache) it is one slice of the cache, and
otherwise (vLLM's layer-major default) the client reads into and writes from its regions as
one I/O vector (:class:`~kvpool_client.buffers.Regions`). A GPU cache goes through staging
buffers (pinned host memory): a save gathers the regions into one, a load scatters it back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from kvpool_client.buffers import Target
from kvpool_client.core.errors import UsageError
from kvpool_client.integrations.regions import HostBlocks, Region, storage_bytes


def _regions(name: str, cache: torch.Tensor, num_blocks: int) -> list[Region]:
    """The regions of one layer's tensor, in block-byte order.

    Raises:
        UsageError: no dimension that indexes ``num_blocks`` blocks, or a block's part is not
            one dense span of memory.
    """
    size = cache.element_size()
    raw = storage_bytes(cache)
    if cache.dim() >= 2 and cache.shape[0] == num_blocks:
        parts = [cache]
    elif cache.dim() >= 3 and cache.shape[0] == 2 and cache.shape[1] == num_blocks:
        parts = [cache[0], cache[1]]  # K, V
    else:
        raise UsageError(f"KV cache of layer {name}: shape {tuple(cache.shape)} indexes no {num_blocks} blocks")
    regions = []
    for part in parts:
        block = part[0]
        span = 1 + sum((n - 1) * s for n, s in zip(block.shape, block.stride(), strict=True))
        if span != block.numel() or min(block.stride(), default=1) < 1:
            raise UsageError(f"KV cache of layer {name}: a block is not one dense span (strides {part.stride()})")
        # int(): torch types the offset as int | SymInt, a symbol only while tracing
        regions.append(Region(raw, int(part.storage_offset()) * size, part.stride(0) * size, block.numel() * size))
    return regions


class BlockLayers:
    """The engine's KV cache tensors, read and written one pool block per vLLM block.

    Args:
        kv_caches: layer name -> that layer's KV cache tensor (what ``register_kv_caches`` gets).
        layer_names: the layers in block-byte order (the KV cache group's order).
        num_blocks: blocks per layer.

    Raises:
        UsageError: a layer is missing, on another device, or not a paged block tensor.
    """

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], layer_names: Sequence[str], num_blocks: int) -> None:
        missing = [n for n in layer_names if n not in kv_caches]
        if missing or not layer_names:
            raise UsageError(f"no KV cache registered for layers {missing or '(none)'}")
        tensors = [kv_caches[n] for n in layer_names]
        if len({t.device for t in tensors}) != 1:
            raise UsageError("KV cache layers live on different devices")
        self.device = tensors[0].device
        self.num_blocks = num_blocks
        self.regions = [r for name, t in zip(layer_names, tensors, strict=True) for r in _regions(name, t, num_blocks)]
        self.block_nbytes = sum(r.nbytes for r in self.regions)
        self.host_memory = self.device.type == "cpu"  # else the pool's client cannot reach it: staging
        # A block's regions are kept once made (~0.2 KB a region: a few percent of the block's own
        # bytes at the smallest blocks vLLM makes), since making them costs microseconds a block.
        self._host = HostBlocks(self.regions, keep=True) if self.host_memory else None
        self.direct = self._host is not None and self._host.direct
        self._by_block = _uniform_view(self.regions, num_blocks)
        # On the CPU, numpy copies: one memcpy per row in this thread. torch's copy_ hands
        # larger copies to its intra-op thread pool, which is slower on a busy host.
        self._by_block_np = self._by_block.numpy() if self._by_block is not None and self.device.type == "cpu" else None

    def storages(self) -> list[torch.Tensor]:
        """Each storage the cache's blocks lie in, once: what a host cache registers with the
        one-sided data plane, so that its blocks move straight in and out (``nixl``)."""
        return list({region.raw.data_ptr(): region.raw for region in self.regions}.values())

    def check(self, block_ids: Sequence[int]) -> None:
        """Raises UsageError: a block id out of range."""
        bad = [b for b in block_ids if not 0 <= b < self.num_blocks]
        if bad:
            raise UsageError(f"block ids {bad[:4]} out of range 0..{self.num_blocks - 1}")

    def block(self, block_id: int) -> Target:
        """Block ``block_id`` where it lies in host memory: one slice (:attr:`direct`), else its
        regions in block-byte order. Only for a cache in host memory (:attr:`host_memory`)."""
        assert self._host is not None, "a device cache's blocks go through staging"
        return self._host.target(block_id)

    def gather(self, block_id: int, out: torch.Tensor) -> None:
        """Copy block ``block_id`` of every layer into ``out`` (uint8, :attr:`block_nbytes`); on a
        GPU the copy is queued on the current stream (see :mod:`.streams`)."""
        if self._by_block_np is not None:  # one strided copy instead of one per region
            np.copyto(out.numpy().reshape(len(self.regions), -1), self._by_block_np[block_id])
            return
        if self._by_block is not None:
            out.view(len(self.regions), -1).copy_(self._by_block[block_id], non_blocking=True)
            return
        at = 0
        for region in self.regions:
            out[at : at + region.nbytes].copy_(region.of(block_id), non_blocking=True)
            at += region.nbytes

    def scatter(self, block_id: int, src: torch.Tensor) -> None:
        """Copy ``src`` (a pool block's bytes) into block ``block_id`` of every layer."""
        if self._by_block_np is not None:
            np.copyto(self._by_block_np[block_id], src.numpy().reshape(len(self.regions), -1))
            return
        if self._by_block is not None:
            self._by_block[block_id].copy_(src.view(len(self.regions), -1), non_blocking=True)
            return
        at = 0
        for region in self.regions:
            region.of(block_id).copy_(src[at : at + region.nbytes], non_blocking=True)
            at += region.nbytes


def _uniform_view(regions: Sequence[Region], num_blocks: int) -> torch.Tensor | None:
    """``(blocks, regions, bytes)`` over the storage when the regions are alike and evenly spaced
    (vLLM's layers are views of one buffer at one layer stride); None otherwise."""
    first = regions[0]
    spacing = regions[1].offset - first.offset if len(regions) > 1 else first.nbytes
    for index, region in enumerate(regions):
        same = region.raw.untyped_storage().data_ptr() == first.raw.untyped_storage().data_ptr()
        alike = region.nbytes == first.nbytes and region.stride == first.stride
        if not (same and alike and region.offset == first.offset + index * spacing) or spacing <= 0:
            return None
    return first.raw.as_strided((num_blocks, len(regions), first.nbytes), (first.stride, spacing, 1), first.offset)


class StagingBuffers:
    """Reusable block-sized host buffers (pinned when the cache is on a GPU), shared by threads.

    Args:
        register: called with each buffer made (the pool client's ``register``: a buffer the
            one-sided data plane reads into and writes from in place).
    """

    def __init__(self, layers: BlockLayers, register: Callable[[torch.Tensor], None] | None = None) -> None:
        self._layers = layers
        self._register = register
        self._lock = threading.Lock()
        self._spare: list[torch.Tensor] = []

    def take(self, count: int) -> list[torch.Tensor]:
        with self._lock:
            buffers = [self._spare.pop() for _ in range(min(count, len(self._spare)))]
        pinned = self._layers.device.type == "cuda"
        while len(buffers) < count:
            buffers.append(torch.empty(self._layers.block_nbytes, dtype=torch.uint8, pin_memory=pinned))
            if self._register is not None:
                self._register(buffers[-1])
        return buffers

    def give_back(self, buffers: Sequence[Any]) -> None:
        with self._lock:
            self._spare.extend(buffers)
