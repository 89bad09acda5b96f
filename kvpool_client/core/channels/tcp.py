"""TCP data-plane connections: blocking for the sync client, loop-driven for asyncio.

Both move payload with ``sendmsg``/``recvmsg_into`` on the caller's buffers, so a
block goes from the socket straight into the caller's tensor.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from typing import TypeVar

from kvpool_client.core.channels.aio_socket import AsyncSocketChannel
from kvpool_client.core.channels.iovec import IOV_MAX, advance, byte_views
from kvpool_client.core.channels.liveness import IdleProbe
from kvpool_client.core.errors import NodeUnavailable, RequestTimeout

# Large kernel buffers let one sendmsg hand over a whole block and cut wake-ups.
SOCKET_BUFFER_BYTES = 4 << 20
# How far a call's kernel timeout may miss the request's deadline before it is set
# again: re-arming before every call cost two syscalls per request.
ARM_SLACK_S = 0.005

R = TypeVar("R")
T = TypeVar("T")


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


def _connect(address: str, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection(parse_address(address), timeout=timeout)
    except TimeoutError as exc:
        raise RequestTimeout(f"connect to {address} timed out after {timeout}s") from exc
    except OSError as exc:
        raise NodeUnavailable(f"cannot connect to {address}: {exc}") from exc
    tune_socket(sock)
    return sock


def tune_socket(sock: socket.socket) -> None:
    """Low latency for small frames, big kernel buffers for block payloads."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


class TcpConnection:
    """A blocking connection; each request is bounded by one deadline.

    :meth:`start_request` sets the deadline; every send or receive runs under a
    kernel timeout (SO_SNDTIMEO/SO_RCVTIMEO) that ends within :data:`ARM_SLACK_S`
    (or a twentieth of the timeout) of it, so a peer that trickles bytes cannot
    stretch a request past it. Python's own socket timeouts would poll() before
    every call instead.
    """

    def __init__(self, address: str, timeout: float, connect_timeout: float) -> None:
        self.address = address
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        self._sock = _connect(address, connect_timeout)
        self._sock.settimeout(None)
        self._armed = {socket.SO_SNDTIMEO: 0.0, socket.SO_RCVTIMEO: 0.0}  # kernel timeout set, seconds (0: none)
        self._slack = min(ARM_SLACK_S, timeout / 20)
        self._idle = IdleProbe(self._sock)

    def start_request(self) -> None:
        """Give the next request the full timeout."""
        self._deadline = time.monotonic() + self._timeout

    def send(self, buffers: list[bytes | memoryview]) -> None:
        if len(buffers) == 1 and type(buffers[0]) is bytes:  # a request without payload: no views to make
            data = buffers[0]
            while data:
                self._arm(socket.SO_SNDTIMEO, "send")
                try:
                    data = data[self._sock.send(data) :]
                except OSError as exc:
                    raise _socket_error(exc, self.address, "send") from exc
            return
        pending = byte_views(buffers)
        while pending:
            self._arm(socket.SO_SNDTIMEO, "send")
            try:
                sent = self._sock.sendmsg(pending[:IOV_MAX])
            except OSError as exc:
                raise _socket_error(exc, self.address, "send") from exc
            pending = advance(pending, sent)

    def recv_into(self, targets: list[memoryview]) -> None:
        if len(targets) == 1:  # one block: no list of views to keep
            self._recv_one(targets[0])
            return
        pending = [t for t in targets if len(t)]
        while pending:
            self._arm(socket.SO_RCVTIMEO, "receive")
            try:
                # MSG_WAITALL: one syscall for a whole block instead of one per arriving chunk.
                received = self._sock.recvmsg_into(pending[:IOV_MAX], 0, socket.MSG_WAITALL)[0]
            except OSError as exc:
                raise _socket_error(exc, self.address, "receive") from exc
            if received == 0:
                raise NodeUnavailable(f"{self.address} closed the connection")
            pending = advance(pending, received)

    def _recv_one(self, target: memoryview) -> None:
        while len(target):
            self._arm(socket.SO_RCVTIMEO, "receive")
            try:
                received = self._sock.recv_into(target, 0, socket.MSG_WAITALL)
            except OSError as exc:
                raise _socket_error(exc, self.address, "receive") from exc
            if received == 0:
                raise NodeUnavailable(f"{self.address} closed the connection")
            target = target[received:]

    def recv_exactly(self, nbytes: int) -> bytearray:
        data = bytearray(nbytes)
        self.recv_into([memoryview(data)])
        return data

    def recv_some(self, target: memoryview) -> int:
        """Receive between 1 and ``len(target)`` bytes into ``target``."""
        return self._receive(self._sock.recv_into, target)

    def recv_upto(self, nbytes: int) -> bytes:
        return self._receive(self._sock.recv, nbytes)

    def _receive(self, call: Callable[[R], T], arg: R) -> T:
        """``call(arg)``, a receive of at least one byte, under the deadline."""
        self._arm(socket.SO_RCVTIMEO, "receive")
        try:
            received = call(arg)
        except OSError as exc:
            raise _socket_error(exc, self.address, "receive") from exc
        if not received:
            raise NodeUnavailable(f"{self.address} closed the connection")
        return received

    def reusable(self) -> bool:
        return self._idle.reusable()

    def close(self) -> None:
        self._sock.close()

    def _arm(self, option: int, what: str) -> None:
        """Make the next call's kernel timeout end at the deadline, give or take the slack."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise RequestTimeout(f"{what} to {self.address}: request timed out after {self._timeout}s")
        if abs(self._armed[option] - left) <= self._slack:
            return
        seconds = int(left)
        self._sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", seconds, int((left - seconds) * 1e6) or 1))
        self._armed[option] = left


def _socket_error(exc: OSError, address: str, what: str) -> RequestTimeout | NodeUnavailable:
    """kvpool's error for a socket error: a timeout, or an unavailable node."""
    if isinstance(exc, (TimeoutError, BlockingIOError)):  # BlockingIOError: SO_RCVTIMEO/SO_SNDTIMEO expired
        return RequestTimeout(f"{what} to {address} timed out")
    return NodeUnavailable(f"{what} to {address} failed: {exc}")


async def open_async_connection(address: str, timeout: float) -> AsyncSocketChannel:
    """Connect without blocking the loop (name resolution and connect run in a thread)."""
    sock = await asyncio.get_running_loop().run_in_executor(None, _connect, address, timeout)
    return AsyncSocketChannel(sock, address)
