"""TLS on the TCP data plane, for clusters whose network is not private.

:class:`TlsRecords` is the TLS state machine without I/O: ``ssl.SSLObject`` over two
memory BIOs. It seals plaintext into records and opens records straight into the
caller's buffer (an arena slot, a tensor). :class:`TlsConnection` (blocking client)
and :class:`AsyncTlsChannel` (asyncio client and the daemon's sessions) only move
those records over the plain connection beneath, so the protocol code above sees the
same ordered bytes as over plain TCP.

Encryption costs a copy on each side (the cipher writes new bytes); the benchmark
``bench/transports.py`` measures what it costs against plain TCP.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator, Sequence

from kvpool_client.core.channels.aio_socket import AsyncSocketChannel
from kvpool_client.core.channels.tcp import TcpConnection
from kvpool_client.core.errors import NodeUnavailable

Buffer = bytes | bytearray | memoryview

_RECORDS_CHUNK = 256 << 10  # ciphertext moved per receive; plaintext sealed per flush


class TlsRecords:
    """One TLS session's records in memory: feed ciphertext in, take ciphertext out.

    Args:
        context: a client or server ``ssl.SSLContext``.
        server_side: True on the daemon.
        server_hostname: the name (or IP) the node's certificate must carry; client side only.
    """

    def __init__(self, context: ssl.SSLContext, server_side: bool, server_hostname: str | None = None) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side, server_hostname)
        self.peer = server_hostname or "client"

    def handshake(self) -> bool:
        """Advance the handshake; True once it is done (else feed the peer's next records).

        Raises:
            NodeUnavailable: the handshake failed (untrusted certificate, not TLS, ...).
        """
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as exc:
            raise NodeUnavailable(f"TLS handshake with {self.peer} failed: {exc.reason or exc}") from exc
        return True

    def seal(self, data: Buffer) -> None:
        """Encrypt ``data``; its records wait in :meth:`take_outgoing`."""
        self._tls.write(data)

    @property
    def outgoing(self) -> int:
        """Bytes of records waiting to be sent."""
        return self._outgoing.pending

    def open_into(self, target: memoryview) -> int | None:
        """Decrypt into ``target``; the count, or None when more ciphertext must be fed first.

        Raises:
            NodeUnavailable: the peer closed the session, or sent a record that does not verify.
        """
        try:
            # typeshed types read() as returning bytes; into a buffer it returns the count
            count: int = self._tls.read(len(target), target)  # type: ignore[assignment]
        except ssl.SSLWantReadError:
            return None
        except ssl.SSLError as exc:  # a forged or corrupt record, or the peer's close_notify
            raise NodeUnavailable(f"TLS session with {self.peer} broke: {exc.reason or exc}") from exc
        if count == 0:
            raise NodeUnavailable(f"{self.peer} closed the TLS session")
        return count

    def feed(self, ciphertext: Buffer) -> None:
        if not len(ciphertext):
            raise NodeUnavailable(f"{self.peer} closed the connection")
        self._incoming.write(ciphertext)

    def take_outgoing(self) -> bytes:
        """Records to send now (handshake messages, sealed data, session tickets)."""
        return self._outgoing.read() if self._outgoing.pending else b""


def pieces(buffers: Sequence[Buffer]) -> Iterator[memoryview]:
    """``buffers`` cut into pieces of at most one chunk, so that sending one overlaps sealing the next."""
    for buffer in buffers:
        view = memoryview(buffer).cast("B")
        for start in range(0, len(view), _RECORDS_CHUNK):
            yield view[start : start + _RECORDS_CHUNK]


class TlsConnection:
    """A blocking client connection (see :class:`TcpConnection`) carrying TLS records.

    Raises:
        NodeUnavailable: on connect, the handshake failed.
    """

    def __init__(self, raw: TcpConnection, context: ssl.SSLContext, server_hostname: str) -> None:
        self.address = raw.address
        self._raw = raw
        self._records = TlsRecords(context, server_side=False, server_hostname=server_hostname)
        self._ciphertext = memoryview(bytearray(_RECORDS_CHUNK))  # reused by every receive
        raw.start_request()
        try:
            while not self._records.handshake():
                self._flush()
                self._fill()
            self._flush()
        except BaseException:
            raw.close()
            raise

    def start_request(self) -> None:
        self._raw.start_request()

    def send(self, buffers: list[bytes | memoryview]) -> None:
        for piece in pieces(buffers):
            self._records.seal(piece)
            if self._records.outgoing >= _RECORDS_CHUNK:
                self._flush()
        self._flush()

    def recv_into(self, targets: list[memoryview]) -> None:
        for target in targets:
            filled = 0
            while filled < len(target):
                filled += self._open_into(target[filled:])

    def recv_exactly(self, nbytes: int) -> bytearray:
        data = bytearray(nbytes)
        self.recv_into([memoryview(data)])
        return data

    def recv_upto(self, nbytes: int) -> bytes:
        data = bytearray(nbytes)
        return bytes(data[: self._open_into(memoryview(data))])

    def reusable(self) -> bool:
        return self._raw.reusable()

    def close(self) -> None:
        self._raw.close()

    def _open_into(self, target: memoryview) -> int:
        while (count := self._records.open_into(target)) is None:
            self._fill()
        self._flush()  # TLS 1.3 may answer in-band (key updates)
        return count

    def _fill(self) -> None:
        self._records.feed(self._ciphertext[: self._raw.recv_some(self._ciphertext)])

    def _flush(self) -> None:
        if records := self._records.take_outgoing():
            self._raw.send([records])


class AsyncTlsChannel:
    """TLS records over an :class:`AsyncSocketChannel`, with the same methods.

    Use :meth:`connect` (client) or :meth:`accept` (daemon) to make one.
    """

    def __init__(self, raw: AsyncSocketChannel, records: TlsRecords) -> None:
        self._raw = raw
        self._records = records
        self.peer = raw.peer
        self._ciphertext = memoryview(bytearray(_RECORDS_CHUNK))  # reused by every receive

    @classmethod
    async def connect(cls, raw: AsyncSocketChannel, context: ssl.SSLContext, server_hostname: str) -> AsyncTlsChannel:
        """The client's side; ``raw`` is closed if the handshake fails."""
        channel = cls(raw, TlsRecords(context, server_side=False, server_hostname=server_hostname))
        try:
            await channel._handshake()
        except BaseException:
            raw.close()
            raise
        return channel

    @classmethod
    async def accept(cls, raw: AsyncSocketChannel, context: ssl.SSLContext) -> AsyncTlsChannel:
        """The daemon's side: the handshake's waits are bounded by the raw channel's stall timeout."""
        records = TlsRecords(context, server_side=True)
        records.peer = raw.peer
        channel = cls(raw, records)
        await channel._handshake()
        return channel

    async def send(self, buffers: Sequence[Buffer]) -> None:
        for piece in pieces(buffers):
            self._records.seal(piece)
            if self._records.outgoing >= _RECORDS_CHUNK:  # the peer decrypts while we seal the rest
                await self._flush()
        await self._flush()

    async def recv_into(self, targets: Sequence[memoryview]) -> None:
        for target in targets:
            filled = 0
            while filled < len(target):
                filled += await self._open_into(target[filled:], idle=False)

    async def recv_some(self, target: memoryview) -> int:
        """At least one byte, waiting as long as it takes (between requests)."""
        return await self._open_into(target, idle=True)

    async def recv_upto(self, nbytes: int) -> bytes:
        data = bytearray(nbytes)
        return bytes(data[: await self._open_into(memoryview(data), idle=False)])

    async def recv_exactly(self, nbytes: int) -> bytearray:
        data = bytearray(nbytes)
        await self.recv_into([memoryview(data)])
        return data

    def reusable(self) -> bool:
        return self._raw.reusable()

    def close(self) -> None:
        self._raw.close()

    async def _handshake(self) -> None:
        while not self._records.handshake():
            await self._flush()
            await self._fill(bounded=True)
        await self._flush()

    async def _open_into(self, target: memoryview, idle: bool) -> int:
        while (count := self._records.open_into(target)) is None:
            await self._fill(bounded=not idle)  # no stall timeout while waiting for the next request
        await self._flush()
        return count

    async def _fill(self, bounded: bool) -> None:
        received = await self._raw.recv_some(self._ciphertext, bounded=bounded)
        self._records.feed(self._ciphertext[:received])

    async def _flush(self) -> None:
        if records := self._records.take_outgoing():
            await self._raw.send([records])
