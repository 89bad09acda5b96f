"""Turn what engines hand us (torch tensors, numpy arrays, bytes) into flat byte views.

No copies: a view shares memory with the caller's object, so a get lands straight
in the caller's tensor and a put sends straight from it. Non-contiguous memory is
refused rather than silently gathered, because a strided view would send or
overwrite the wrong bytes.

A block an engine keeps in several spans of memory (a cache whose layers lie apart)
is a :class:`Regions`: a get scatters the block into its spans and a put gathers it
from them, still without a copy (a socket takes the spans as one I/O vector, a
same-node read copies each span out of the arena).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from kvpool_client.core.errors import UsageError


@dataclass(frozen=True, slots=True, eq=False)
class Regions:
    """One block held in several spans of memory, in the block's byte order. Build with :func:`regions`.

    Attributes:
        views: the spans, flat ``uint8`` views; together they hold the block.
        nbytes: the block's size, the spans' total.
        writable: whether every span may be written (a get's destination).
    """

    views: tuple[memoryview, ...]
    nbytes: int
    writable: bool

    def __len__(self) -> int:
        return self.nbytes


Target = memoryview | Regions
"""Where a block is read into or sent from: one span of memory, or several."""


def regions(parts: Sequence[Any], *, writable: bool) -> Regions:
    """One block from its spans, in order: each part is checked as :func:`byte_view` checks a buffer.

    Raises:
        UsageError: no part, or a part :func:`byte_view` refuses.
    """
    views = tuple(byte_view(part, writable=writable) for part in parts)
    if not views:
        raise UsageError("a block needs at least one region")
    return Regions(views, sum(len(v) for v in views), writable)


def spans(target: Target) -> Sequence[memoryview]:
    """The spans a block goes into or comes from, in order."""
    return target.views if isinstance(target, Regions) else (target,)


def checksum(target: Target) -> int:
    """The block's xxh3-64 (the node's checksum of a stored block), over all its spans."""
    if not isinstance(target, Regions):
        return xxhash.xxh3_64_intdigest(target)
    digest = xxhash.xxh3_64()
    for view in target.views:
        digest.update(view)
    return digest.intdigest()


def target_of(obj: Any, writable: bool) -> Target:
    """A block's buffer as a :data:`Target`: a :class:`Regions` as it is, anything else as :func:`byte_view`.

    Raises:
        UsageError: as :func:`byte_view`; or read-only regions as a get's destination.
    """
    if not isinstance(obj, Regions):
        return byte_view(obj, writable)
    if writable and not obj.writable:
        raise UsageError("destination regions are read-only (build them with writable=True)")
    return obj


def byte_view(obj: Any, writable: bool) -> memoryview:
    """A flat ``uint8`` memoryview over ``obj``'s memory.

    Args:
        obj: a CPU torch tensor, a numpy array, bytes, bytearray, memoryview, or any
            object with the buffer protocol.
        writable: require a writable buffer (the destination of a get).

    Raises:
        UsageError: a CUDA tensor, non-contiguous memory, or a read-only destination.
    """
    if type(obj) not in _PLAIN_BUFFERS and _is_torch_tensor(obj):
        return _tensor_view(obj, writable)
    try:
        view = memoryview(obj)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{type(obj).__name__} does not expose a buffer: {exc}") from exc
    if not view.c_contiguous:
        raise UsageError("buffer is not C-contiguous; pass a contiguous copy")
    if writable and view.readonly:
        raise UsageError(f"destination {type(obj).__name__} is read-only")
    if view.format == "B" and view.ndim == 1:
        return view
    if not view.nbytes:
        return memoryview(b"") if not writable else memoryview(bytearray())
    return view.cast("B")


_PLAIN_BUFFERS = frozenset({bytearray, memoryview, bytes})  # no tensor: the probe below is skipped


def _is_torch_tensor(obj: Any) -> bool:
    # Avoid importing torch: the client works without it.
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _tensor_view(tensor: Any, writable: bool) -> memoryview:
    try:
        # The usual tensor (CPU, numpy's dtypes, no grad) in one call: a fifth of the checks' cost.
        array = tensor.numpy()
    except (RuntimeError, TypeError):  # on a GPU, requires grad, bfloat16, lazy views: checked one by one
        return _checked_tensor_view(tensor, writable)
    view = memoryview(array)
    if not view.c_contiguous:
        raise UsageError("tensor is not contiguous; call .contiguous() first")
    if view.ndim == 1 and view.format == "B":
        return view
    return view.cast("B") if view.nbytes else memoryview(bytearray())  # no cast with a zero in the shape


def _checked_tensor_view(tensor: Any, writable: bool) -> memoryview:
    if tensor.device.type != "cpu":
        raise UsageError(f"tensor is on {tensor.device}; stage it through pinned host memory")
    if not tensor.is_contiguous():
        raise UsageError("tensor is not contiguous; call .contiguous() first")
    if writable and tensor.requires_grad:
        raise UsageError("destination tensor requires grad")
    flat = tensor.detach().reshape(-1)
    try:
        # Any dtype (bfloat16 included) reinterpreted as bytes, sharing storage.
        return memoryview(flat.view(__import__("torch").uint8).numpy())
    except (RuntimeError, TypeError) as exc:  # conjugate or other lazy views
        raise UsageError(f"tensor cannot be viewed as bytes: {exc}") from exc
