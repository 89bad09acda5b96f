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

On a channel that can call back when its socket turns readable (plain TCP), a
request without payload whose frame has arrived whole is answered inside that
callback: received, served from DRAM and sent without waking a coroutine, which
took more of a small request's time than serving it. Anything that must wait (a
put's payload, a frame still arriving, an SSD read, a reply the socket does not
take at once) is handed to the coroutine loop, which serves it as above.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvpool_client.core.errors import AuthenticationError, ErrorCode, KVPoolError, LimitExceeded, NodeUnavailable, ProtocolError
from kvpool_client.core.wire import (
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
from kvpool_client.core.wire.codec import decode_get_one_request, encode_get_one
from kvpool_client.core.wire.frames import MAX_TOKEN_BYTES
from kvpool_server.data.admission import Admission
from kvpool_server.data.readahead import HEAD_CHUNK, ReadAhead
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tiers.dram import checksum
from kvpool_server.tiers.store import BlockStore, HeldBlock

log = logging.getLogger("kvpool.data")

_OP_NAMES = {op: op.name.lower() for op in Op}  # latency histogram labels
_REQUEST_COUNTERS = {op: f"requests_{name}" for op, name in _OP_NAMES.items()}
_WITHOUT_PAYLOAD = frozenset({Op.GET, Op.LOCATE, Op.EXISTS, Op.DELETE, Op.PING})  # answered in the callback when whole

_MIN_PAYLOAD_RATE = 1 << 20  # bytes/s: a put's payload arriving slower than this in all is dropped
_NEEDS_TOKEN = "this node requires the cluster's token: send HELLO first (ClientConfig.auth_token, KVPOOL_AUTH_TOKEN_FILE)"


class Channel(Protocol):
    """What a data-plane transport offers a session: ordered, reliable bytes."""

    peer: str

    async def send(self, buffers: list[bytes | memoryview]) -> None: ...

    async def recv_into(self, targets: list[memoryview]) -> None: ...

    async def recv_some(self, target: memoryview) -> int: ...

    async def recv_upto(self, nbytes: int) -> bytes: ...


@runtime_checkable
class PollableChannel(Channel, Protocol):
    """A channel that also calls back when its socket turns readable, and moves bytes without waiting."""

    def serve_readable(self, callback: Callable[[], None] | None) -> None: ...

    def recv_now(self, target: memoryview) -> int: ...

    def send_now(self, buffers: Sequence[bytes | memoryview]) -> list[memoryview]: ...


Reply = list[bytes | memoryview]
Request = GetRequest | LocateRequest | ExistsRequest | DeleteRequest | PingRequest  # a request without payload
_REQUEST_OPS: dict[type, Op] = {
    GetRequest: Op.GET, LocateRequest: Op.LOCATE, ExistsRequest: Op.EXISTS, DeleteRequest: Op.DELETE, PingRequest: Op.PING,
}


@dataclass(slots=True)
class _Answer:
    """A request being answered: the blocks it holds pinned, and the reply not sent yet."""

    request: Request
    keys: list[StoreKey]  # the blocks it reads (GET, LOCATE)
    held: list[HeldBlock | None]
    started: float  # perf_counter when its header was in
    unsent: Reply | None = None  # None: not made yet (blocks to read from SSD first)


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
        admission: Admission,
    ) -> None:
        self._channel = channel
        self._admission = admission
        self._reader = ReadAhead(channel)
        self._store = store
        self._tier = store.dram  # writes go to DRAM
        self._counters = counters
        self._latencies = latencies
        self._config = config
        self._accepting_writes = accepting_writes  # False while the node drains
        self.busy = False  # True while a request is in flight; shutdown waits for it
        self._authenticated = config.token is None
        self._pollable = channel if isinstance(channel, PollableChannel) else None
        self._turn: asyncio.Future[_Answer | None] | None = None  # what the callback hands over (None: the next frame)
        self._last_served = 0.0  # monotonic time the callback last answered a request

    async def run(self) -> None:
        """Serve requests until the peer leaves, stalls mid-frame or breaks the stream.

        Waiting for the first byte of a frame is bounded only by ``idle_timeout_s``
        (an idle pooled connection is fine); from then on every wait is bounded by
        the channel's stall timeout.
        """
        idle = self._config.idle_timeout_s or None
        while True:
            try:
                answer = await (self._handed_over(idle) if self._pollable else self._next_frame(idle))
            except NodeUnavailable:
                return
            except TimeoutError:
                self._counters.add("connections_closed_idle")
                return
            self.busy = True
            try:
                if answer is not None:
                    await self._finish(answer)
                elif not await self._serve_frame(await self._reader.recv_exactly(HEADER_SIZE)):
                    return
            except (NodeUnavailable, TimeoutError) as exc:
                log.info("peer dropped mid-frame", extra={"peer": self._channel.peer, "error": str(exc)})
                self._counters.add("connections_dropped_mid_frame")
                return
            finally:
                self.busy = False

    async def _next_frame(self, idle: float | None) -> None:
        """Wait until the next frame's first bytes are here (a channel without callbacks)."""
        if idle is None:
            await self._reader.wait_frame()
        else:
            await asyncio.wait_for(self._reader.wait_frame(), idle)

    # -- answering in the readiness callback ------------------------------------

    async def _handed_over(self, idle: float | None) -> _Answer | None:
        """Answer requests in the readiness callback until one needs this coroutine: that
        request begun (an :class:`_Answer`), or None for a frame to read and serve here."""
        assert self._pollable is not None
        handed = self._answer_buffered()
        if handed is not False:  # a frame read ahead by the last request needs this coroutine
            return handed
        turn = self._turn = asyncio.get_running_loop().create_future()
        self._pollable.serve_readable(self._on_readable)
        try:
            return await (turn if idle is None else self._idle_bounded(turn, idle))
        except BaseException:
            begun = turn.result() if turn.done() and not turn.cancelled() and turn.exception() is None else None
            if begun is not None:  # begun in the callback, never to be finished
                self._store.release(begun.held)
            raise
        finally:
            self._pollable.serve_readable(None)
            self._turn = None

    async def _idle_bounded(self, turn: asyncio.Future[_Answer | None], idle: float) -> _Answer | None:
        """Await ``turn``; TimeoutError once no request came for ``idle`` seconds, callback ones included."""
        self._last_served = time.monotonic()
        while True:
            left = self._last_served + idle - time.monotonic()
            try:
                return await asyncio.wait_for(asyncio.shield(turn), max(left, 0.0))
            except TimeoutError:
                if time.monotonic() - self._last_served >= idle:
                    raise

    def _on_readable(self) -> None:
        """The socket has bytes: answer the requests they complete; hand the rest to :meth:`run`."""
        assert self._pollable is not None
        try:
            self._reader.fill_now(self._pollable.recv_now)
            handed = self._answer_buffered()
        except NodeUnavailable as exc:
            if not self._reader.buffered:  # the peer left between frames
                self._handover(exc)
                return
            handed = None  # run() finds the end of the stream mid-frame
        except Exception as exc:  # a bug: run() raises it, the listener logs it and closes
            self._handover(exc)
            return
        if handed is not False:
            self._handover(handed)

    def _handover(self, handed: _Answer | None | BaseException) -> None:
        assert self._pollable is not None and self._turn is not None
        self._pollable.serve_readable(None)  # run() reads from now on
        if isinstance(handed, BaseException):
            self._turn.set_exception(handed)
        else:
            self._turn.set_result(handed)

    def _answer_buffered(self) -> _Answer | None | bool:
        """Answer every buffered request that needs no waiting.

        Returns:
            False when all are answered; else what :meth:`run` must take over: a
            request begun, or None for the next frame (not read yet).
        """
        assert self._pollable is not None
        limits = self._config.limits
        while self._reader.buffered:
            one = decode_get_one_request(self._reader.pending, limits) if self._authenticated else None
            if one is not None:  # the usual single-block get, read in place
                begun = self._answer_get_one(*one)
                if begun is not None:
                    return begun
                continue
            request, started = self._whole_request()
            if request is None:
                return None
            answer = self._begin(request, started)
            if self._store.wants_ssd(answer.keys, answer.held):
                return answer
            try:
                unsent = self._pollable.send_now(self._reply(answer))
            except BaseException:
                self._store.release(answer.held)
                raise
            if unsent:
                answer.unsent = unsent
                return answer
            self._end(answer)
        self._last_served = time.monotonic()
        return False

    def _answer_get_one(self, request_id: int, namespace: str, block: bytes, size: int) -> _Answer | None:
        """Answer a one-key GET of ``size`` bytes read in place (:func:`decode_get_one_request`) as
        :meth:`_begin`, :meth:`_reply` and :meth:`_end` answer a GET, without their per-key
        lists; returns the request begun when :meth:`run` must finish it (its block is on
        SSD, or the socket did not take the whole reply), None once answered."""
        assert self._pollable is not None
        started = time.perf_counter()
        self._reader.skip(size)
        self._counters.add("requests_get")
        key = (namespace, block)
        held = self._store.acquire_dram_one(key)
        if held is None and self._store.on_ssd(key):
            return _Answer(GetRequest(request_id, namespace, [block]), [key], [None], started)
        try:
            unsent = self._pollable.send_now(self._get_one_reply(request_id, held))
        except BaseException:
            self._store.release((held,))
            raise
        if unsent:
            return _Answer(GetRequest(request_id, namespace, [block]), [key], [held], started, unsent)
        self._store.release((held,))
        self._latencies.observe(_OP_NAMES[Op.GET], time.perf_counter() - started)
        return None

    def _whole_request(self) -> tuple[Request | None, float]:
        """The next buffered frame, decoded and taken from the buffer, if it is a request
        without payload that has arrived whole; else (None, 0), and the frame stays buffered."""
        raw = self._reader.peek(0, HEADER_SIZE)
        if raw is None or not self._authenticated:
            return None, 0.0
        started = time.perf_counter()
        try:
            header = decode_header(raw, self._config.limits)
            if header.payload_len or header.op not in _WITHOUT_PAYLOAD:
                return None, 0.0
            meta = self._reader.peek(HEADER_SIZE, HEADER_SIZE + header.meta_len)
            if meta is None:
                return None, 0.0
            request = decode_message(header, meta, self._config.limits)
        except ProtocolError:
            return None, 0.0  # run() reads it again and answers the error
        assert isinstance(request, Request)
        self._reader.skip(HEADER_SIZE + header.meta_len)
        self._counters.add(_REQUEST_COUNTERS[header.op])
        return request, started

    # -- the coroutine loop ------------------------------------------------------

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
        async with asyncio.timeout(self._config.payload_deadline(header.meta_len)):  # trickling ends here too
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
        if isinstance(request, PutRequest):
            await self._put(request)
            self._latencies.observe(_OP_NAMES[op], time.perf_counter() - started)
            return
        assert isinstance(request, Request)
        await self._finish(self._begin(request, started))

    async def _finish(self, answer: _Answer) -> None:
        """Read the request's SSD blocks, make and send its reply, then unpin its blocks."""
        try:
            if answer.unsent is None:
                arena_only = isinstance(answer.request, LocateRequest)  # an unpromotable block is not read twice
                await self._store.acquire_rest(answer.keys, answer.held, arena_only=arena_only)
                answer.unsent = self._reply(answer)
            await self._channel.send(answer.unsent)
        except BaseException:
            self._store.release(answer.held)
            raise
        self._end(answer)

    async def _put(self, request: PutRequest) -> None:
        """Store the blocks a put carries, reserving each block's slot only as its bytes arrive.

        A block takes its slot (and evicts for it) only once its first bytes are here (up to
        ``HEAD_CHUNK``: a peer trickling a byte at a time reaches its deadline first), so a
        peer that announces more than it sends evicts nothing for what it did not send; the
        slots of blocks still arriving, over every connection, stay under the admission
        budget (past it a block is refused OVERLOADED and its bytes dropped). Blocks that
        arrived whole wait, reserved, for the end of the put.
        """
        ns, lengths = request.namespace, request.lengths
        depths = request.depths or [0] * len(request.hashes)
        writable = self._accepting_writes()
        outcomes: list[BlockEntry | ErrorCode] = []
        try:
            async with asyncio.timeout(self._config.payload_deadline(sum(lengths))):
                for h, length, depth in zip(request.hashes, lengths, depths, strict=True):
                    if writable and length > 0:  # its first bytes are here: now it may take a slot
                        await self._reader.wait_buffered(min(length, HEAD_CHUNK))
                    outcome = self._admit((ns, h), length, depth) if writable else ErrorCode.DRAINING
                    outcomes.append(outcome)
                    await self._receive_block(outcome, length)
        except BaseException:
            for outcome in outcomes:
                if isinstance(outcome, BlockEntry):
                    self._tier.abort(outcome)
            raise
        await self._commit(outcomes)
        statuses = [int(ErrorCode.OK if isinstance(o, BlockEntry) else o) for o in outcomes]
        self._counters.add("bytes_in", sum(lengths))
        await self._channel.send([encode(StatusResponse(request.request_id, Op.PUT, statuses))])

    def _admit(self, key: StoreKey, length: int, depth: int) -> BlockEntry | ErrorCode:
        """A slot for one block whose bytes are next on the wire, taken from the admission budget."""
        slot = self._tier.slot_size(length)
        if slot is None:
            return self._tier.reserve(key, length, depth)  # refused whatever the budget: says why
        if not self._admission.take(slot):
            return ErrorCode.OVERLOADED
        outcome = self._tier.reserve(key, length, depth)
        if not isinstance(outcome, BlockEntry):
            self._admission.give(slot)
        return outcome

    async def _receive_block(self, outcome: BlockEntry | ErrorCode, length: int) -> None:
        """One block's bytes: into its reserved slot (its budget back once they are in, or not
        coming), or through the shared sink when it was refused."""
        if not isinstance(outcome, BlockEntry):
            await self._drain(length)
            return
        try:
            await self._reader.recv_into([self._tier.view(outcome)])
        finally:
            self._admission.give(outcome.slot_size)

    async def _commit(self, outcomes: list[BlockEntry | ErrorCode]) -> None:
        # Commit the chain's tail first: LRU then evicts tails before heads (a head
        # without its tail is still a usable prefix; a tail without its head is not).
        stored = [o for o in reversed(outcomes) if isinstance(o, BlockEntry)]
        write_through = self._store.write_through
        for entry in stored:
            self._tier.commit(entry, keep_pin=write_through)
        if write_through and stored:
            await self._store.persist(stored)  # acknowledged once on SSD

    # -- answers: the same whichever loop sends them ---------------------------

    def _begin(self, request: Request, started: float) -> _Answer:
        """Pin the request's blocks that DRAM holds (a GET or LOCATE)."""
        if not isinstance(request, (GetRequest, LocateRequest)):
            return _Answer(request, [], [], started)
        keys = [(request.namespace, h) for h in request.hashes]
        return _Answer(request, keys, self._store.acquire_dram(keys), started)

    def _end(self, answer: _Answer) -> None:
        """The reply is sent: unpin its blocks and time the request."""
        self._store.release(answer.held)
        self._latencies.observe(_OP_NAMES[_REQUEST_OPS[type(answer.request)]], time.perf_counter() - answer.started)

    def _reply(self, answer: _Answer) -> Reply:
        request = answer.request
        match request:
            case GetRequest():
                return self._get_reply(request, answer.held)
            case LocateRequest():
                return self._locate_reply(request, answer.keys, answer.held)
            case ExistsRequest():
                return [encode(StatusResponse(request.request_id, Op.EXISTS, self._exists(request)))]
            case DeleteRequest():
                ns = request.namespace
                statuses = [int(ErrorCode.OK if self._store.delete((ns, h)) else ErrorCode.NOT_FOUND) for h in request.hashes]
                return [encode(StatusResponse(request.request_id, Op.DELETE, statuses))]
            case PingRequest():
                return [encode(PingResponse(request.request_id))]

    def _get_reply(self, request: GetRequest, held: list[HeldBlock | None]) -> Reply:
        if len(held) == 1:
            return self._get_one_reply(request.request_id, held[0])
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
            return [self._error_frame(request.request_id, Op.GET, too_big)]
        self._counters.add("bytes_out", sum(lengths))
        return [encode(GetResponse(request.request_id, statuses, lengths, sums)), *views]

    def _get_one_reply(self, request_id: int, block: HeldBlock | None) -> Reply:
        """What :meth:`_get_reply` answers a get of one key, in one pack."""
        status = self._check(block)
        if block is None or status is not ErrorCode.OK:
            return [encode_get_one(request_id, int(status), 0, 0)]
        length = len(block.view)
        if length > self._config.limits.max_payload:
            too_big = LimitExceeded(f"the blocks add up to {length} bytes, over {self._config.limits.max_payload}")
            return [self._error_frame(request_id, Op.GET, too_big)]
        self._counters.add("bytes_out", length)
        return [encode_get_one(request_id, int(status), length, block.checksum), block.view]

    def _locate_reply(self, request: LocateRequest, keys: list[StoreKey], held: list[HeldBlock | None]) -> Reply:
        """Where each block lies in the shared arena; the same-node client copies it itself.

        Each block is held only while its location and slot generation are read:
        the reader detects a reuse of the slot by the generation, not by a pin.
        """
        generations = self._tier.generations
        if generations is None:
            return [self._error_frame(request.request_id, Op.LOCATE, KVPoolError("no shared arena", ErrorCode.INVALID_ARGUMENT))]
        rows = [self._location(key, block) for key, block in zip(keys, held)]
        columns = [list(column) for column in zip(*rows)] or [[] for _ in range(5)]
        response = LocateResponse(request.request_id, generations.arena_id, *columns)
        self._counters.add("bytes_out_shm", sum(response.lengths))
        return [encode(response)]

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

    def _exists(self, request: ExistsRequest) -> list[int]:
        ns, statuses, missed = request.namespace, [], False
        for h in request.hashes:
            # A prefix lookup stops looking at the first miss: what follows is useless.
            missed = (missed and request.prefix) or not self._store.contains((ns, h))
            statuses.append(int(ErrorCode.NOT_FOUND if missed else ErrorCode.OK))
        return statuses

    async def _drain(self, nbytes: int) -> None:
        """Read and drop ``nbytes`` through the daemon's one shared sink: no memory per connection."""
        sink = self._admission.sink
        while nbytes:
            chunk = min(nbytes, len(sink))
            await self._reader.recv_into([sink[:chunk]])
            nbytes -= chunk

    async def _send_error(self, request_id: int, op: Op, exc: KVPoolError) -> None:
        try:
            await self._channel.send([self._error_frame(request_id, op, exc)])
        except NodeUnavailable:
            pass

    def _error_frame(self, request_id: int, op: Op, exc: KVPoolError) -> bytes:
        """The error reply to a request, counted and logged."""
        self._counters.add(f"errors_{exc.code.name.lower()}")
        log.warning("bad request", extra={"peer": self._channel.peer, "error": str(exc)})
        code = exc.code if not isinstance(exc, LimitExceeded) else ErrorCode.LIMIT_EXCEEDED
        return encode(ErrorResponse(request_id, op, int(code), str(exc)))
