"""The daemon's compiled answer to one-key GETs of published blocks, over real sockets.

A real arena file with its table and a DRAM tier publishing into it (as in
``tests/wire/test_shm_index.py``), and a socket pair for the client's connection. The
properties under test: a published block is answered with exactly the reply the Python path
sends; what is not published, or was freed between its lookup and its send, is left to the
Python path with nothing sent; what the socket does not take comes back as a copy the slot's
reuse cannot change; and a sender racing deletes and slot reuse by another thread, whose
writes into the arena let the GIL go as a put's do, never sends a wrong byte.
"""

from __future__ import annotations

import dataclasses
import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import xxhash

from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.wire import WireLimits
from kvpool_client.core.wire.one_key import GET_ONE_ANSWER_SIZE, decode_get_one, encode_get_one
from kvpool_client.core.wire.published import MARK_SHIFT
from kvpool_server.data.published_gets import PublishedGets
from kvpool_server.index import BlockEntry
from tests.wire.test_shm_index import BLOCK, LIMITS, NS, Node, close_node, data_for, k, make_node

pytest.importorskip("kvpool_client.core.wire._arena_reader", reason="the compiled reader was not built here")

OK = int(ErrorCode.OK)


@pytest.fixture
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    made = make_node(tmp_path_factory.mktemp("arena"))
    yield made
    close_node(made)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """The daemon's end (non-blocking, as the data plane's) and the client's."""
    daemon, client = socket.socketpair()
    daemon.setblocking(False)
    yield daemon, client
    daemon.close()
    client.close()


def sender(node: Node, limits: WireLimits = LIMITS) -> PublishedGets:
    reader = node.index.reader(node.generations, node.arena)
    assert reader is not None
    return PublishedGets(node.index.table, reader, node.counters, limits)


def reply_for(request_id: int, data: bytes) -> bytes:
    return encode_get_one(request_id, OK, len(data), xxhash.xxh3_64_intdigest(data)) + data


def received(client: socket.socket) -> bytes:
    """Everything the daemon's end has sent so far."""
    got = bytearray()
    while True:
        try:
            got += client.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return bytes(got)


def test_a_published_block_is_answered_with_the_reply_the_python_path_sends(
    node: Node, pair: tuple[socket.socket, socket.socket]
) -> None:
    daemon, client = pair
    for i in (1, 2, 3):
        node.put(i)
    gets = sender(node)
    assert gets.answer(daemon.fileno(), 7, NS, k(2)[1]) == b""
    assert gets.answer(daemon.fileno(), 8, NS, k(3)[1]) == b""
    got = received(client)
    assert got == reply_for(7, data_for(2)) + reply_for(8, data_for(3)), got[:GET_ONE_ANSWER_SIZE]
    counted = {
        name: node.counters.get(name) for name in ("requests_get", "dram_hits", "bytes_out", "shared_index_sends")
    }
    assert counted == {"requests_get": 2, "dram_hits": 2, "bytes_out": 2 * BLOCK, "shared_index_sends": 2}, counted


@pytest.mark.parametrize("case", ["never stored", "deleted", "deleted while pinned", "over the limits"])
def test_what_is_not_published_or_too_large_is_left_to_the_python_path_with_nothing_sent(
    node: Node, pair: tuple[socket.socket, socket.socket], case: str
) -> None:
    daemon, client = pair
    node.put(1)
    # A block over the payload limit is refused by the Python path; one over HOLD_GIL_UP_TO sent by it.
    gets = sender(node, dataclasses.replace(LIMITS, max_payload=BLOCK - 1) if case == "over the limits" else LIMITS)
    if case == "deleted":
        assert node.tier.delete(k(1))
    elif case == "deleted while pinned":
        pinned = node.tier.acquire(k(1))
        assert pinned is not None and node.tier.delete(k(1))
    key = k(2) if case == "never stored" else k(1)
    assert gets.answer(daemon.fileno(), 1, NS, key[1]) is None
    assert received(client) == b"", f"sent for a block {case}"
    assert node.counters.get("requests_get") == 0


def test_a_slot_freed_between_the_lookup_and_the_send_is_not_sent(
    node: Node, pair: tuple[socket.socket, socket.socket]
) -> None:
    daemon, client = pair
    first = node.put(1)
    reader = node.index.reader(node.generations, node.arena)
    assert reader is not None
    low, high = node.index.table.digest(k(1))
    found = reader.locate(low, high, time.monotonic_ns() >> MARK_SHIFT)
    assert found is not None
    offset, length, checksum, generation = found
    assert node.tier.delete(k(1))
    again = node.put(2)  # the freed slot, reused for another block
    assert again.offset == first.offset, "the test needs the slot reused"
    head = encode_get_one(1, OK, length, checksum)
    assert reader.send(daemon.fileno(), head, offset, length, generation) is None
    assert received(client) == b""


def test_what_the_socket_does_not_take_comes_back_as_a_copy(
    node: Node, pair: tuple[socket.socket, socket.socket]
) -> None:
    daemon, client = pair
    daemon.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    filler = 0
    while True:  # the socket full: the reply goes out in part, or not at all
        try:
            filler += daemon.send(b"x" * 1024)
        except BlockingIOError:
            break
    client.recv(1500)  # room for part of the reply
    first = node.put(1)
    rest = sender(node).answer(daemon.fileno(), 5, NS, k(1)[1])
    assert rest, "the socket took the whole reply: the test needs it to take part"
    node.tier.delete(k(1))
    assert node.put(2).offset == first.offset  # the slot reused: the rest is a copy, so unchanged
    sent = received(client)[filler - 1500 :]
    assert sent + rest == reply_for(5, data_for(1)), (len(sent), len(rest))


def test_sends_racing_deletes_and_slot_reuse_never_send_a_wrong_byte(
    node: Node, pair: tuple[socket.socket, socket.socket]
) -> None:
    """Another thread deletes blocks and stores new versions in their slots, writing each with a
    ``recv_into`` (which lets the GIL go, as a put's receive does) while this one answers gets:
    every block sent is a whole version of its key, with its own checksum. (A stress test: the
    window it races is narrow, so the freed-slot test above is what pins the generation check.)"""
    daemon, client = pair
    keys = range(8)
    versions = dict.fromkeys(keys, 0)

    def content(i: int, version: int) -> bytes:
        return struct.pack("<II", i, version) + random.Random(i * 1000 + version).randbytes(BLOCK - 8)

    def store(i: int, feed: socket.socket, sink: socket.socket) -> None:
        entry = node.tier.reserve(k(i), BLOCK)
        assert isinstance(entry, BlockEntry), entry
        feed.sendall(content(i, versions[i]))
        view = node.tier.view(entry)
        while view:
            view = view[sink.recv_into(view) :]
        node.tier.commit(entry)

    feed, sink = socket.socketpair()
    for i in keys:
        store(i, feed, sink)
    stop = threading.Event()

    def churn() -> None:
        rng = random.Random(1)
        while not stop.is_set():
            i = rng.choice(keys)
            node.tier.delete(k(i))
            versions[i] += 1
            store(i, feed, sink)

    gets = sender(node)
    thread = threading.Thread(target=churn)
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over between any two steps of Python, not every 5 ms
    thread.start()
    served = 0
    try:
        deadline = time.monotonic() + 1.0
        rng = random.Random(2)
        while time.monotonic() < deadline:
            i = rng.choice(keys)
            if gets.answer(daemon.fileno(), served + 1, NS, k(i)[1]) is None:
                continue
            head = client.recv(GET_ONE_ANSWER_SIZE, socket.MSG_WAITALL)
            status, length, checksum = decode_get_one(head, served + 1, LIMITS) or (None, 0, 0)
            data = client.recv(length, socket.MSG_WAITALL)
            served += 1
            assert status == OK and xxhash.xxh3_64_intdigest(data) == checksum, f"get {served} of key {i}"
            got_key, version = struct.unpack_from("<II", data)
            assert (got_key, data) == (i, content(i, version)), f"get {served}: key {got_key} version {version}"
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switching)
        feed.close()
        sink.close()
    assert served > 100, f"only {served} gets were answered"
