"""Turn what engines hand us (torch tensors, numpy arrays, bytes) into flat byte views.

No copies: a view shares memory with the caller's object, so a get lands straight
in the caller's tensor and a put sends straight from it. Non-contiguous memory is
refused rather than silently gathered, because a strided view would send or
overwrite the wrong bytes.
"""

from __future__ import annotations

from typing import Any

from kvpool_client.core.errors import UsageError


def byte_view(obj: Any, *, writable: bool) -> memoryview:
    """A flat ``uint8`` memoryview over ``obj``'s memory.

    Args:
        obj: a CPU torch tensor, a numpy array, bytes, bytearray, memoryview, or any
            object with the buffer protocol.
        writable: require a writable buffer (the destination of a get).

    Raises:
        UsageError: a CUDA tensor, non-contiguous memory, or a read-only destination.
    """
    if _is_torch_tensor(obj):
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
