"""Scatter/gather I/O on a non-blocking socket for an asyncio (uvloop) event loop.

asyncio streams copy every chunk into their own buffer: one copy too many for
large messages. This channel calls ``sendmsg`` and ``recvmsg_into`` directly on
the caller's memoryviews (arena slices, tensors) and only parks on the loop when
the kernel says it would block.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios
from collections.abc import Callable, Sequence
from typing import Any

from kvpool_client.core.channels.iovec import IOV_MAX, advance, byte_count, byte_views
from kvpool_client.core.channels.liveness import reusable
from kvpool_client.core.errors import NodeUnavailable

Buffer = bytes | bytearray | memoryview
_COUNT = struct.Struct("i")  # FIONREAD's answer: an int
_NO_COUNT = bytes(_COUNT.size)


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
        # The read registration outlives a wait: re-registering with the loop for
        # every request cost more than the rest of a small request's handling.
        self._reading = False
        self._read_waiter: asyncio.Future[None] | None = None
        self._when_readable: Callable[[], None] | None = None

    def serve_readable(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` from the loop each time the socket turns readable while no
        coroutine waits on it (``None`` stops). It must read what is there, or the
        loop calls it again at once."""
        self._when_readable = callback
        if callback is not None and not self._reading:
            self._loop.add_reader(self.fileno(), self._on_readable)
            self._reading = True

    def recv_now(self, target: memoryview) -> int:
        """Receive what has arrived, up to ``len(target)`` bytes, without waiting: 0 when nothing has.

        Raises:
            NodeUnavailable: the peer closed or reset the connection.
        """
        try:
            received = self._sock.recv_into(target)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            raise NodeUnavailable(f"receive from {self.peer} failed: {exc}") from exc
        if received == 0:
            raise NodeUnavailable(f"{self.peer} closed the connection")
        return received

    def pending(self) -> int:
        """Bytes the kernel has received and this side has not read yet."""
        count: int = _COUNT.unpack(fcntl.ioctl(self.fileno(), termios.FIONREAD, _NO_COUNT))[0]
        return count

    def send_now(self, buffers: Sequence[Buffer]) -> list[memoryview]:
        """Send what the kernel takes of ``buffers`` without waiting; returns the rest (empty: all sent).

        Raises:
            NodeUnavailable: the peer closed or reset the connection.
        """
        if len(buffers) == 1 and type(buffers[0]) is bytes:
            sent = self._taken(self._sock.send, buffers[0])
            return [] if sent == len(buffers[0]) else [memoryview(buffers[0])[sent:]]
        if len(buffers) <= IOV_MAX:  # the usual reply (a head and its blocks), sent whole: no views made
            sent = self._taken(self._sock.sendmsg, buffers)
            return [] if sent == byte_count(buffers) else advance(byte_views(buffers), sent)
        pending = byte_views(buffers)
        return advance(pending, self._taken(self._sock.sendmsg, pending[:IOV_MAX]))

    async def send(self, buffers: Sequence[Buffer]) -> None:
        """Send every byte of ``buffers`` in order, with as few syscalls as the kernel allows.

        Raises:
            NodeUnavailable: the peer closed or reset the connection.
            TimeoutError: the peer stopped reading for longer than the stall timeout.
        """
        pending = self.send_now(buffers)
        while pending:
            await self._wait(writable=True, timeout=self._stall_timeout)
            pending = self.send_now(pending)

    async def recv_into(self, targets: Sequence[memoryview]) -> None:
        """Fill every buffer in ``targets`` exactly, in order.

        Raises:
            NodeUnavailable: the peer closed or reset the connection before all bytes came.
            TimeoutError: the peer went silent for longer than the stall timeout.
        """
        pending = [t for t in targets if len(t)]
        while pending:
            pending = advance(pending, await self._recv_once(pending, self._stall_timeout))

    async def recv_some(self, target: memoryview, *, bounded: bool = False) -> int:
        """Receive at least one byte into ``target``: waiting as long as it takes, or with
        ``bounded`` no longer than the stall timeout (mid-frame)."""
        if not bounded:
            # Between frames the next one has rarely arrived yet: wait for it first rather
            # than pay a receive that fails (and its exception) on every request.
            await self._wait_readable(None)
        return await self._recv_once([target], self._stall_timeout if bounded else None)

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
        self._when_readable = None
        self._stop_reading()
        self._sock.close()

    async def _recv_once(self, targets: list[memoryview], timeout: float | None) -> int:
        while True:
            try:
                received = self._sock.recvmsg_into(targets[:IOV_MAX])[0]
            except (BlockingIOError, InterruptedError):
                await self._wait_readable(timeout)
                continue
            except OSError as exc:
                raise NodeUnavailable(f"receive from {self.peer} failed: {exc}") from exc
            if received == 0:
                raise NodeUnavailable(f"{self.peer} closed the connection")
            return received

    async def _wait_readable(self, timeout: float | None) -> None:
        """Wait until the socket is readable; the registration stays for the next wait."""
        waiter = self._loop.create_future()
        self._read_waiter = waiter
        if not self._reading:
            self._loop.add_reader(self.fileno(), self._on_readable)
            self._reading = True
        try:
            await self._bounded(waiter, timeout)
        finally:
            if self._read_waiter is waiter:
                self._read_waiter = None

    def _taken(self, send: Callable[[Any], int], data: Any) -> int:
        """Bytes ``send(data)`` (the socket's ``send`` or ``sendmsg``) handed the kernel without
        waiting: 0 when its buffer is full."""
        try:
            return send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            raise NodeUnavailable(f"send to {self.peer} failed: {exc}") from exc

    def _on_readable(self) -> None:
        waiter, self._read_waiter = self._read_waiter, None
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(None)
        elif self._when_readable is not None:
            self._when_readable()
        else:
            self._stop_reading()  # nobody waits: a level-triggered poll would fire every loop turn

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._sock.fileno())

    async def _wait(self, *, writable: bool, timeout: float | None) -> None:
        """Wait until the socket is writable (rare: the send buffer holds whole blocks)."""
        ready = self._loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        fd = self.fileno()
        self._loop.add_writer(fd, wake)
        try:
            await self._bounded(ready, timeout)
        finally:
            self._loop.remove_writer(fd)

    async def _bounded(self, waiter: asyncio.Future[None], timeout: float | None) -> None:
        """Await ``waiter``; a TimeoutError after ``timeout`` seconds (None: no limit)."""
        if timeout is None:
            await waiter
            return

        def expire() -> None:
            if not waiter.done():
                waiter.set_exception(TimeoutError(f"{self.peer} stalled for more than {timeout}s"))

        timer = self._loop.call_later(timeout, expire)
        try:
            await waiter
        finally:
            timer.cancel()

    def fileno(self) -> int:
        """The socket's descriptor (for a compiled sender of its own).

        Raises:
            NodeUnavailable: the connection is closed.
        """
        fd = self._sock.fileno()
        if fd < 0:
            raise NodeUnavailable(f"connection to {self.peer} is closed")
        return fd
