"""A SGLang host KV pool's pages as pool blocks, one per part (K and V, or MLA's latent cache).

A part's bytes are exactly what SGLang's own view of it holds (:mod:`.pools` says which
view), in that view's order, so the legacy (copying) interface and the zero-copy one store
the same bytes. A part lies in one of the pool's host buffers: most pools keep every part
in one ``kv_buffer``, pools with different K and V head sizes keep K and V in two. The
client reads into a part and writes from it where it lies
(:class:`~kvpool_client.integrations.regions.HostBlocks`): one span of the buffer in
``page_first``, ``page_first_direct`` and ``page_head``, one span per layer in
``layer_first``.

The geometry is measured once, from SGLang's views of a few pages, and each page's part is
then found by arithmetic: no torch call per page on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvpool_client.buffers import Target
from kvpool_client.core.errors import UsageError
from kvpool_client.integrations.regions import HostBlocks, Region, storage_bytes

PageView = Callable[[int], Sequence[torch.Tensor]]
"""The views of one page's parts, given the host index of its first token."""


def _spans(view: torch.Tensor) -> tuple[list[int], int]:
    """Where ``view``'s bytes lie: the first byte of each of its dense spans (from the start
    of its storage), in the view's element order, and a span's size."""
    shape, strides = view.shape, view.stride()
    dense = len(shape)  # the trailing dimensions [dense:] are one dense span
    run = 1
    while dense > 0 and (shape[dense - 1] == 1 or strides[dense - 1] == run):
        dense -= 1
        run *= shape[dense]
    starts = [int(view.storage_offset())]  # int(): torch types it int | SymInt, a symbol only while tracing
    for size, stride in zip(shape[:dense], strides[:dense], strict=True):
        starts = [start + index * stride for start in starts for index in range(size)]
    element = view.element_size()
    return [start * element for start in starts], run * element


class HostPages:
    """The pages of one host KV pool as pool blocks.

    Args:
        buffers: the host pool's buffers (every part of every page is a view of one of them).
        page_view: SGLang's view of each part of the page at a host index.
        page_size: tokens per page; host indices of page starts are multiples of it.
        capacity: host indices in the pool (pages start below it).

    Raises:
        UsageError: a buffer is not in CPU memory, a part is no view of one, or a part of
            successive pages is not evenly spaced (a layout this class cannot address).
    """

    def __init__(self, buffers: Sequence[torch.Tensor], page_view: PageView, page_size: int, capacity: int) -> None:
        for buffer in buffers:
            if buffer.device.type != "cpu":
                raise UsageError(f"the host KV pool is on {buffer.device}, not in CPU memory")
        self.buffers = tuple(buffers)
        self.page_size = page_size
        self._pages = capacity // page_size
        if self._pages < 1:
            raise UsageError(f"the host KV pool holds {capacity} tokens, less than one page of {page_size}")
        views = page_view(0)
        spans = [_spans(v) for v in views]
        steps = self._page_steps(page_view, spans)
        self._parts = [
            HostBlocks([Region(_storage_of(view, buffers), start, step, size) for start in starts])
            for view, (starts, size), step in zip(views, spans, steps, strict=True)
        ]
        self.part_nbytes = tuple(part.nbytes for part in self._parts)

    def _page_steps(self, page_view: PageView, spans: list[tuple[list[int], int]]) -> list[int]:
        """Bytes between each part of a page and the next page's; checked at pages 1, 2 and the last."""
        probes = sorted({1, min(2, self._pages - 1), self._pages - 1} - {0})
        if not probes:
            return [0] * len(spans)
        steps = [_spans(v)[0][0] - starts[0] for v, (starts, _) in zip(page_view(self.page_size), spans, strict=True)]
        for page in probes:
            for (starts, size), step, view in zip(spans, steps, page_view(page * self.page_size), strict=True):
                if _spans(view) != ([start + page * step for start in starts], size):
                    raise UsageError(f"host KV pool page {page} is not where its layout predicts")
        return steps

    @property
    def dense(self) -> bool:
        """Whether every part is one span of its buffer (else the client moves it as one I/O vector)."""
        return all(part.direct for part in self._parts)

    def page_starts(self, host_indices: torch.Tensor, pages: int) -> list[int | None]:
        """The first host index of each of ``pages`` pages, None where it is no page start.

        ``host_indices`` holds ``pages * page_size`` token slots, page after page.
        """
        if host_indices.numel() != pages * self.page_size:
            return [None] * pages
        starts = host_indices[:: self.page_size].tolist()
        return [s if s % self.page_size == 0 and 0 <= s < self._pages * self.page_size else None for s in starts]

    def blocks(self, starts: Sequence[int]) -> list[Target]:
        """Every part of the pages at ``starts``, page after page, where it lies in the host pool."""
        return [part.target(start // self.page_size) for start in starts for part in self._parts]


def _storage_of(view: torch.Tensor, buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """The whole storage of the buffer ``view`` lies in, as uint8 (a part's offsets count from its start).

    Raises:
        UsageError: ``view`` lies in none of ``buffers``.
    """
    pointer = view.untyped_storage().data_ptr()
    for buffer in buffers:
        if buffer.untyped_storage().data_ptr() == pointer:
            return storage_bytes(buffer)
    raise UsageError("a page of the host KV pool is not a view of its host buffers")
