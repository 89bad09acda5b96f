"""The asyncio socket channel's sends that never wait: what the kernel took, and the rest to send later."""

from __future__ import annotations

import asyncio
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_client.core.channels.aio_socket import AsyncSocketChannel

SMALL_BUFFER = 4096  # the kernel doubles it and rounds up; still far under the largest send below


def _received(sock: socket.socket, nbytes: int) -> bytes:
    data = bytearray()
    while len(data) < nbytes:
        data += sock.recv(nbytes - len(data))
    return bytes(data)


def _buffers(sizes: list[int], kinds: list[str]) -> tuple[list[bytes | bytearray | memoryview], bytes]:
    """Buffers of each kind (a memoryview of 4-byte items counts its bytes, not its items) and their bytes joined."""
    buffers: list[bytes | bytearray | memoryview] = []
    for i, (size, kind) in enumerate(zip(sizes, kinds, strict=True)):
        data = bytes([i % 251]) * (size * 4)
        made: dict[str, bytes | bytearray | memoryview] = {
            "bytes": data,
            "bytearray": bytearray(data),
            "items": memoryview(bytearray(data)).cast("I"),
        }
        buffers.append(made[kind])
    return buffers, b"".join(bytes(b) for b in buffers)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6000), st.sampled_from(["bytes", "bytearray", "items"])), min_size=2, max_size=5)
)
def test_send_now_returns_exactly_the_bytes_the_kernel_did_not_take(parts: list[tuple[int, str]]) -> None:
    buffers, whole = _buffers([size for size, _ in parts], [kind for _, kind in parts])

    async def send() -> bytes:
        ours, theirs = socket.socketpair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
        try:
            channel = AsyncSocketChannel(ours, "peer")
            rest = channel.send_now(buffers)
            taken = len(whole) - sum(len(r) for r in rest)
            assert all(r.format == "B" and len(r) for r in rest), [(r.format, len(r)) for r in rest]
            return _received(theirs, taken) + b"".join(bytes(r) for r in rest)
        finally:
            ours.close()
            theirs.close()

    assert asyncio.run(send()) == whole


@pytest.mark.parametrize("kinds", [["bytes", "items"], ["bytearray", "bytes", "items"]])
def test_send_now_of_what_fits_sends_all_and_returns_nothing(kinds: list[str]) -> None:
    buffers, whole = _buffers([16] * len(kinds), kinds)

    async def send() -> tuple[list[memoryview], bytes]:
        ours, theirs = socket.socketpair()
        try:
            rest = AsyncSocketChannel(ours, "peer").send_now(buffers)
            return rest, _received(theirs, len(whole))
        finally:
            ours.close()
            theirs.close()

    rest, received = asyncio.run(send())
    assert (rest, received) == ([], whole)


def test_pending_counts_the_bytes_received_and_not_read_yet() -> None:
    async def count() -> list[int]:
        ours, theirs = socket.socketpair()
        try:
            channel = AsyncSocketChannel(ours, "peer")
            seen = [channel.pending()]
            theirs.sendall(b"x" * 5000)
            seen.append(channel.pending())
            channel.recv_now(memoryview(bytearray(1200)))
            seen.append(channel.pending())
            return seen
        finally:
            ours.close()
            theirs.close()

    assert asyncio.run(count()) == [0, 5000, 3800]
