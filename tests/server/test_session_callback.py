"""Requests a daemon answers inside its socket's readiness callback, and what it hands to its loop.

A request without payload whose frame has arrived whole is answered in the
callback; everything else (a put, a frame still arriving, a reply the socket does
not take at once) goes to the connection's coroutine. These tests mix the two on
one connection, over raw sockets, and check order, bytes and released pins.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from kvpool_client import BlockKey, ErrorCode, KVPoolClient
from kvpool_client.core.wire import (
    HEADER_SIZE,
    DeleteRequest,
    ExistsRequest,
    GetRequest,
    GetResponse,
    PingRequest,
    PingResponse,
    StatusResponse,
    encode,
)
from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.rawwire import RawConnection, put_frame

pytestmark = pytest.mark.integration

NS = "callback@fp16@L1@tp0of1"
BLOCK = 256 << 10


@pytest.fixture(scope="module")
def node() -> Iterator[DaemonProcess]:
    with running_daemon("--dram-capacity", "64MiB", "--slab-size", "1MiB") as daemon:
        yield daemon


def _blocks(count: int, size: int = BLOCK) -> list[tuple[bytes, bytes]]:
    return [(os.urandom(32), os.urandom(size)) for _ in range(count)]


def _dram_usage(daemon: DaemonProcess) -> tuple[int, int]:
    """(blocks in the index, bytes allocated) of the DRAM tier."""
    with KVPoolClient([daemon.address]) as client:
        (tier,) = [t for t in client.stats(daemon.address).tiers if t.name == "dram"]
    return tier.blocks, tier.used_bytes


def test_pipelined_requests_are_answered_in_order(node: DaemonProcess) -> None:
    """Puts (loop) and gets, exists, deletes, pings (callback) sent in one write come back in order."""
    (h1, d1), (h2, d2) = _blocks(2)
    missing = os.urandom(32)
    burst = b"".join(
        [
            put_frame(1, NS, [(h1, d1)]),
            encode(GetRequest(2, NS, [h1, missing])),
            encode(PingRequest(3)),
            put_frame(4, NS, [(h2, d2)]),
            encode(ExistsRequest(5, NS, [h1, h2, missing])),
            encode(GetRequest(6, NS, [h2])),
            encode(DeleteRequest(7, NS, [h1])),
            encode(ExistsRequest(8, NS, [h1])),
        ]
    )
    with RawConnection(node.data_address) as conn:
        conn.send(burst)
        frames = [conn.read_frame() for _ in range(8)]
    seen = [(f.header.request_id, type(f.message).__name__) for f in frames]
    assert [rid for rid, _ in seen] == list(range(1, 9)), f"replies out of order: {seen}"
    get1, get2 = frames[1].message, frames[5].message
    assert isinstance(get1, GetResponse) and get1.statuses == [ErrorCode.OK, ErrorCode.NOT_FOUND], get1
    assert frames[1].payload == d1
    assert isinstance(frames[2].message, PingResponse)
    assert isinstance(get2, GetResponse) and frames[5].payload == d2
    statuses = [f.message.statuses for f in (frames[4], frames[6], frames[7]) if isinstance(f.message, StatusResponse)]
    assert statuses == [[ErrorCode.OK, ErrorCode.OK, ErrorCode.NOT_FOUND], [ErrorCode.OK], [ErrorCode.NOT_FOUND]], seen


def test_a_frame_arriving_in_pieces_is_served(node: DaemonProcess) -> None:
    """A header without its meta yet goes to the loop, which reads the rest."""
    ((key, data),) = _blocks(1)
    with RawConnection(node.data_address) as conn:
        conn.send(put_frame(1, NS, [(key, data)]))
        conn.read_frame()
        frame = encode(GetRequest(2, NS, [key]))
        conn.send(frame[: HEADER_SIZE - 3])
        time.sleep(0.05)
        conn.send(frame[HEADER_SIZE - 3 : HEADER_SIZE + 5])
        time.sleep(0.05)
        conn.send(frame[HEADER_SIZE + 5 :] + encode(PingRequest(3)))
        got, pong = conn.read_frame(), conn.read_frame()
    assert isinstance(got.message, GetResponse) and got.payload == data, got.message
    assert isinstance(pong.message, PingResponse) and pong.header.request_id == 3


# 12 and 16 MiB: more than the socket buffers hold (the daemon asks for 4 MiB, the kernel doubles it).
# A GET of 12 keys arrives whole in one read-ahead and is begun in the callback; one of 64 keys is read by the loop.
@pytest.mark.parametrize(("count", "size"), [(12, 1 << 20), (64, 256 << 10)], ids=["callback", "loop"])
def test_a_reply_the_socket_cannot_take_is_finished_by_the_loop(node: DaemonProcess, count: int, size: int) -> None:
    """A reply larger than the socket buffers waits for a reader that does not read. Meanwhile
    the daemon serves other clients, and its blocks stay pinned: deleted, they are not freed
    until the reply has gone, whole and unchanged."""
    blocks = _blocks(count, size)
    keys = [BlockKey(NS, h) for h, _ in blocks]
    with KVPoolClient([node.address]) as client:
        empty = _dram_usage(node)
        assert client.put(keys, [d for _, d in blocks]).stored == len(blocks)
        with RawConnection(node.data_address, timeout=10, receive_buffer=64 << 10) as reader:
            reader.send(encode(GetRequest(1, NS, [h for h, _ in blocks])) + encode(PingRequest(2)))
            # Its first bytes here: the daemon holds the blocks and has begun a reply larger than both
            # sockets' buffers, so its send stops part-way and the rest waits in its loop.
            assert reader.sock.recv(1, socket.MSG_PEEK), "the node closed the connection instead of replying"
            assert client.get(keys[:2]).statuses == (ErrorCode.OK, ErrorCode.OK), (
                "another client must be served meanwhile"
            )
            assert client.delete(keys) == [True] * len(keys)
            pinned = _dram_usage(node)
            reply, pong = reader.read_frame(), reader.read_frame()
    assert pinned[0] == empty[0] and pinned[1] > empty[1], f"blocks of an unsent reply were freed: {pinned} vs {empty}"
    assert isinstance(reply.message, GetResponse) and reply.payload == b"".join(d for _, d in blocks)
    assert isinstance(pong.message, PingResponse)
    deadline = time.monotonic() + 5
    while _dram_usage(node) != empty and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dram_usage(node) == empty, f"pins left after the reply was sent: {_dram_usage(node)} vs {empty}"


def test_a_one_block_reply_the_socket_cannot_take_is_finished_by_the_loop(
    daemon_factory: Callable[..., DaemonProcess],
) -> None:
    """A one-key GET (read in place by the callback) whose 12 MiB block overflows both socket
    buffers: sent part-way, finished by the loop, its block pinned until the last byte left."""
    daemon = daemon_factory("--dram-capacity", "64MiB", "--slab-size", "16MiB")
    ((h, data),) = _blocks(1, 12 << 20)
    key = BlockKey(NS, h)
    with KVPoolClient([daemon.address]) as client:
        empty = _dram_usage(daemon)
        assert client.put([key], [data]).stored == 1
        with RawConnection(daemon.data_address, timeout=10, receive_buffer=64 << 10) as reader:
            reader.send(encode(GetRequest(1, NS, [h])) + encode(PingRequest(2)))
            assert reader.sock.recv(1, socket.MSG_PEEK), "the node closed the connection instead of replying"
            assert client.delete([key]) == [True]
            pinned = _dram_usage(daemon)
            reply, pong = reader.read_frame(), reader.read_frame()
        assert pinned[0] == empty[0] and pinned[1] > empty[1], f"the block of an unsent reply was freed: {pinned}"
        assert isinstance(reply.message, GetResponse) and reply.payload == data, reply.message
        assert isinstance(pong.message, PingResponse) and pong.header.request_id == 2
        deadline = time.monotonic() + 5
        while _dram_usage(daemon) != empty and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _dram_usage(daemon) == empty, f"pin left after the reply was sent: {_dram_usage(daemon)} vs {empty}"


def test_idle_timeout_counts_requests_answered_in_the_callback(daemon_factory: Callable[..., DaemonProcess]) -> None:
    """A connection busy with callback-answered pings for longer than the idle timeout stays
    open; once it falls silent it is closed."""
    daemon = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--idle-timeout-s", "0.5")
    with RawConnection(daemon.data_address) as conn:
        until = time.monotonic() + 1.5
        rid = 0
        while time.monotonic() < until:
            rid += 1
            assert conn.ping(rid), f"ping {rid} after {1.5 - (until - time.monotonic()):.2f}s was not answered"
            time.sleep(0.1)
        assert conn.closed_by_peer(within=3.0), "an idle connection was kept past the idle timeout"
