"""Ordering the connector's copies after vLLM's own work on the device.

vLLM launches a step's work on its own CUDA stream and calls the connector while the kernels
may still run: at ``wait_for_save`` attention may not have written the step's blocks yet, and
at ``start_load_kv`` the zeroing of newly allocated blocks may be queued still. A copy issued
on another stream (the transfer threads' streams) without an order could read a block before
it is written, or write one that the zeroing then clears.

So the thread vLLM calls records an event on its current stream (:meth:`CudaOrder.mark`),
and a transfer thread issues its copies on a stream of its own that first waits for that
event, then waits for its copies to end before the bytes leave for the pool or a load is
reported (:meth:`CudaOrder.after`). On the CPU every copy is synchronous: nothing to order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

import torch

from kvpool_client.core.errors import UsageError


class CopyOrder(Protocol):
    """Orders a transfer thread's copies after the work queued when the engine called us."""

    def mark(self) -> Any:
        """On the engine's thread: a marker of the work queued so far on its current stream."""

    def after(self, mark: Any) -> AbstractContextManager[None]:
        """On a transfer thread: copies issued inside run after ``mark``, and have ended on exit."""


class HostOrder:
    """A CPU cache: copies are synchronous and follow the forward pass by themselves."""

    def mark(self) -> None:
        return None

    def after(self, mark: None) -> AbstractContextManager[None]:
        return nullcontext()


class CudaOrder:
    """A GPU cache: an event on the engine's stream, waited for by each transfer thread's stream.

    Args:
        device: the cache's CUDA device.
        cuda: the ``torch.cuda`` API (a test passes a recording double of it).
    """

    def __init__(self, device: torch.device, cuda: Any = None) -> None:
        self._device = device
        self._cuda = torch.cuda if cuda is None else cuda
        self._local = threading.local()  # one stream a transfer thread

    def mark(self) -> Any:
        event = self._cuda.Event()
        event.record(self._cuda.current_stream(self._device))
        return event

    @contextmanager
    def after(self, mark: Any) -> Iterator[None]:
        stream = self._stream()
        stream.wait_event(mark)
        try:
            with self._cuda.stream(stream):
                yield
        finally:  # also on failure: nothing of ours may still write once vLLM recomputes a block
            stream.synchronize()

    def _stream(self) -> Any:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = self._cuda.Stream(self._device)
        return stream


def copy_order(device: torch.device) -> CopyOrder:
    """The order for a cache on ``device``: CPU or CUDA (ROCm counts as CUDA in torch).

    Raises:
        UsageError: another device, whose streams the connector does not order.
    """
    if device.type == "cpu":
        return HostOrder()
    if device.type == "cuda":
        return CudaOrder(device)
    raise UsageError(f"KVPoolConnector supports KV caches on the CPU or CUDA devices, not {device.type}")
