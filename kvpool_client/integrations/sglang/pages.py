"""A SGLang host KV pool's pages as pool blocks, one per part (K and V, or MLA's latent cache).

A part's bytes are exactly what SGLang's own view of it holds (:mod:`.pools` says which
view), in that view's order, so the legacy (copying) interface and the zero-copy one store
the same bytes. A part lies in one of the pool's host buffers: most pools keep every part
in one ``kv_buffer``, pools with different K and V head sizes keep K and V in two. Where a
part is one dense span of its buffer (``page_first``, ``page_first_direct``, ``page_head``)
the client reads into it and writes from it directly. Otherwise (``layer_first``: a part is
one span per layer) a save gathers the part into a staging buffer and a load scatters it
back: one strided numpy copy each way.

The geometry is measured once, from SGLang's views of three pages, and each page's part is
then found by arithmetic: no torch call per page on the hot path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvpool_client.core.errors import UsageError

PageView = Callable[[int], Sequence[torch.Tensor]]
"""The views of one page's parts, given the host index of its first token."""


@dataclass(frozen=True, slots=True)
class PartGeometry:
    """Where a part of the page at host index 0 lies in the host buffer, as bytes.

    Attributes:
        offset: its first byte, from the start of its buffer's storage.
        shape, strides: its bytes as a strided array (the last dimension: one element's bytes).
        nbytes: its size.
        dense: whether it is one contiguous span (then it moves with no copy).
    """

    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    nbytes: int
    dense: bool


def _geometry(view: torch.Tensor) -> PartGeometry:
    size = view.element_size()
    shape = (*view.shape, size)
    strides = (*(s * size for s in view.stride()), 1)
    nbytes = view.numel() * size
    dense = view.is_contiguous()
    # int(): torch types the offset as int | SymInt, a symbol only while tracing
    return PartGeometry(int(view.storage_offset()) * size, shape, strides, nbytes, dense)


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
        self.page_size = page_size
        self._pages = capacity // page_size
        if self._pages < 1:
            raise UsageError(f"the host KV pool holds {capacity} tokens, less than one page of {page_size}")
        views = page_view(0)
        # Each part's bytes as a numpy array over its buffer's whole storage.
        self._raw = tuple(_storage_bytes(view, buffers) for view in views)
        self._bytes = tuple(raw.data for raw in self._raw)
        self.parts = [_geometry(v) for v in views]
        self.part_nbytes = tuple(p.nbytes for p in self.parts)
        self._steps = self._page_steps(page_view)
        self._staging = _Staging()

    def _page_steps(self, page_view: PageView) -> tuple[int, ...]:
        """Bytes between each part of a page and the next page's; checked at pages 1, 2 and the last."""
        probes = sorted({1, min(2, self._pages - 1), self._pages - 1} - {0})
        if not probes:
            return (0,) * len(self.parts)
        steps = tuple(
            _geometry(v).offset - p.offset for v, p in zip(page_view(self.page_size), self.parts, strict=True)
        )
        for page in probes:
            for part, step, view in zip(self.parts, steps, page_view(page * self.page_size), strict=True):
                found = _geometry(view)
                want = part.offset + page * step
                if (found.offset, found.shape, found.strides) != (want, part.shape, part.strides):
                    raise UsageError(f"host KV pool page {page} is not where its layout predicts")
        return steps

    @property
    def dense(self) -> bool:
        """Whether every part moves with no copy."""
        return all(p.dense for p in self.parts)

    def page_starts(self, host_indices: torch.Tensor, pages: int) -> list[int | None]:
        """The first host index of each of ``pages`` pages, None where it is no page start.

        ``host_indices`` holds ``pages * page_size`` token slots, page after page.
        """
        if host_indices.numel() != pages * self.page_size:
            return [None] * pages
        starts = host_indices[:: self.page_size].tolist()
        return [s if s % self.page_size == 0 and 0 <= s < self._pages * self.page_size else None for s in starts]

    def dense_view(self, start: int, part: int) -> memoryview:
        """Part ``part`` of the page at ``start``, as the host buffer's own bytes (dense parts only)."""
        geometry = self.parts[part]
        at = geometry.offset + (start // self.page_size) * self._steps[part]
        return self._bytes[part][at : at + geometry.nbytes]

    def strided(self, start: int, part: int) -> np.ndarray:
        """Part ``part`` of the page at ``start``, as a strided uint8 array over the host buffer."""
        geometry = self.parts[part]
        at = geometry.offset + (start // self.page_size) * self._steps[part]
        return np.lib.stride_tricks.as_strided(self._raw[part][at:], geometry.shape, geometry.strides)

    def blocks(self, starts: Sequence[int], gather: bool) -> tuple[list[memoryview | torch.Tensor], list[torch.Tensor]]:
        """One buffer per part of each page: the page's own memory where the part is dense,
        else a staging buffer (filled from the page when ``gather``: a save).

        Returns:
            The buffers, page after page; and the staging buffers among them, to hand back
            with :meth:`release` (after :meth:`scatter` for a load).
        """
        buffers: list[memoryview | torch.Tensor] = []
        staged: list[torch.Tensor] = []
        for start in starts:
            for part, geometry in enumerate(self.parts):
                if geometry.dense:
                    buffers.append(self.dense_view(start, part))
                    continue
                buffer = self._staging.take(geometry.nbytes)
                if gather:
                    np.copyto(buffer.numpy().reshape(geometry.shape), self.strided(start, part))
                buffers.append(buffer)
                staged.append(buffer)
        return buffers, staged

    def scatter(
        self, starts: Sequence[int], buffers: Sequence[memoryview | torch.Tensor], arrived: Sequence[bool]
    ) -> None:
        """Copy the staged parts of the pages that ``arrived`` into the host pool."""
        parts = len(self.parts)
        for page, start in enumerate(starts):
            if not arrived[page]:
                continue
            for part, geometry in enumerate(self.parts):
                if not geometry.dense:
                    staged = buffers[page * parts + part]
                    assert isinstance(staged, torch.Tensor)
                    np.copyto(self.strided(start, part), staged.numpy().reshape(geometry.shape))

    def release(self, staged: Sequence[torch.Tensor]) -> None:
        self._staging.give_back(staged)


def _storage_bytes(view: torch.Tensor, buffers: Sequence[torch.Tensor]) -> np.ndarray:
    """The whole storage of the buffer ``view`` lies in, as uint8 (a part's offsets count from its start).

    Raises:
        UsageError: ``view`` lies in none of ``buffers``.
    """
    pointer = view.untyped_storage().data_ptr()
    for buffer in buffers:
        storage = buffer.untyped_storage()
        if storage.data_ptr() == pointer:
            array: np.ndarray = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            return array
    raise UsageError("a page of the host KV pool is not a view of its host buffers")


class _Staging:
    """Reusable staging buffers (torch allocates them 64-byte aligned: fast memcpy), shared by
    SGLang's storage threads."""

    _MAX_SPARE = 512

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: dict[int, list[torch.Tensor]] = {}

    def take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            spare = self._spare.get(nbytes)
            if spare:
                return spare.pop()
        return torch.empty(nbytes, dtype=torch.uint8)

    def give_back(self, buffers: Sequence[torch.Tensor]) -> None:
        with self._lock:
            for buffer in buffers:
                spare = self._spare.setdefault(buffer.numel(), [])
                if len(spare) < self._MAX_SPARE:
                    spare.append(buffer)
