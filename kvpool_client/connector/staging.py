"""The engine's KV pages as block buffers the client can send from and receive into.

A page whose memory is one contiguous CPU block is handed to the client as is:
the pool reads into it and writes from it with no copy. Any other page (strided,
because the page dimension is not outermost, or on a GPU) goes through a host
staging block: pinned memory for CUDA pages, so the device copy is a DMA that can
overlap. A save copies pages into staging first; a load copies staging into pages
after the bytes arrived. Staging blocks are reused across calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool_client.connector.layout import KVLayout
from kvpool_client.core.errors import UsageError


class KVPages:
    """A KV cache tensor whose dimension ``page_dim`` indexes pages of one block each.

    Args:
        cache: the engine's KV cache (CPU or CUDA). Selecting one index of
            ``page_dim`` must give a tensor of ``layout.block_shape``.
        layout: the block layout; its dtype must be the cache's.
        page_dim: the dimension that indexes pages.

    Raises:
        UsageError: dtype or shape does not match the layout.
    """

    def __init__(self, cache: Any, layout: KVLayout, page_dim: int = 0) -> None:
        if cache.dtype != layout.torch_dtype():
            raise UsageError(f"KV cache dtype {cache.dtype} is not the layout's {layout.dtype}")
        page_shape = tuple(cache.select(page_dim, 0).shape) if cache.shape[page_dim] else None
        if page_shape is not None and page_shape != layout.block_shape:
            raise UsageError(f"a page has shape {page_shape}, the layout's block is {layout.block_shape}")
        self.cache = cache
        self.layout = layout
        self.page_dim = page_dim
        self.num_pages = int(cache.shape[page_dim])

    def view(self, page_id: int) -> Any:
        """Page ``page_id`` as a ``block_shape`` view of the cache (no copy).

        Raises:
            UsageError: ``page_id`` is out of range.
        """
        if not 0 <= page_id < self.num_pages:
            raise UsageError(f"page {page_id} out of range 0..{self.num_pages - 1}")
        return self.cache.select(self.page_dim, page_id)

    @property
    def direct(self) -> bool:
        """Whether pages are contiguous CPU memory the client can use without staging."""
        return self.cache.device.type == "cpu" and (self.num_pages == 0 or self.view(0).is_contiguous())


@dataclass(frozen=True, slots=True)
class Staged:
    """The buffers of one transfer: ``buffers[i]`` stands for ``pages[i]``."""

    pages: tuple[Any, ...]
    buffers: tuple[Any, ...]

    @property
    def copies(self) -> bool:
        """Whether the buffers are staging copies rather than the pages themselves."""
        return any(b is not p for b, p in zip(self.buffers, self.pages, strict=True))


class StagingArea:
    """Host staging blocks for pages the client cannot use directly; reused across calls.

    Args:
        pages: the KV cache.
    """

    def __init__(self, pages: KVPages) -> None:
        self._pages = pages
        self._spare: list[Any] = []

    def for_save(self, page_ids: Sequence[int]) -> Staged:
        """Buffers holding the bytes of ``page_ids``, ready to put (device copies finished)."""
        staged = self._stage(page_ids)
        if staged.copies:
            for page, buffer in zip(staged.pages, staged.buffers, strict=True):
                buffer.copy_(page, non_blocking=True)
            self._synchronize()
        return staged

    def for_load(self, page_ids: Sequence[int]) -> Staged:
        """Buffers to get into; call :meth:`finish_load` with the count that arrived."""
        return self._stage(page_ids)

    def finish_load(self, staged: Staged, count: int) -> None:
        """Copy the first ``count`` staged blocks into their pages (no-op when direct)."""
        if staged.copies:
            for page, buffer in zip(staged.pages[:count], staged.buffers[:count], strict=True):
                page.copy_(buffer, non_blocking=True)
            self._synchronize()

    def release(self, staged: Staged) -> None:
        """Return the staging blocks of a finished transfer for reuse."""
        if staged.copies:
            self._spare.extend(staged.buffers)

    def _stage(self, page_ids: Sequence[int]) -> Staged:
        views = tuple(self._pages.view(p) for p in page_ids)
        if self._pages.direct:
            return Staged(views, views)
        return Staged(views, tuple(self._take() for _ in views))

    def _take(self) -> Any:
        if self._spare:
            return self._spare.pop()
        import torch

        layout = self._pages.layout
        pinned = self._pages.cache.device.type == "cuda"
        return torch.empty(layout.block_shape, dtype=layout.torch_dtype(), pin_memory=pinned)

    def _synchronize(self) -> None:
        if self._pages.cache.device.type == "cuda":
            import torch

            torch.cuda.current_stream(self._pages.cache.device).synchronize()
