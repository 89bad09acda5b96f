"""TCP data-plane transport: a listener and a thin channel over a raw socket."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from kvpool_client.transport.aio_socket import recv_all_into, recv_exactly, send_all

log = logging.getLogger("kvpool.data")

# Large kernel buffers let one sendmsg hand over a whole block and cut wake-ups.
SOCKET_BUFFER_BYTES = 4 << 20


def tune_socket(sock: socket.socket) -> None:
    """Low latency for small frames, big buffers for block payloads."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


class TcpChannel:
    """Ordered bytes over one non-blocking TCP socket on the running loop."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self.peer = peer

    async def send(self, buffers: list[bytes | memoryview]) -> None:
        await send_all(self._loop, self._sock, buffers)

    async def recv_into(self, targets: list[memoryview]) -> None:
        await recv_all_into(self._loop, self._sock, targets)

    async def recv_exactly(self, nbytes: int) -> bytearray:
        return await recv_exactly(self._loop, self._sock, nbytes)

    def close(self) -> None:
        self._sock.close()


ConnectionHandler = Callable[[TcpChannel], Coroutine[Any, Any, None]]


class TcpListener:
    """Accepts connections and runs ``handler`` for each on its own task."""

    def __init__(self, host: str, port: int, handler: ConnectionHandler) -> None:
        self._sock = socket.create_server((host, port), backlog=512, reuse_port=False)
        self._sock.setblocking(False)
        self._handler = handler
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
            sock.setblocking(False)
            tune_socket(sock)
            task = loop.create_task(self._serve(TcpChannel(sock, f"{addr[0]}:{addr[1]}")))
            self.connections.add(task)
            task.add_done_callback(self.connections.discard)

    async def _serve(self, channel: TcpChannel) -> None:
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
