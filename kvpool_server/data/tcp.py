"""TCP data-plane listener: accepts connections and hands each to a session."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from kvpool_client.transport.aio_socket import AsyncSocketChannel
from kvpool_client.transport.tcp import tune_socket
from kvpool_server.data.workers import LoopThread

log = logging.getLogger("kvpool.data")

_ACCEPT_RETRY_S = 0.1

ConnectionHandler = Callable[[AsyncSocketChannel], Coroutine[Any, Any, None]]


class TcpListener:
    """Accepts connections on the calling loop and serves each on a worker loop.

    Args:
        handler: runs one connection to its end, on the worker loop it was given to.
        workers: the loops connections are spread over, round robin.
        stall_timeout: most seconds a peer may stall mid-frame (see AsyncSocketChannel).
    """

    def __init__(
        self,
        host: str,
        port: int,
        handler: ConnectionHandler,
        workers: list[LoopThread],
        stall_timeout: float | None,
    ) -> None:
        self._sock = socket.create_server((host, port), backlog=512, reuse_port=False)
        self._sock.setblocking(False)
        self._handler = handler
        self._workers = itertools.cycle(workers)
        self._stall_timeout = stall_timeout
        self._accept_task: asyncio.Task[None] | None = None
        self.connections: set[concurrent.futures.Future[None]] = set()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def start(self) -> None:
        self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop())

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, addr = await loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and friends: back off, keep the listener alive
                log.error("accept failed", extra={"error": str(exc)})
                await asyncio.sleep(_ACCEPT_RETRY_S)
                continue
            tune_socket(sock)
            future = next(self._workers).submit(self._serve(sock, f"{addr[0]}:{addr[1]}"))
            self.connections.add(future)
            future.add_done_callback(self.connections.discard)

    async def _serve(self, sock: socket.socket, peer: str) -> None:
        channel = AsyncSocketChannel(sock, peer, self._stall_timeout)  # bound to this worker's loop
        try:
            await self._handler(channel)
        except Exception:
            log.exception("connection handler failed", extra={"peer": peer})
        finally:
            channel.close()

    async def stop_accepting(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
            await asyncio.gather(self._accept_task, return_exceptions=True)
        self._sock.close()

    async def close_connections(self, timeout: float) -> None:
        """Cancel every connection and wait, at most ``timeout`` seconds, for them to end."""
        pending = list(self.connections)
        for future in pending:
            future.cancel()
        if pending:
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: concurrent.futures.wait(pending, timeout=timeout)
            )
