"""UCX data-plane listener: UCX connections served by the same sessions as TCP ones.

Every UCX connection lives on one dedicated loop thread (``kvpool-ucx``) that owns
the daemon's UCX worker: a UCX worker is progressed by one thread only. Sessions
receive puts straight into arena slots and send gets straight from them, as over
TCP (:class:`~kvpool_client.core.channels.ucx_channel.UcxChannel` passes the arena's
memoryviews to UCX). The framing and the progress engine are described in
:mod:`kvpool_client.core.channels.ucx_channel`.

UCX's listener binds every interface (ucxx takes no address); clients are
authenticated by the session (HELLO with the cluster's token) like over TCP.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from kvpool_client.core.channels.ucx_channel import UcxChannel, UcxSettings, WorkerPump, hello, listen
from kvpool_client.core.errors import KVPoolError
from kvpool_server.data.workers import LoopThread, cancel_and_wait

log = logging.getLogger("kvpool.data")

_START_TIMEOUT_S = 10.0
_HELLO_TIMEOUT_S = 5.0

ConnectionHandler = Callable[[UcxChannel], Coroutine[Any, Any, None]]


class UcxListener:
    """Accepts UCX connections on its own loop thread and runs ``handler`` on each.

    Args:
        port: the port to listen on; 0 picks a free one.
        handler: runs one connection to its end (the daemon's session).
        settings: UCX transports and progress mode.
        stall_timeout: most seconds a peer may stall mid-frame.
        max_segment: the largest message a peer may announce (the frame limit).

    Raises:
        KVPoolError: (from :meth:`start`) UCX could not start or bind the port.
    """

    def __init__(
        self,
        port: int,
        handler: ConnectionHandler,
        settings: UcxSettings,
        stall_timeout: float | None,
        max_segment: int,
    ) -> None:
        self._requested_port = port
        self._handler = handler
        self._settings = settings
        self._stall_timeout = stall_timeout
        self._max_segment = max_segment
        self._thread = LoopThread("kvpool-ucx")
        self._pump: WorkerPump | None = None
        self._listener: Any = None
        self._ids = itertools.count(1)
        self.port = 0
        self.connections: set[concurrent.futures.Future[None]] = set()

    def start(self) -> None:
        """Start the loop thread, the UCX worker and the listener (blocks until bound)."""
        self._thread.start()
        try:
            self._thread.submit(self._open()).result(_START_TIMEOUT_S)
        except Exception as exc:
            self._thread.stop(1.0)
            raise KVPoolError(f"cannot start the ucx listener on port {self._requested_port}: {exc}") from exc

    async def _open(self) -> None:
        self._pump = WorkerPump(self._settings)
        self._listener = listen(self._pump, self._requested_port, self._on_connection)
        self.port = int(self._listener.port)

    def _on_connection(self, endpoint: Any) -> None:
        """Called by UCX during progress, on the loop thread."""
        future = self._thread.submit(self._serve(endpoint, f"ucx#{next(self._ids)}"))
        self.connections.add(future)
        future.add_done_callback(self.connections.discard)

    async def _serve(self, endpoint: Any, peer: str) -> None:
        assert self._pump is not None
        try:
            peer_base, mine = await hello(self._pump, endpoint, initiator=False, timeout=_HELLO_TIMEOUT_S)
        except (KVPoolError, TimeoutError) as exc:
            log.info("ucx hello failed", extra={"peer": peer, "error": str(exc)})
            return
        channel = UcxChannel(self._pump, endpoint, peer_base, mine, peer, self._stall_timeout, self._max_segment)
        try:
            await self._handler(channel)
        except Exception:
            log.exception("connection handler failed", extra={"peer": peer})
        finally:
            channel.close()

    async def stop_accepting(self) -> None:
        """Close the listening port; connections go on."""
        if self._pump is not None:
            await asyncio.wrap_future(self._thread.submit(self._close_listener()))

    async def _close_listener(self) -> None:
        self._listener = None  # ucxx stops listening when the listener is released

    async def close_connections(self, timeout: float) -> None:
        """Cancel every connection and wait, at most ``timeout`` seconds, for them to end."""
        await cancel_and_wait(self.connections, timeout)

    def stop(self, timeout: float) -> None:
        """Stop the worker and the loop thread (after :meth:`close_connections`)."""
        if self._pump is not None:
            try:
                self._thread.submit(self._close_pump()).result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError):
                log.warning("the ucx worker did not stop in time")
        self._thread.stop(timeout)

    async def _close_pump(self) -> None:
        assert self._pump is not None
        self._pump.close()
