"""Read-ahead for frame heads: header and meta in one receive instead of two or three.

A request's header and meta are small and arrive together, so the session asks
the socket for up to :data:`HEAD_CHUNK` bytes at a time while it reads them; what
runs over (the first bytes of a put's payload, or the next pipelined frame) is
kept and handed out first. Payload reads go straight from the socket into their
targets once the read-ahead is used up, so at most ``HEAD_CHUNK`` bytes of a
block are copied once more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

HEAD_CHUNK = 512


class _Channel(Protocol):
    async def recv_some(self, target: memoryview) -> int: ...

    async def recv_upto(self, nbytes: int) -> bytes: ...

    async def recv_into(self, targets: list[memoryview]) -> None: ...


class ReadAhead:
    """The receiving side of a channel, with a small read-ahead buffer."""

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._pending = bytearray()
        self._chunk = memoryview(bytearray(HEAD_CHUNK))

    @property
    def buffered(self) -> int:
        """Bytes received and not handed out yet."""
        return len(self._pending)

    async def wait_frame(self) -> None:
        """Wait, without a time limit, until the next frame's first bytes are here."""
        if not self._pending:
            # A buffer of its own: a transport may still write into one whose wait was cancelled.
            chunk = memoryview(bytearray(HEAD_CHUNK))
            received = await self._channel.recv_some(chunk)
            self._pending += chunk[:received]

    async def wait_buffered(self, nbytes: int) -> None:
        """Wait, without a time limit of its own, until at least ``nbytes`` (<= ``HEAD_CHUNK``) are buffered."""
        while len(self._pending) < nbytes:
            chunk = memoryview(bytearray(HEAD_CHUNK))  # its own, as in wait_frame
            received = await self._channel.recv_some(chunk)
            self._pending += chunk[:received]

    def fill_now(self, recv_now: Callable[[memoryview], int]) -> None:
        """Add up to ``HEAD_CHUNK`` bytes that ``recv_now`` receives without waiting (a plain
        socket's receive: done when it returns, so one buffer serves every call)."""
        self._pending += self._chunk[: recv_now(self._chunk)]

    @property
    def pending(self) -> bytearray:
        """What is buffered, in place: to read from, never to change (:meth:`skip` takes bytes out)."""
        return self._pending

    def peek(self, start: int, end: int) -> bytes | None:
        """Bytes ``start:end`` of what is buffered, left there; None while they are not all in."""
        return bytes(self._pending[start:end]) if len(self._pending) >= end else None

    def skip(self, nbytes: int) -> None:
        del self._pending[:nbytes]

    async def recv_exactly(self, nbytes: int) -> bytearray:
        """Exactly ``nbytes`` (a header or meta), reading ahead up to ``HEAD_CHUNK``."""
        while len(self._pending) < nbytes:
            self._pending += await self._channel.recv_upto(max(nbytes - len(self._pending), HEAD_CHUNK))
        data = self._pending[:nbytes]
        del self._pending[:nbytes]
        return data

    async def recv_into(self, targets: list[memoryview]) -> None:
        """Fill ``targets`` exactly: read-ahead bytes first, then straight from the socket."""
        rest = list(targets)
        while self._pending and rest:
            target = rest[0]
            count = min(len(target), len(self._pending))
            target[:count] = self._pending[:count]
            del self._pending[:count]
            rest[0] = target[count:]
            if not len(rest[0]):
                rest.pop(0)
        if rest:
            await self._channel.recv_into(rest)
