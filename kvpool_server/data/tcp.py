"""TCP data-plane listener: accepts connections and hands each to a session."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

from kvpool_client.core.channels.aio_socket import AsyncSocketChannel
from kvpool_client.core.channels.tcp import tune_socket
from kvpool_client.core.channels.tls import AsyncTlsChannel
from kvpool_client.core.errors import NodeUnavailable
from kvpool_server.data.workers import LoopThread, cancel_and_wait

log = logging.getLogger("kvpool.data")

_ACCEPT_RETRY_S = 0.1

ConnectionHandler = Callable[[AsyncSocketChannel | AsyncTlsChannel], Coroutine[Any, Any, None]]


class TcpListener:
    """Accepts connections on the calling loop and serves each on a worker loop.

    Args:
        handler: runs one connection to its end, on the worker loop it was given to.
        workers: the loops connections are spread over, round robin.
        stall_timeout: most seconds a peer may stall mid-frame (see AsyncSocketChannel).
        tls: the current server context, asked at each connection; set, every
            connection must open with a TLS handshake.
    """

    def __init__(
        self,
        host: str,
        port: int,
        handler: ConnectionHandler,
        workers: list[LoopThread],
        stall_timeout: float | None,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self._sock = socket.create_server((host, port), backlog=512, reuse_port=False)
        self._sock.setblocking(False)
        self._handler = handler
        self._workers = itertools.cycle(workers)
        self._stall_timeout = stall_timeout
        self._tls = tls
        self._accept_task: asyncio.Task[None] | None = None
        self.connections: set[concurrent.futures.Future[None]] = set()

    @property
    def port(self) -> int:
        port: int = self._sock.getsockname()[1]
        return port

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
            try:
                tune_socket(sock)
            except OSError as exc:  # reset by the peer already: nothing to serve
                log.info("connection lost at accept", extra={"peer": f"{addr[0]}:{addr[1]}", "error": str(exc)})
                sock.close()
                continue
            future = next(self._workers).submit(self._serve(sock, f"{addr[0]}:{addr[1]}"))
            self.connections.add(future)
            future.add_done_callback(self.connections.discard)

    async def _serve(self, sock: socket.socket, peer: str) -> None:
        raw = AsyncSocketChannel(sock, peer, self._stall_timeout)  # bound to this worker's loop
        try:
            channel = raw if self._tls is None else await self._secure(raw)
            if channel is not None:
                await self._handler(channel)
        except Exception:
            log.exception("connection handler failed", extra={"peer": peer})
        finally:
            raw.close()

    async def _secure(self, raw: AsyncSocketChannel) -> AsyncTlsChannel | None:
        """The TLS channel over ``raw``; None when the peer failed the handshake (logged)."""
        assert self._tls is not None
        try:
            context = await asyncio.to_thread(self._tls)  # stats the certificate files, reloads them if changed
            return await AsyncTlsChannel.accept(raw, context)
        except (NodeUnavailable, TimeoutError) as exc:
            log.info("TLS handshake failed", extra={"peer": raw.peer, "error": str(exc)})
            return None

    async def stop_accepting(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
            await asyncio.gather(self._accept_task, return_exceptions=True)
        self._sock.close()

    async def close_connections(self, timeout: float) -> None:
        """Cancel every connection and wait, at most ``timeout`` seconds, for them to end."""
        await cancel_and_wait(self.connections, timeout)
