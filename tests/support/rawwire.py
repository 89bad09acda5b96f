"""Speak the data-plane protocol by hand over a plain blocking socket.

Tests of bad input need frames the SDK refuses to build (bad magic, lying sizes,
truncated payloads) and control over when bytes stop arriving. Well-formed parts
are still built with the codec, so only the part under test is hand-made.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvpool_client.core.wire import (
    HEADER_SIZE,
    PROTOCOL_VERSION,
    FrameHeader,
    Message,
    PingRequest,
    PingResponse,
    PutRequest,
    WireLimits,
    decode_header,
    decode_message,
    encode,
    payload_lengths,
)
from kvpool_client.core.wire.frames import MAGIC

# The header layout of kvpool_client.core.wire.codec, repeated so a test can write any field value.
_HEADER = struct.Struct("<2sBBHHQIQ")
assert _HEADER.size == HEADER_SIZE

# Generous bounds for decoding what a daemon sends back: the tests judge the content.
READ_LIMITS = WireLimits(max_keys=65535, max_block_size=1 << 30, max_payload=1 << 40)


def raw_header(
    op: int,
    *,
    request_id: int = 1,
    meta_len: int = 0,
    payload_len: int = 0,
    magic: bytes = MAGIC,
    version: int = PROTOCOL_VERSION,
    status: int = 0,
) -> bytes:
    """A 28-byte frame header with every field chosen by the caller, valid or not."""
    return _HEADER.pack(magic, version, op, status, 0, request_id, meta_len, payload_len)


def put_frame(request_id: int, namespace: str, blocks: Sequence[tuple[bytes, bytes]]) -> bytes:
    """A complete, valid PUT frame (header, meta, payload) for ``(hash, data)`` pairs."""
    request = PutRequest(request_id, namespace, [h for h, _ in blocks], [len(d) for _, d in blocks])
    return encode(request) + b"".join(d for _, d in blocks)


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame read back from a daemon."""

    header: FrameHeader
    message: Message
    payload: bytes


class RawConnection:
    """A blocking TCP connection to a daemon's data port; every read is bounded by ``timeout``.

    ``receive_buffer`` (bytes) caps the kernel's receive buffer, set before connecting so the
    window stays small: a reader that does not read then stops the daemon's send part-way.
    """

    def __init__(self, address: str, timeout: float = 5.0, receive_buffer: int | None = None) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data: bytes | bytearray | memoryview) -> None:
        self.sock.sendall(data)

    def recv_exactly(self, nbytes: int) -> bytes:
        """Read exactly ``nbytes``.

        Raises:
            ConnectionError: the daemon closed the connection first.
            TimeoutError: nothing arrived within the timeout.
        """
        chunks, left = [], nbytes
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionError(f"connection closed after {nbytes - left} of {nbytes} bytes")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def read_frame(self) -> Frame:
        """Read and decode one whole frame, payload included."""
        header = decode_header(self.recv_exactly(HEADER_SIZE), READ_LIMITS)
        meta = self.recv_exactly(header.meta_len) if header.meta_len else b""
        message = decode_message(header, meta, READ_LIMITS)
        payload = self.recv_exactly(sum(payload_lengths(message)))
        return Frame(header, message, payload)

    def request(self, message: Message, payload: bytes = b"") -> Frame:
        """Send one frame and read the answer."""
        self.send(encode(message) + payload)
        return self.read_frame()

    def ping(self, request_id: int = 999) -> bool:
        """True if a PING on this connection is answered in kind."""
        frame = self.request(PingRequest(request_id))
        return isinstance(frame.message, PingResponse) and frame.header.request_id == request_id

    def closed_by_peer(self, within: float) -> bool:
        """Whether the daemon closes this connection within ``within`` seconds (bytes sent meanwhile are dropped)."""
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                if not self.sock.recv(1 << 16):
                    return True
            except TimeoutError:
                return False
            except ConnectionError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
