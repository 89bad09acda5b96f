"""The raw TCP baseline's protocol and blocking scatter/gather I/O (both of its ends).

Deliberately independent of kvpool's transport: the baseline is what a plain
``sendmsg``/``recvmsg_into`` loop on a blocking socket achieves. A request is a
header (op, block size, block count); a GET adds one u64 offset per block and is
answered with the blocks; a PUT is followed by the blocks and answered with one byte.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

from kvpool_client.core.channels.iovec import IOV_MAX, advance

HEADER = struct.Struct("<cII")
GET, PUT, ACK = b"G", b"P", b"k"
SOCKET_BUFFER_BYTES = 4 << 20  # as kvpool's data plane uses


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


def send_views(sock: socket.socket, buffers: Sequence[bytes | memoryview]) -> None:
    """Send every byte of ``buffers`` with as few ``sendmsg`` calls as the kernel allows."""
    pending = [memoryview(b).cast("B") for b in buffers if len(b)]
    while pending:
        pending = advance(pending, sock.sendmsg(pending[:IOV_MAX]))


def recv_views(sock: socket.socket, targets: Sequence[memoryview]) -> None:
    """Fill every buffer of ``targets`` exactly, in order.

    ``MSG_WAITALL`` lets the kernel fill the whole iovec before waking us: on a
    blocking socket that is one wake-up per request instead of one per segment
    train (measured here: 0.7 -> 1.3 GB/s for 32 x 384 KiB).

    Raises:
        ConnectionError: the peer closed the connection first.
    """
    pending = [memoryview(t).cast("B") for t in targets if len(t)]
    while pending:
        received = sock.recvmsg_into(pending[:IOV_MAX], 0, socket.MSG_WAITALL)[0]
        if received == 0:
            raise ConnectionError("peer closed the connection")
        pending = advance(pending, received)


def recv_exact(sock: socket.socket, nbytes: int) -> bytearray:
    data = bytearray(nbytes)
    recv_views(sock, [memoryview(data)])
    return data
