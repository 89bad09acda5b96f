"""Scatter/gather I/O on non-blocking sockets for an asyncio (uvloop) event loop.

asyncio streams copy every chunk into their own buffer and were ten times slower
than raw sockets here for large messages. These helpers call ``sendmsg`` and
``recvmsg_into`` directly on the caller's memoryviews (arena slices, tensors) and
only park on the loop when the kernel says it would block.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

from kvpool_client.errors import NodeUnavailable
from kvpool_client.transport.iovec import IOV_MAX, advance
Buffer = bytes | bytearray | memoryview


async def send_all(loop: asyncio.AbstractEventLoop, sock: socket.socket, buffers: Sequence[Buffer]) -> None:
    """Send every byte of ``buffers`` in order, with as few syscalls as the kernel allows.

    Raises:
        NodeUnavailable: the peer closed or reset the connection.
    """
    pending = [memoryview(b).cast("B") for b in buffers if len(b)]
    while pending:
        try:
            sent = sock.sendmsg(pending[:IOV_MAX])
        except (BlockingIOError, InterruptedError):
            await _wait(loop, sock, writable=True)
            continue
        except OSError as exc:
            raise NodeUnavailable(f"send failed: {exc}") from exc
        pending = advance(pending, sent)


async def recv_all_into(loop: asyncio.AbstractEventLoop, sock: socket.socket, targets: Sequence[memoryview]) -> None:
    """Fill every buffer in ``targets`` exactly, in order.

    Raises:
        NodeUnavailable: the peer closed or reset the connection before all bytes came.
    """
    pending = [t for t in targets if len(t)]
    while pending:
        try:
            received = sock.recvmsg_into(pending[:IOV_MAX])[0]
        except (BlockingIOError, InterruptedError):
            await _wait(loop, sock, writable=False)
            continue
        except OSError as exc:
            raise NodeUnavailable(f"receive failed: {exc}") from exc
        if received == 0:
            raise NodeUnavailable("peer closed the connection")
        pending = advance(pending, received)


async def recv_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, nbytes: int) -> bytearray:
    """Receive exactly ``nbytes`` into a new buffer (headers and meta, not payload)."""
    data = bytearray(nbytes)
    await recv_all_into(loop, sock, [memoryview(data)])
    return data


async def _wait(loop: asyncio.AbstractEventLoop, sock: socket.socket, *, writable: bool) -> None:
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    fd = sock.fileno()
    if fd < 0:
        raise NodeUnavailable("socket closed")
    add, remove = (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
    add(fd, wake)
    try:
        await ready
    finally:
        remove(fd)


class AsyncSocketChannel:
    """Ordered bytes over one non-blocking stream socket on the running loop.

    The same thin channel serves the asyncio client and the daemon's sessions.
    """

    def __init__(self, sock: socket.socket, peer: str) -> None:
        sock.setblocking(False)
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
