"""Serves data-plane frames on one connection, whatever transport carries it.

The loop reads a header, its meta, then moves payload bytes straight between the
channel and the DRAM arena: a put lands in reserved arena slots, a get is sent
from pinned arena slots. Nothing is copied in between. A get that misses DRAM
may be served from the SSD tier (see :class:`BlockStore`).

Errors and the connection:
- a header that cannot be trusted (bad magic, version, sizes over the limits)
  gets an error frame and the connection is closed, since the stream is lost;
- a request that is well framed but wrong (too many keys, a block over the limit)
  has its payload drained, gets an error frame, and the connection goes on;
- a peer that disappears mid-frame aborts its reservations: nothing half-written
  ever becomes readable.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kvpool_client.errors import AuthenticationError, ErrorCode, KVPoolError, LimitExceeded, NodeUnavailable, ProtocolError
from kvpool_client.wire import (
    HEADER_SIZE,
    DeleteRequest,
    ErrorResponse,
    ExistsRequest,
    FrameHeader,
    GetRequest,
    GetResponse,
    HelloRequest,
    HelloResponse,
    LocateRequest,
    LocateResponse,
    Op,
    PingRequest,
    PingResponse,
    PutRequest,
    StatusResponse,
    WireLimits,
    decode_header,
    decode_message,
    encode,
    header_identity,
)
from kvpool_client.wire.frames import MAX_TOKEN_BYTES
from kvpool_server.data.readahead import ReadAhead
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tiers.dram import checksum
from kvpool_server.tiers.store import BlockStore, HeldBlock

log = logging.getLogger("kvpool.data")

_OP_NAMES = {op: op.name.lower() for op in Op}  # latency histogram labels
_REQUEST_COUNTERS = {op: f"requests_{name}" for op, name in _OP_NAMES.items()}

_DRAIN_CHUNK = 1 << 20
_MIN_PAYLOAD_RATE = 1 << 20  # bytes/s: a put's payload arriving slower than this in all is dropped
_NEEDS_TOKEN = "this node requires the cluster's token: send HELLO first (ClientConfig.auth_token, KVPOOL_AUTH_TOKEN_FILE)"


class Channel(Protocol):
    """What a data-plane transport offers a session: ordered, reliable bytes."""

    peer: str

    async def send(self, buffers: list[bytes | memoryview]) -> None: ...

    async def recv_into(self, targets: list[memoryview]) -> None: ...

    async def recv_some(self, target: memoryview) -> int: ...

    async def recv_upto(self, nbytes: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class SessionConfig:
    limits: WireLimits
    verify_checksum_on_get: bool
    token: bytes | None = field(default=None, repr=False)  # required in a HELLO first, when set
    idle_timeout_s: float = 0.0  # close a connection idle this long between frames; 0: never
    io_timeout_s: float = 30.0  # the stall allowed mid-frame; a put's whole payload gets this plus its transfer time

    def payload_deadline(self, nbytes: int) -> float:
        """Seconds a put's payload may take in all: its reserved slots are held that long at most.

        The channel bounds each wait by ``io_timeout_s``; this bounds the frame, so a
        peer trickling a byte per timeout cannot hold reservations (and the blocks
        they evicted) for ever.
        """
        return self.io_timeout_s + nbytes / _MIN_PAYLOAD_RATE


class Session:
    """One client connection's request loop against a :class:`BlockStore`."""

    def __init__(
        self,
        channel: Channel,
        store: BlockStore,
        counters: Counters,
        latencies: Latencies,
        config: SessionConfig,
        accepting_writes: Callable[[], bool],
    ) -> None:
        self._channel = channel
        self._reader = ReadAhead(channel)
        self._store = store
        self._tier = store.dram  # writes go to DRAM
        self._counters = counters
        self._latencies = latencies
        self._config = config
        self._accepting_writes = accepting_writes  # False while the node drains
        self.busy = False  # True while a request is in flight; shutdown waits for it
        self._authenticated = config.token is None

    async def run(self) -> None:
        """Serve requests until the peer leaves, stalls mid-frame or breaks the stream.

        Waiting for the first byte of a frame is bounded only by ``idle_timeout_s``
        (an idle pooled connection is fine); from then on every wait is bounded by
        the channel's stall timeout.
        """
        idle = self._config.idle_timeout_s or None
        while True:
            try:
                if idle is None:
                    await self._reader.wait_frame()
                else:
                    await asyncio.wait_for(self._reader.wait_frame(), idle)
            except NodeUnavailable:
                return
            except TimeoutError:
                self._counters.add("connections_closed_idle")
                return
            self.busy = True
            try:
                if not await self._serve_frame(await self._reader.recv_exactly(HEADER_SIZE)):
                    return
            except (NodeUnavailable, TimeoutError) as exc:
                log.info("peer dropped mid-frame", extra={"peer": self._channel.peer, "error": str(exc)})
                self._counters.add("connections_dropped_mid_frame")
                return
            finally:
                self.busy = False

    async def _serve_frame(self, raw: bytearray) -> bool:
        """Handle one frame; False when the connection must close."""
        try:
            header = decode_header(raw, self._config.limits)
        except ProtocolError as exc:
            await self._send_error(*header_identity(raw), exc)
            return False
        if header.op == Op.HELLO:
            return await self._hello(header)
        if not self._authenticated:  # nothing more is read from an unproven peer
            await self._send_error(header.request_id, header.request_op, AuthenticationError(_NEEDS_TOKEN))
            return False
        await self._dispatch(header)
        return True

    async def _hello(self, header: FrameHeader) -> bool:
        """Check the token a HELLO proves; a wrong one closes the connection."""
        if header.meta_len > MAX_TOKEN_BYTES or header.payload_len:
            await self._send_error(header.request_id, Op.HELLO, ProtocolError("a HELLO holds only a token"))
            return False
        request = decode_message(header, await self._reader.recv_exactly(header.meta_len), self._config.limits)
        assert isinstance(request, HelloRequest)
        expected = self._config.token
        if expected is not None and not hmac.compare_digest(request.token, expected):
            await self._send_error(header.request_id, Op.HELLO, AuthenticationError("wrong token"))
            return False
        self._authenticated = True
        await self._channel.send([encode(HelloResponse(header.request_id))])
        return True

    async def _dispatch(self, header: FrameHeader) -> None:
        started = time.perf_counter()  # the header is in: meta, payload and reply are timed
        op = header.request_op
        meta = await self._reader.recv_exactly(header.meta_len)
        try:
            if header.is_response:
                raise ProtocolError("a client sent a response frame")
            request = decode_message(header, meta, self._config.limits)
        except ProtocolError as exc:
            await self._drain(header.payload_len)
            await self._send_error(header.request_id, op, exc)
            return
        self._counters.add(_REQUEST_COUNTERS[op])
        match request:
            case PutRequest():
                await self._put(request)
            case GetRequest():
                await self._get(request)
            case ExistsRequest():
                await self._exists(request)
            case DeleteRequest():
                await self._delete(request)
            case PingRequest():
                await self._channel.send([encode(PingResponse(request.request_id))])
            case LocateRequest():
                await self._locate(request)
        self._latencies.observe(_OP_NAMES[op], time.perf_counter() - started)

    async def _put(self, request: PutRequest) -> None:
        ns = request.namespace
        outcomes: list[BlockEntry | ErrorCode]
        if self._accepting_writes():
            depths = request.depths or [0] * len(request.hashes)
            outcomes = [self._tier.reserve((ns, h), n, d) for h, n, d in zip(request.hashes, request.lengths, depths)]
        else:
            outcomes = [ErrorCode.DRAINING] * len(request.hashes)
        try:
            async with asyncio.timeout(self._config.payload_deadline(sum(request.lengths))):
                await self._receive_blocks(outcomes, request.lengths)
        except BaseException:
            for outcome in outcomes:
                if isinstance(outcome, BlockEntry):
                    self._tier.abort(outcome)
            raise
        # Commit the chain's tail first: LRU then evicts tails before heads (a head
        # without its tail is still a usable prefix; a tail without its head is not).
        stored = [o for o in reversed(outcomes) if isinstance(o, BlockEntry)]
        write_through = self._store.write_through
        for entry in stored:
            self._tier.commit(entry, keep_pin=write_through)
        if write_through and stored:
            await self._store.persist(stored)  # acknowledged once on SSD
        statuses = [int(ErrorCode.OK if isinstance(o, BlockEntry) else o) for o in outcomes]
        self._counters.add("bytes_in", sum(request.lengths))
        await self._channel.send([encode(StatusResponse(request.request_id, Op.PUT, statuses))])

    async def _receive_blocks(self, outcomes: list[BlockEntry | ErrorCode], lengths: list[int]) -> None:
        """Receive the payload into reserved slots; bytes of refused blocks are drained."""
        targets: list[memoryview] = []
        scratch: memoryview | None = None  # only when a block is refused
        for outcome, length in zip(outcomes, lengths):
            if isinstance(outcome, BlockEntry):
                targets.append(self._tier.view(outcome))
                continue
            scratch = scratch or memoryview(bytearray(min(_DRAIN_CHUNK, max(lengths))))
            while length:  # refused: read it into scratch and drop it
                chunk = min(length, len(scratch))
                targets.append(scratch[:chunk])
                length -= chunk
        await self._reader.recv_into(targets)

    async def _get(self, request: GetRequest) -> None:
        ns = request.namespace
        held = await self._store.acquire([(ns, h) for h in request.hashes])
        try:
            statuses, lengths, sums, views = [], [], [], []
            for block in held:
                status = self._check(block)
                statuses.append(int(status))
                ok = block is not None and status is ErrorCode.OK
                lengths.append(len(block.view) if ok else 0)
                sums.append(block.checksum if ok else 0)
                if ok:
                    views.append(block.view)
            if sum(lengths) > self._config.limits.max_payload:
                too_big = LimitExceeded(f"the blocks add up to {sum(lengths)} bytes, over {self._config.limits.max_payload}")
                await self._send_error(request.request_id, Op.GET, too_big)
                return
            head = encode(GetResponse(request.request_id, statuses, lengths, sums))
            await self._channel.send([head, *views])
            self._counters.add("bytes_out", sum(lengths))
        finally:
            self._store.release(held)

    async def _locate(self, request: LocateRequest) -> None:
        """Say where each block lies in the shared arena; the same-node client copies it itself.

        Each block is held only while its location and slot generation are read:
        the reader detects a reuse of the slot by the generation, not by a pin.
        """
        generations = self._tier.generations
        if generations is None:
            await self._send_error(request.request_id, Op.LOCATE, KVPoolError("no shared arena", ErrorCode.INVALID_ARGUMENT))
            return
        keys = [(request.namespace, h) for h in request.hashes]
        held = await self._store.acquire(keys, arena_only=True)  # an unpromotable block is not read twice
        try:
            rows = [self._location(key, block) for key, block in zip(keys, held)]
        finally:
            self._store.release(held)
        columns = [list(column) for column in zip(*rows)] or [[] for _ in range(5)]
        response = LocateResponse(request.request_id, generations.arena_id, *columns)
        self._counters.add("bytes_out_shm", sum(response.lengths))
        await self._channel.send([encode(response)])

    def _location(self, key: StoreKey, block: HeldBlock | None) -> tuple[int, int, int, int, int]:
        """(status, offset, length, checksum, generation) of a held block; zeros unless OK."""
        if block is None and self._store.contains(key):  # on SSD, and DRAM had no slot for it
            return int(ErrorCode.NOT_IN_ARENA), 0, 0, 0, 0
        status = self._check(block)
        if status is not ErrorCode.OK or block is None:
            return int(status), 0, 0, 0, 0
        entry = block.entry
        if entry is None:  # a private copy (acquire(arena_only=True) does not hand out one)
            return int(ErrorCode.NOT_IN_ARENA), 0, 0, 0, 0
        return int(status), entry.offset, entry.length, entry.checksum, self._tier.generation(entry)

    def _check(self, block: HeldBlock | None) -> ErrorCode:
        if block is None:
            return ErrorCode.NOT_FOUND
        entry = block.entry  # bytes read from SSD were verified on the way
        if entry is not None and self._config.verify_checksum_on_get and checksum(block.view) != entry.checksum:
            log.error("checksum mismatch, block dropped", extra={"key": entry.key[1].hex(), "ns": entry.key[0]})
            self._tier.discard_corrupt(entry)
            return ErrorCode.CHECKSUM_MISMATCH
        return ErrorCode.OK

    async def _exists(self, request: ExistsRequest) -> None:
        ns, statuses, missed = request.namespace, [], False
        for h in request.hashes:
            # A prefix lookup stops looking at the first miss: what follows is useless.
            missed = (missed and request.prefix) or not self._store.contains((ns, h))
            statuses.append(int(ErrorCode.NOT_FOUND if missed else ErrorCode.OK))
        await self._channel.send([encode(StatusResponse(request.request_id, Op.EXISTS, statuses))])

    async def _delete(self, request: DeleteRequest) -> None:
        ns = request.namespace
        statuses = [int(ErrorCode.OK if self._store.delete((ns, h)) else ErrorCode.NOT_FOUND) for h in request.hashes]
        await self._channel.send([encode(StatusResponse(request.request_id, Op.DELETE, statuses))])

    async def _drain(self, nbytes: int) -> None:
        scratch = memoryview(bytearray(min(nbytes, _DRAIN_CHUNK)))
        while nbytes:
            chunk = min(nbytes, len(scratch))
            await self._reader.recv_into([scratch[:chunk]])
            nbytes -= chunk

    async def _send_error(self, request_id: int, op: Op, exc: KVPoolError) -> None:
        self._counters.add(f"errors_{exc.code.name.lower()}")
        log.warning("bad request", extra={"peer": self._channel.peer, "error": str(exc)})
        code = exc.code if not isinstance(exc, LimitExceeded) else ErrorCode.LIMIT_EXCEEDED
        try:
            await self._channel.send([encode(ErrorResponse(request_id, op, int(code), str(exc)))])
        except NodeUnavailable:
            pass
