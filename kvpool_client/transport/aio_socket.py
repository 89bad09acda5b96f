"""Scatter/gather I/O on a non-blocking socket for an asyncio (uvloop) event loop.

asyncio streams copy every chunk into their own buffer and were ten times slower
than raw sockets here for large messages. This channel calls ``sendmsg`` and
``recvmsg_into`` directly on the caller's memoryviews (arena slices, tensors) and
only parks on the loop when the kernel says it would block.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

from kvpool_client.errors import NodeUnavailable
from kvpool_client.transport.iovec import IOV_MAX, advance
from kvpool_client.transport.liveness import reusable

Buffer = bytes | bytearray | memoryview


class AsyncSocketChannel:
    """Ordered bytes over one non-blocking stream socket on the running loop.

    The same thin channel serves the asyncio client and the daemon's sessions.

    Args:
        sock: a connected stream socket (made non-blocking here).
        peer: the other end, for messages.
        stall_timeout: most seconds any one wait for the socket may take once a
            transfer has started; ``None`` waits forever. :meth:`recv_some` is
            exempt, so an idle connection between requests is never dropped.
    """

    def __init__(self, sock: socket.socket, peer: str, stall_timeout: float | None = None) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._stall_timeout = stall_timeout
        self.peer = peer

    async def send(self, buffers: Sequence[Buffer]) -> None:
        """Send every byte of ``buffers`` in order, with as few syscalls as the kernel allows.

        Raises:
            NodeUnavailable: the peer closed or reset the connection.
            TimeoutError: the peer stopped reading for longer than the stall timeout.
        """
        pending = [memoryview(b).cast("B") for b in buffers if len(b)]
        while pending:
            try:
                sent = self._sock.sendmsg(pending[:IOV_MAX])
            except (BlockingIOError, InterruptedError):
                await self._wait(writable=True, timeout=self._stall_timeout)
                continue
            except OSError as exc:
                raise NodeUnavailable(f"send to {self.peer} failed: {exc}") from exc
            pending = advance(pending, sent)

    async def recv_into(self, targets: Sequence[memoryview]) -> None:
        """Fill every buffer in ``targets`` exactly, in order.

        Raises:
            NodeUnavailable: the peer closed or reset the connection before all bytes came.
            TimeoutError: the peer went silent for longer than the stall timeout.
        """
        pending = [t for t in targets if len(t)]
        while pending:
            pending = advance(pending, await self._recv_once(pending, self._stall_timeout))

    async def recv_some(self, target: memoryview) -> int:
        """Receive at least one byte into ``target``, waiting as long as it takes."""
        return await self._recv_once([target], None)

    async def recv_upto(self, nbytes: int) -> bytes:
        """Receive between 1 and ``nbytes`` bytes, bounded by the stall timeout."""
        data = bytearray(nbytes)
        received = await self._recv_once([memoryview(data)], self._stall_timeout)
        return bytes(data[:received])

    async def recv_exactly(self, nbytes: int) -> bytearray:
        """Receive exactly ``nbytes`` into a new buffer (headers and meta, not payload)."""
        data = bytearray(nbytes)
        await self.recv_into([memoryview(data)])
        return data

    def reusable(self) -> bool:
        return reusable(self._sock)

    def close(self) -> None:
        self._sock.close()

    async def _recv_once(self, targets: list[memoryview], timeout: float | None) -> int:
        while True:
            try:
                received = self._sock.recvmsg_into(targets[:IOV_MAX])[0]
            except (BlockingIOError, InterruptedError):
                await self._wait(writable=False, timeout=timeout)
                continue
            except OSError as exc:
                raise NodeUnavailable(f"receive from {self.peer} failed: {exc}") from exc
            if received == 0:
                raise NodeUnavailable(f"{self.peer} closed the connection")
            return received

    async def _wait(self, *, writable: bool, timeout: float | None) -> None:
        loop, ready = self._loop, self._loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        def expire() -> None:
            if not ready.done():
                ready.set_exception(TimeoutError(f"{self.peer} stalled for more than {timeout}s"))

        fd = self._sock.fileno()
        if fd < 0:
            raise NodeUnavailable(f"connection to {self.peer} is closed")
        add, remove = (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
        add(fd, wake)
        timer = loop.call_later(timeout, expire) if timeout is not None else None
        try:
            await ready
        finally:
            remove(fd)
            if timer is not None:
                timer.cancel()
