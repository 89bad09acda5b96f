"""The daemon's Session over a channel without a socket: the protocol's edge cases as unit tests.

``FakeChannel`` behaves as the TCP channel does (a readiness callback, receives and sends
without waiting) but its "kernel" takes at most ``window`` bytes per send, so replies go
out in pieces, and the test decides when each byte of a request arrives. The store is real:
a DRAM tier over an arena file.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import random
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec

import pytest

from kvpool_client.core.errors import ErrorCode, NodeUnavailable
from kvpool_client.core.wire import (
    HEADER_SIZE,
    ErrorResponse,
    GetRequest,
    GetResponse,
    HelloRequest,
    HelloResponse,
    PingRequest,
    PingResponse,
    PutRequest,
    StatusResponse,
    WireLimits,
    decode_header,
    decode_message,
    encode,
)
from kvpool_client.core.wire.one_key import GET_ONE_ANSWER_SIZE
from kvpool_server.alloc.arena import SharedArena
from kvpool_server.alloc.slab import SlabAllocator
from kvpool_server.data.admission import Admission, AdmissionLimits
from kvpool_server.data.answers import Answers
from kvpool_server.data.session import HEAD_CHUNK, Session, SessionConfig
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tenants.access import Access
from kvpool_server.tiers.dram import DramTier
from kvpool_server.tiers.store import BlockStore

LIMITS = WireLimits(max_keys=64, max_block_size=1 << 20)
TOKEN = b"the-cluster-token"
NS = "m@fp16"
BLOCK = 64 * 1024
P = ParamSpec("P")


def h(i: int) -> bytes:
    return b"%016d" % i


def block(i: int, size: int = BLOCK) -> bytes:
    return random.Random(i).randbytes(size)


@dataclass
class FakeChannel:
    """A pollable channel whose peer is the test: ``feed`` is what the peer sends."""

    window: int  # most bytes one send takes: the rest waits for the next turn of the loop
    peer: str = "fake:1"
    inbound: bytearray = field(default_factory=bytearray)
    outbound: bytearray = field(default_factory=bytearray)
    closed: bool = False
    _callback: Callable[[], None] | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def feed(self, data: bytes) -> None:
        self.inbound += data
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._arrived.set()
        if self._callback is not None and (self.inbound or self.closed):
            asyncio.get_running_loop().call_soon(self._readable)

    def _readable(self) -> None:  # level-triggered, as add_reader is
        if self._callback is not None and (self.inbound or self.closed):
            self._callback()
            self._wake()

    def serve_readable(self, callback: Callable[[], None] | None) -> None:
        self._callback = callback
        if callback is not None:
            self._wake()

    def recv_now(self, target: memoryview) -> int:
        if not self.inbound and self.closed:
            raise NodeUnavailable("the peer closed")
        count = min(len(target), len(self.inbound))
        target[:count] = self.inbound[:count]
        del self.inbound[:count]
        return count

    def pending(self) -> int:
        return len(self.inbound)

    def send_now(self, buffers: Sequence[bytes | memoryview]) -> list[memoryview]:
        rest, room = [memoryview(b).cast("B") for b in buffers], self.window
        while rest and room:
            taken = rest[0][:room]
            self.outbound += taken
            room -= len(taken)
            rest[0] = rest[0][len(taken) :]
            if not len(rest[0]):
                rest.pop(0)
        return rest

    async def send(self, buffers: list[bytes | memoryview]) -> None:
        rest = self.send_now(buffers)
        while rest:
            await asyncio.sleep(0)  # the socket turns writable again
            rest = self.send_now(rest)

    async def _wait_inbound(self, nbytes: int) -> None:
        while len(self.inbound) < nbytes:
            if self.closed:
                raise NodeUnavailable("the peer closed mid-frame")
            self._arrived.clear()
            await self._arrived.wait()

    async def recv_into(self, targets: list[memoryview]) -> None:
        for target in targets:
            await self._wait_inbound(len(target))
            self.recv_now(target)

    async def recv_some(self, target: memoryview) -> int:
        await self._wait_inbound(1)
        return self.recv_now(target)

    async def recv_upto(self, nbytes: int) -> bytes:
        await self._wait_inbound(1)
        data = bytearray(min(nbytes, len(self.inbound)))
        self.recv_now(memoryview(data))
        return bytes(data)

    def replies(self) -> list[object]:
        """Every whole reply sent so far (messages, then payload as bytes), taken out."""
        seen: list[object] = []
        while len(self.outbound) >= HEADER_SIZE:
            header = decode_header(bytes(self.outbound[:HEADER_SIZE]), LIMITS)
            end = HEADER_SIZE + header.meta_len + header.payload_len
            if len(self.outbound) < end:
                break
            meta = bytes(self.outbound[HEADER_SIZE : HEADER_SIZE + header.meta_len])
            seen.append(decode_message(header, meta, LIMITS))
            if header.payload_len:
                seen.append(bytes(self.outbound[HEADER_SIZE + header.meta_len : end]))
            del self.outbound[:end]
        return seen


@dataclass
class Node:
    store: BlockStore
    counters: Counters
    admission: Admission
    arena: SharedArena


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    counters = Counters()
    arena = SharedArena(str(tmp_path), "arena", 16 * BLOCK, prefault=False)
    dram = DramTier(arena, SlabAllocator(16 * BLOCK, 4 * BLOCK), counters)
    store = BlockStore(dram, None, counters)
    admission = Admission(
        AdmissionLimits(inflight_put_bytes=8 * BLOCK, connections=8, connections_per_peer=8), counters
    )
    yield Node(store, counters, admission, arena)
    store.close()
    gc.collect()  # the finished sessions' views of the arena
    arena.close()


async def serving(node: Node, channel: FakeChannel, token: bytes | None = None) -> asyncio.Task[None]:
    verify = None if token is None else Access(token).verifier()
    config = SessionConfig(LIMITS, verify_checksum_on_get=True, verify=verify, io_timeout_s=5.0)
    session = Session(channel, node.store, node.counters, Latencies(), config, lambda: True, node.admission)
    return asyncio.create_task(session.run())


async def replies(channel: FakeChannel, count: int) -> list[object]:
    """Wait until ``count`` replies (messages and payloads) have been sent whole."""
    seen: list[object] = []
    async with asyncio.timeout(10):
        while len(seen) < count:
            seen += channel.replies()
            await asyncio.sleep(0)
    return seen


def synchronously(test: Callable[P, Coroutine[object, object, None]]) -> Callable[P, None]:
    """Run an async test in its own event loop (pytest sees the test's own signature)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def leaked_bytes(node: Node) -> int:
    """Arena bytes still allocated once every block is deleted: a pin never released keeps its slot."""
    for key in node.store.dram.readable_keys():
        node.store.delete(key)
    return node.store.dram.usage().used_bytes


def put_frame(request_id: int, indices: list[int], size: int = BLOCK) -> bytes:
    blocks = [block(i, size) for i in indices]
    return encode(PutRequest(request_id, NS, [h(i) for i in indices], [size] * len(indices))) + b"".join(blocks)


@synchronously
async def test_replies_go_out_whole_through_a_socket_that_takes_a_few_bytes_at_a_time(node: Node) -> None:
    channel = FakeChannel(window=1000)
    task = await serving(node, channel)
    channel.feed(put_frame(1, [1, 2]))
    assert await replies(channel, 1) == [StatusResponse(1, 1, [0, 0])]
    channel.feed(encode(GetRequest(2, NS, [h(1)])) + encode(GetRequest(3, NS, [h(1), h(2)])))
    got = await replies(channel, 4)
    assert got[1] == block(1) and got[3] == block(1) + block(2), [type(x) for x in got]
    assert isinstance(got[0], GetResponse) and got[0].statuses == [0]
    channel.close()
    await task
    assert leaked_bytes(node) == 0


@pytest.mark.parametrize("piece", [1, 7, HEADER_SIZE, 600])
@synchronously
async def test_requests_arriving_in_pieces_are_answered_as_whole_ones(node: Node, piece: int) -> None:
    channel = FakeChannel(window=1 << 20)
    task = await serving(node, channel)
    stream = put_frame(1, [3], size=1000) + encode(GetRequest(2, NS, [h(3)])) + encode(PingRequest(3))
    for start in range(0, len(stream), piece):
        channel.feed(stream[start : start + piece])
        await asyncio.sleep(0)
    got = await replies(channel, 4)
    assert got[0] == StatusResponse(1, 1, [0]) and got[2] == block(3, 1000) and got[3] == PingResponse(3), got
    channel.close()
    await task


@synchronously
async def test_a_put_arrived_whole_is_stored_refused_blocks_dropped_and_what_follows_answered(node: Node) -> None:
    channel = FakeChannel(window=1 << 20)
    task = await serving(node, channel)
    too_big = 5 * BLOCK  # over the 4-block slab: refused, its bytes read through the sink
    put = PutRequest(1, NS, [h(7), h(8), h(9)], [BLOCK, too_big, 1000])
    stream = encode(put) + block(7) + block(8, too_big) + block(9, 1000)
    channel.feed(stream + encode(GetRequest(2, NS, [h(7), h(8), h(9)])) + encode(PingRequest(3)))
    got = await replies(channel, 4)
    assert got[0] == StatusResponse(1, 1, [0, int(ErrorCode.BLOCK_TOO_LARGE), 0]), got[0]
    assert isinstance(got[1], GetResponse) and got[1].statuses == [0, int(ErrorCode.NOT_FOUND), 0], got[1]
    assert got[2] == block(7) + block(9, 1000) and got[3] == PingResponse(3)
    assert node.admission.inflight_put_bytes == 0
    channel.close()
    await task
    assert leaked_bytes(node) == 0


@synchronously
async def test_a_draining_node_refuses_a_put_arrived_whole_and_goes_on(node: Node) -> None:
    channel = FakeChannel(window=1 << 20)
    config = SessionConfig(LIMITS, verify_checksum_on_get=True, io_timeout_s=5.0)
    session = Session(channel, node.store, node.counters, Latencies(), config, lambda: False, node.admission)
    task = asyncio.create_task(session.run())
    channel.feed(put_frame(1, [10, 11]) + encode(PingRequest(2)))
    draining = int(ErrorCode.DRAINING)
    assert await replies(channel, 2) == [StatusResponse(1, 1, [draining, draining]), PingResponse(2)]
    assert not node.store.contains((NS, h(10)))
    channel.close()
    await task


@pytest.mark.parametrize("cut", [None, HEAD_CHUNK + 100])
@synchronously
async def test_a_batch_get_whose_keys_run_past_the_first_chunk_is_answered_in_the_callback_once_all_here(
    node: Node, cut: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[object] = []  # what the callback left to run()
    handover = Session._handover

    def spied(self: Session, what: object) -> None:
        handed.append(what)
        handover(self, what)  # type: ignore[arg-type]

    monkeypatch.setattr(Session, "_handover", spied)
    channel = FakeChannel(window=1 << 20)
    task = await serving(node, channel)
    channel.feed(put_frame(1, [20, 21], size=1000))
    await replies(channel, 1)
    keys = [h(20), *(h(i) for i in range(100, 140)), h(21)]
    get = encode(GetRequest(2, NS, keys))
    assert len(get) > HEAD_CHUNK + 100  # the callback's first receive takes part of the head
    handed.clear()
    ping = encode(PingRequest(3))
    channel.feed(get + ping if cut is None else get[:cut])  # cut: the rest of the keys comes later
    if cut is not None:
        async with asyncio.timeout(10):
            while not handed:  # run() takes over to wait for the keys still on the way
                await asyncio.sleep(0)
        channel.feed(get[cut:] + ping)
    got = await replies(channel, 3)
    found = [int(ErrorCode.NOT_FOUND)] * len(keys)
    found[0] = found[-1] = 0
    assert isinstance(got[0], GetResponse) and got[0].statuses == found, got[0]
    assert got[1] == block(20, 1000) + block(21, 1000) and got[2] == PingResponse(3)
    assert len(handed) == (0 if cut is None else 1), handed
    channel.close()
    await task
    assert leaked_bytes(node) == 0


@synchronously
async def test_a_peer_leaving_mid_put_stores_nothing_and_frees_its_slots(node: Node) -> None:
    channel = FakeChannel(window=1 << 20)
    task = await serving(node, channel)
    frame = put_frame(1, [4, 5])
    channel.feed(frame[: len(frame) - 100])  # the second block never arrives whole
    async with asyncio.timeout(10):
        while node.admission.inflight_put_bytes == 0:
            await asyncio.sleep(0)
    channel.close()
    await task
    assert node.counters.get("connections_dropped_mid_frame") == 1
    assert not node.store.contains((NS, h(4))) and not node.store.contains((NS, h(5)))
    assert node.admission.inflight_put_bytes == 0 and leaked_bytes(node) == 0


@synchronously
async def test_a_token_node_answers_hello_then_serves_and_refuses_a_request_without_it(node: Node) -> None:
    channel = FakeChannel(window=64)
    task = await serving(node, channel, TOKEN)
    channel.feed(encode(HelloRequest(1, TOKEN)) + encode(PingRequest(2)))
    assert await replies(channel, 2) == [HelloResponse(1), PingResponse(2)]
    channel.close()
    await task

    stranger = FakeChannel(window=64)
    task = await serving(node, stranger, TOKEN)
    stranger.feed(encode(GetRequest(7, NS, [h(1)])))
    await asyncio.wait_for(task, 10)  # the session closes on its own
    (refused,) = stranger.replies()
    assert isinstance(refused, ErrorResponse) and refused.code == ErrorCode.UNAUTHENTICATED, refused


@synchronously
async def test_a_refused_put_drops_its_payload_and_the_connection_goes_on(node: Node) -> None:
    channel = FakeChannel(window=1 << 20)
    task = await serving(node, channel)
    too_many = [bytes([i % 256]) * 16 for i in range(LIMITS.max_keys + 1)]
    channel.feed(encode(PutRequest(1, NS, too_many, [10] * len(too_many))) + b"z" * 10 * len(too_many))
    channel.feed(encode(PingRequest(2)))
    got = await replies(channel, 2)
    assert isinstance(got[0], ErrorResponse) and got[0].code == ErrorCode.LIMIT_EXCEEDED and got[1] == PingResponse(2)
    channel.close()
    await task


@synchronously
async def test_a_get_of_a_block_deleted_after_it_was_pinned_still_sends_its_bytes(node: Node) -> None:
    channel = FakeChannel(window=4096)  # the reply takes many turns: the block stays pinned meanwhile
    task = await serving(node, channel)
    channel.feed(put_frame(1, [6]))
    await replies(channel, 1)
    channel.feed(encode(GetRequest(2, NS, [h(6)])))
    async with asyncio.timeout(10):
        while not channel.outbound:  # the reply has begun: its block is pinned until it ends
            await asyncio.sleep(0)
    assert node.store.delete((NS, h(6)))
    got = await replies(channel, 2)
    assert got[1] == block(6)
    channel.feed(encode(GetRequest(3, NS, [h(6)])))
    (gone,) = await replies(channel, 1)
    assert isinstance(gone, GetResponse) and gone.statuses == [int(ErrorCode.NOT_FOUND)], gone
    channel.close()
    await task
    assert leaked_bytes(node) == 0


@pytest.mark.parametrize("window", [1 << 20, 1000])
@synchronously
async def test_a_one_key_get_answers_as_the_general_answer_does(node: Node, window: int) -> None:
    """The step's one-key GET is a specialisation of Answers.begin/reply/end: the same bytes
    for a hit and a miss (sent at once, or in pieces), every pin released."""
    channel = FakeChannel(window=window)
    task = await serving(node, channel)
    channel.feed(put_frame(1, [1]))
    assert await replies(channel, 1) == [StatusResponse(1, 1, [0])]
    channel.feed(encode(GetRequest(2, NS, [h(1)])) + encode(GetRequest(3, NS, [h(9)])))
    async with asyncio.timeout(10):
        while len(channel.outbound) < 2 * GET_ONE_ANSWER_SIZE + BLOCK:
            await asyncio.sleep(0)
    specialised = bytes(channel.outbound)
    channel.outbound.clear()
    answers = Answers(node.store, Counters(), Latencies(), LIMITS, True, "general")
    general = b""
    for request in (GetRequest(2, NS, [h(1)]), GetRequest(3, NS, [h(9)])):
        answer = answers.begin(request, 0.0)
        general += b"".join(bytes(part) for part in answers.reply(answer))
        answers.end(answer)
    assert specialised == general, (specialised[:80], general[:80])
    channel.close()
    await task
    assert leaked_bytes(node) == 0
