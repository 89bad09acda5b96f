"""TCP data-plane listener: accepts connections and hands each to a session."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from kvpool_client.transport.aio_socket import AsyncSocketChannel
from kvpool_client.transport.tcp import tune_socket

log = logging.getLogger("kvpool.data")

ConnectionHandler = Callable[[AsyncSocketChannel], Coroutine[Any, Any, None]]


class TcpListener:
    """Accepts connections and runs ``handler`` for each on its own task."""

    def __init__(self, host: str, port: int, handler: ConnectionHandler, stall_timeout: float | None) -> None:
        self._sock = socket.create_server((host, port), backlog=512, reuse_port=False)
        self._sock.setblocking(False)
        self._handler = handler
        self._stall_timeout = stall_timeout
        self._accept_task: asyncio.Task[None] | None = None
        self.connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def start(self) -> None:
        self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop())

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, addr = await loop.sock_accept(self._sock)
            tune_socket(sock)
            task = loop.create_task(self._serve(AsyncSocketChannel(sock, f"{addr[0]}:{addr[1]}", self._stall_timeout)))
            self.connections.add(task)
            task.add_done_callback(self.connections.discard)

    async def _serve(self, channel: AsyncSocketChannel) -> None:
        try:
            await self._handler(channel)
        except Exception:
            log.exception("connection handler failed", extra={"peer": channel.peer})
        finally:
            channel.close()

    async def stop_accepting(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
            await asyncio.gather(self._accept_task, return_exceptions=True)
        self._sock.close()
