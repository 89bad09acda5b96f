"""The ``ucx`` transport of the clients: data-plane connections over UCX (ucxx).

UCX moves block bytes over shared memory between processes of one node, over TCP
between nodes here, and over RDMA on InfiniBand/RoCE clusters (docs/transports.md).
The channel itself (framing, progress) is :mod:`kvpool_client.core.channels.ucx_channel`;
this module adapts it to the blocking and the asyncio client.

A UCX worker must be progressed by one thread, while a client's requests come
from many threads and event loops. So each client owns one :class:`UcxEngine`:
a thread running an event loop with one UCX worker; every connection of that
client lives there, and each I/O step of an exchange is handed to it. The engine
starts on the first ucx connection and stops with the client (or at exit), after
aborting its connections: nothing is left posted into a caller's buffer.

ucxx is imported only when a node is first dialled over ucx: without it
installed (kvpool's ``ucx`` extra), ``auto`` uses tcp and ``ucx`` fails
those nodes with ``UNAVAILABLE``. A UCX worker cannot cross ``fork``: an engine
used from a forked child refuses (start such workers with ``spawn``).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kvpool_client.core.channels.tcp import parse_address
from kvpool_client.core.channels.ucx_builds import nixl_build
from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable, RequestTimeout, UsageError
from kvpool_client.exchange import Exchange, run_async

if TYPE_CHECKING:
    from kvpool_client.core.channels.ucx_channel import UcxChannel, UcxSettings, WorkerPump

T = TypeVar("T")
_STOP_TIMEOUT_S = 2.0
_MARGIN_S = 1.0  # the engine enforces deadlines; the caller waits this much longer before giving up on it


class UcxUnavailable(KVPoolError):
    """The ucx transport cannot be used here (ucxx missing, a forked child, the node offers none)."""

    code = ErrorCode.UNAVAILABLE


@functools.cache
def import_error() -> str | None:
    """Why ucxx cannot be used here, or None when it can (asked once per process): it does not
    import, or NIXL's UCX is loaded already (two UCX builds cannot share a process:
    :mod:`kvpool_client.core.channels.ucx_builds`)."""
    nixl = nixl_build()
    if nixl is not None:
        return f"NIXL's UCX is loaded in this process already ({nixl}: the nixl transport)"
    try:
        import kvpool_client.core.channels.ucx_channel  # noqa: F401 - imports ucxx
    except Exception as exc:  # ImportError, or a broken native library
        return f"{type(exc).__name__}: {exc}"
    return None


def settings_from_env() -> UcxSettings:
    """The client's UCX settings: ``KVPOOL_UCX_TLS``, ``KVPOOL_UCX_PROGRESS_MODE`` over the defaults."""
    from kvpool_client.core.channels.ucx_channel import UcxSettings

    return UcxSettings(
        tls=os.environ.get("KVPOOL_UCX_TLS", "tcp,sm"),
        progress_mode=os.environ.get("KVPOOL_UCX_PROGRESS_MODE", "blocking"),
    )


class UcxEngine:
    """A thread with an event loop and one UCX worker, serving one client's ucx connections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pump: WorkerPump | None = None
        self._pid = os.getpid()
        self._channels: weakref.WeakSet[UcxChannel] = weakref.WeakSet()
        self._closed = False

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run ``coro`` on the engine and wait for it from this (any other) thread."""
        future = self._submit(coro)
        done, _ = concurrent.futures.wait([future], None if timeout is None else timeout + _MARGIN_S)
        if not done:  # the engine enforces deadlines itself: this one is stuck
            future.cancel()
            raise RequestTimeout("the ucx engine did not answer in time")
        return future.result()

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine and await it from another event loop."""
        return await asyncio.wrap_future(self._submit(coro))

    async def open(self, address: str, timeout: float, stall_timeout: float | None) -> UcxChannel:
        """(On the engine) a connected channel to ``address``."""
        from kvpool_client.core.channels.ucx_channel import connect

        host, port = parse_address(address)
        assert self._pump is not None
        try:
            channel = await connect(self._pump, host, port, timeout, stall_timeout)
        except TimeoutError as exc:
            raise NodeUnavailable(f"ucx hello with {address} timed out after {timeout}s") from exc
        self._channels.add(channel)
        return channel

    def close(self) -> None:
        """Abort every connection, stop the worker and the thread (idempotent)."""
        with self._lock:
            loop, thread, self._closed = self._loop, self._thread, True
        if loop is None or thread is None or os.getpid() != self._pid:
            return
        if loop.is_running():
            done = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                done.result(_STOP_TIMEOUT_S)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(_STOP_TIMEOUT_S)
        atexit.unregister(self.close)  # the hook held the engine: let the worker and its memory go
        if not thread.is_alive():
            loop.close()
            self._pump = None

    async def _shutdown(self) -> None:
        for channel in list(self._channels):
            channel.close()
        if self._pump is not None:
            self._pump.close()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            loop = self._started()
        except BaseException:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def _started(self) -> asyncio.AbstractEventLoop:
        if os.getpid() != self._pid:
            raise UcxUnavailable("UCX cannot be used in a forked child: start worker processes with spawn")
        with self._lock:
            if self._closed:
                raise NodeUnavailable("the client is closed")
            if self._loop is None:
                reason = import_error()
                if reason is not None:
                    raise UcxUnavailable(f"ucxx cannot be imported ({reason}); pip install 'kvpool[ucx]'")
                self._loop = self._start_thread()
                atexit.register(self.close)  # before the interpreter tears down what UCX still uses
            return self._loop

    def _start_thread(self) -> asyncio.AbstractEventLoop:
        from kvpool_client.core.channels.ucx_channel import WorkerPump

        loop = asyncio.new_event_loop()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._pump = loop.run_until_complete(_make_pump(WorkerPump, settings_from_env()))
            except Exception as exc:  # handed to the thread that waits for the start
                ready.set_exception(exc)
                return
            ready.set_result(None)
            loop.run_forever()

        self._thread = threading.Thread(target=main, name="kvpool-ucx", daemon=True)
        self._thread.start()
        try:
            ready.result(_STOP_TIMEOUT_S * 5)
        except UsageError:
            raise
        except Exception as exc:
            raise UcxUnavailable(f"cannot start UCX: {exc}") from exc
        return loop


async def _make_pump(factory: Any, settings: UcxSettings) -> WorkerPump:
    return factory(settings)  # type: ignore[no-any-return]


class UcxConnection:
    """A blocking ucx connection for :class:`~kvpool_client.KVPoolClient` (the TcpConnection interface).

    Each request is bounded by one deadline from :meth:`start_request`, enforced
    on the engine; on expiry the connection is aborted and RequestTimeout raised.
    """

    def __init__(self, engine: UcxEngine, address: str, timeout: float, connect_timeout: float) -> None:
        self.address = address
        self._engine = engine
        self._timeout = timeout
        self._channel = engine.run(engine.open(address, connect_timeout, None), connect_timeout)

    def start_request(self) -> None:
        self._channel.deadline = time.monotonic() + self._timeout

    def run(self, exchange: Exchange[T]) -> T:
        """Drive a whole exchange on the engine: one hand-off per request instead of one per I/O step."""
        return self._call(run_async(self._channel, exchange))

    def send(self, buffers: list[bytes | memoryview]) -> None:
        self._call(self._channel.send(buffers))

    def recv_into(self, targets: list[memoryview]) -> None:
        self._call(self._channel.recv_into(targets))

    def recv_exactly(self, nbytes: int) -> bytearray:
        return self._call(self._channel.recv_exactly(nbytes))

    def recv_upto(self, nbytes: int) -> bytes:
        return self._call(self._channel.recv_upto(nbytes))

    def reusable(self) -> bool:
        return self._channel.reusable()

    def close(self) -> None:
        """Abort the connection; waits (briefly) until nothing is posted into a caller's buffer."""
        close_on_engine(self._engine, self._channel)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return self._engine.run(coro, self._timeout)
        except TimeoutError as exc:
            raise RequestTimeout(f"ucx request to {self.address} timed out after {self._timeout}s") from exc


class AsyncUcxConnection:
    """An asyncio ucx connection for :class:`~kvpool_client.AsyncKVPoolClient`; I/O runs on the engine."""

    def __init__(self, engine: UcxEngine, address: str, channel: UcxChannel) -> None:
        self.address = address
        self._engine = engine
        self._channel = channel

    @classmethod
    async def open(cls, engine: UcxEngine, address: str, connect_timeout: float) -> AsyncUcxConnection:
        channel = await engine.run_async(engine.open(address, connect_timeout, None))
        return cls(engine, address, channel)

    async def run(self, exchange: Exchange[T]) -> T:
        """Drive a whole exchange on the engine: one hand-off per request instead of one per I/O step."""
        return await self._engine.run_async(run_async(self._channel, exchange))

    async def send(self, buffers: Sequence[bytes | memoryview]) -> None:
        await self._engine.run_async(self._channel.send(buffers))

    async def recv_into(self, targets: Sequence[memoryview]) -> None:
        await self._engine.run_async(self._channel.recv_into(targets))

    async def recv_exactly(self, nbytes: int) -> bytearray:
        return await self._engine.run_async(self._channel.recv_exactly(nbytes))

    async def recv_upto(self, nbytes: int) -> bytes:
        return await self._engine.run_async(self._channel.recv_upto(nbytes))

    def reusable(self) -> bool:
        return self._channel.reusable()

    def close(self) -> None:
        """Abort the connection; waits (briefly) until nothing is posted into a caller's buffer."""
        close_on_engine(self._engine, self._channel)


def close_on_engine(engine: UcxEngine, channel: UcxChannel) -> None:
    """Close ``channel`` on its engine, after any cancellation already queued there; errors are moot now."""
    with contextlib.suppress(KVPoolError):
        engine.run(_close(channel), _STOP_TIMEOUT_S)


async def _close(channel: UcxChannel) -> None:
    channel.close()
