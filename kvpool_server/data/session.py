"""Serves data-plane frames on one connection, whatever transport carries it.

The protocol's rules live in :class:`~kvpool_client.core.wire.connection.ServerConnection`
(what a frame is, HELLO first, what a bad frame costs); the store work of an answer in
:mod:`kvpool_server.data.answers`, of a put in :mod:`kvpool_server.data.puts`. This module
moves bytes between them: it feeds the machine what the channel received, dispatches the
events it returns, moves payload and sends replies.

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

Every event is served by one step (:meth:`Session._step`), which goes as far as it can
without waiting: a read answered from DRAM and sent as far as the socket takes it, a put
whose payload has all arrived stored and answered. What is left (an SSD read or write, a
put's payload still arriving, the rest of a reply, a HELLO, a refusal) is finished by the
coroutine (:meth:`Session._complete`), which may wait. Two drivers call the step: on a
channel that can call back when its socket turns readable (plain TCP) the callback steps
every request whose frame has arrived whole, without waking a coroutine, which took more
of a small request's time than serving it; otherwise, and for whatever the callback hands
over, the coroutine reads the next frame's head and steps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from kvpool_client.core.errors import AuthenticationError, ErrorCode, KVPoolError, NodeUnavailable
from kvpool_client.core.wire import (
    CommitRequest,
    DeleteRequest,
    HelloResponse,
    LocateRequest,
    Op,
    PeerRequest,
    PutRequest,
    ReserveRequest,
    StatusResponse,
    WireLimits,
    encode,
)
from kvpool_client.core.wire.connection import (
    NEED_DATA,
    Event,
    GetOne,
    Hello,
    NeedData,
    Refusal,
    ServerConnection,
    Verify,
)
from kvpool_server.data.admission import Admission
from kvpool_server.data.answers import OP_NAMES, Answer, Answers, Reply, request_op
from kvpool_server.data.leases import Leases
from kvpool_server.data.published_gets import SendPublished
from kvpool_server.data.puts import Outcome, Puts
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tenants.credentials import Tenant
from kvpool_server.tenants.gate import Denied, screened, write_refusal
from kvpool_server.tenants.rates import Bucket
from kvpool_server.tiers.store import BlockStore, HeldBlock

if TYPE_CHECKING:
    from kvpool_server.data.nixl import NixlPeer

log = logging.getLogger("kvpool.data")

# Bytes received at a time while a frame's head (header and meta) is read: what runs over
# (a put's first payload bytes, the next pipelined frame) is kept by the connection, so at
# most this much of a block is copied once more on its way to its slot.
HEAD_CHUNK = 512
_REQUEST_COUNTERS = {op: f"requests_{name}" for op, name in OP_NAMES.items()}
_GET = OP_NAMES[Op.GET]
_PUT = OP_NAMES[Op.PUT]
_MIN_PAYLOAD_RATE = 1 << 20  # bytes/s: a put's payload arriving slower than this in all is dropped
_TOKEN_RECHECK_S = 1.0  # how often a connection's token is checked again (the credentials file is read as often)


class Channel(Protocol):
    """What a data-plane transport offers a session: ordered, reliable bytes."""

    peer: str

    async def send(self, buffers: list[bytes | memoryview]) -> None: ...

    async def recv_into(self, targets: list[memoryview]) -> None: ...

    async def recv_some(self, target: memoryview) -> int: ...

    async def recv_upto(self, nbytes: int) -> bytes: ...


class MeteredChannel:
    """A channel that counts the bytes it moves (a tenant with a byte rate is served through one)."""

    def __init__(self, inner: Channel) -> None:
        self._inner = inner
        self.peer = inner.peer
        self._moved = 0

    def take_moved(self) -> int:
        """Bytes sent and received since the last call."""
        moved, self._moved = self._moved, 0
        return moved

    async def send(self, buffers: list[bytes | memoryview]) -> None:
        await self._inner.send(buffers)
        self._moved += sum(len(b) if isinstance(b, bytes) else b.nbytes for b in buffers)

    async def recv_into(self, targets: list[memoryview]) -> None:
        await self._inner.recv_into(targets)
        self._moved += sum(t.nbytes for t in targets)

    async def recv_some(self, target: memoryview) -> int:
        n = await self._inner.recv_some(target)
        self._moved += n
        return n

    async def recv_upto(self, nbytes: int) -> bytes:
        data = await self._inner.recv_upto(nbytes)
        self._moved += len(data)
        return data


@runtime_checkable
class PollableChannel(Channel, Protocol):
    """A channel that also calls back when its socket turns readable, and moves bytes without waiting."""

    def serve_readable(self, callback: Callable[[], None] | None) -> None: ...

    def recv_now(self, target: memoryview) -> int: ...

    def pending(self) -> int: ...

    def send_now(self, buffers: Sequence[bytes | memoryview]) -> list[memoryview]: ...


OneSided = PeerRequest | ReserveRequest | CommitRequest  # the one-sided data plane's requests
# What a step leaves for the coroutine: a request begun, a put whose bytes are on their way, a
# HELLO or a refusal to answer.
Pending = Answer | PutRequest | Hello | Refusal
# What the readiness callback hands the coroutine: something pending, or None for the next
# frame, still arriving.
Handover = Pending | None


@dataclass(frozen=True, slots=True)
class SessionConfig:
    limits: WireLimits
    verify_checksum_on_get: bool
    verify: Verify | None = field(default=None, repr=False)  # a HELLO's token to its tenant; None: none required
    idle_timeout_s: float = 0.0  # close a connection idle this long between frames; 0: never
    io_timeout_s: float = 30.0  # the stall allowed mid-frame; a put's whole payload gets this plus its transfer time

    def payload_deadline(self, nbytes: int) -> float:
        """Seconds a put's payload may take in all: its reserved slots are held that long at most.

        The channel bounds each wait by ``io_timeout_s``; this bounds the frame, so a
        peer trickling a byte per timeout cannot hold reservations (and the blocks
        they evicted) for ever.
        """
        return self.io_timeout_s + nbytes / _MIN_PAYLOAD_RATE


def _nothing_sent(reply: Reply) -> Reply:
    return reply


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
        send_published: SendPublished | None = None,
        nixl: NixlPeer | None = None,
    ) -> None:
        self._channel = channel
        self._connection = ServerConnection(config.limits, config.verify)
        self._restricted: Tenant | None = None  # the HELLO's tenant, unless it may do everything
        self._admission = admission
        self._joined = ""  # the tenant whose connection cap this connection counts against
        self._token = b""  # what the HELLO proved, checked again now and then (a rotated file may revoke it)
        self._token_checked = 0.0  # perf_counter time of the last check
        self._rate: Bucket | None = None  # the tenant's byte rate, once this connection is metered
        self._answers = Answers(store, counters, latencies, config.limits, config.verify_checksum_on_get, channel.peer)
        self._puts = Puts(store, admission, counters)
        self._nixl = nixl  # the node's one-sided peer: PEER, RESERVE and COMMIT need it
        self._leases = Leases(store, self._puts, counters, config.payload_deadline, self._write_refusal)
        self._store = store
        self._counters = counters
        self._latencies = latencies
        self._config = config
        self._accepting_writes = accepting_writes  # False while the node drains
        self._send_published = send_published  # one-key GETs of published blocks, in compiled code
        self.busy = False  # True while a request is in flight; shutdown waits for it
        self._pollable = channel if isinstance(channel, PollableChannel) else None
        # A step sends what the socket takes at once; without callbacks, the coroutine sends it all.
        self._send_at_once: Callable[[Reply], Sequence[bytes | memoryview]] = (
            self._pollable.send_now if self._pollable is not None else _nothing_sent
        )
        self._chunk = memoryview(bytearray(HEAD_CHUNK))  # recv_now's: done when it returns, so one serves all
        self._turn: asyncio.Future[Handover] | None = None  # what the callback hands over
        self._last_served = 0.0  # monotonic time the callback last answered a request

    async def run(self) -> None:
        """Serve requests until the peer leaves, stalls mid-frame or breaks the stream.

        Waiting for the first byte of a frame is bounded only by ``idle_timeout_s``
        (an idle pooled connection is fine); from then on every wait is bounded by
        the channel's stall timeout.
        """
        try:
            await self._serve(self._config.idle_timeout_s or None)
        finally:
            self._leases.close()  # the client left: what it reserved and did not commit goes back
            if self._joined:
                self._admission.leave(self._joined)

    async def _serve(self, idle: float | None) -> None:
        while True:
            try:
                handed = await (self._handed_over(idle) if self._pollable else self._next_frame(idle))
            except NodeUnavailable:
                return
            except TimeoutError:
                self._counters.add("connections_closed_idle")
                return
            self.busy = True
            try:
                if handed is None:  # the next frame is still arriving (always, without callbacks)
                    handed = self._step(await self._next_event())
                if not await self._complete(handed):
                    return
                if self._rate is not None:
                    await self._within_rate()
            except (NodeUnavailable, TimeoutError) as exc:
                log.info("peer dropped mid-frame", extra={"peer": self._channel.peer, "error": str(exc)})
                self._counters.add("connections_dropped_mid_frame")
                return
            finally:
                self.busy = False

    async def _next_frame(self, idle: float | None) -> None:
        """Wait until the next frame's first bytes are here (a channel without callbacks)."""
        if not self._connection.buffered:
            await (self._receive_some() if idle is None else asyncio.wait_for(self._receive_some(), idle))

    async def _receive_some(self) -> None:
        # A buffer of its own: a transport may still write into one whose wait was cancelled.
        chunk = memoryview(bytearray(HEAD_CHUNK))
        self._connection.receive_data(chunk[: await self._channel.recv_some(chunk)])

    async def _next_event(self) -> Event:
        """The next event, receiving the rest of its head first; the head may take
        :meth:`SessionConfig.payload_deadline` of its size in all (trickling ends here too)."""
        connection = self._connection
        event = connection.next_event()
        if event is NEED_DATA:
            start = asyncio.get_running_loop().time()
            async with asyncio.timeout(None) as timeout:
                while isinstance(event, NeedData):
                    timeout.reschedule(start + self._config.payload_deadline(connection.head_size))
                    missing = max(connection.head_size - connection.buffered, 1)
                    connection.receive_data(await self._channel.recv_upto(max(missing, HEAD_CHUNK)))
                    event = connection.next_event()
        return event

    # -- one request as far as it goes without waiting: what both drivers call ---

    def _step(self, event: Event) -> Pending | None:
        """Serve ``event`` as far as it goes without waiting.

        Returns:
            None once it is answered; else what :meth:`_complete` must finish (it may wait):
            a request begun (blocks to read from SSD, or the rest of its reply to send), a
            put whose bytes are still on their way, a HELLO, a refusal.
        """
        started = time.perf_counter()
        if self._token and started - self._token_checked > _TOKEN_RECHECK_S:
            revoked = self._check_token(event, started)
            if revoked is not None:
                return revoked
        if self._restricted is not None:
            allowed = screened(self._restricted, event)
            if isinstance(allowed, Denied):
                return self._reply_now(allowed.request, self._denied(allowed), started)
            event = allowed
        if isinstance(event, GetOne):  # the usual single-block get
            return self._get_one(event, started)
        match event:
            case PutRequest():
                return self._put_now(event, started)
            case Hello():
                return self._hello(event)
            case Refusal():
                return event
            case PeerRequest() | ReserveRequest() | CommitRequest():
                self._counters.add(_REQUEST_COUNTERS[request_op(event)])
                return self._reply_now(event, self._one_sided(event), started)
            case NeedData():
                raise AssertionError("a driver receives a frame's whole head before its step")
            case _:
                self._counters.add(_REQUEST_COUNTERS[request_op(event)])
                return self._answer(self._answers.begin(event, started))

    def _get_one(self, get: GetOne, started: float) -> Answer | None:
        """A one-key GET: sent from the published table where it can be; else :meth:`_answer`
        specialised to one key (no per-key lists, no :class:`Answer` unless something is left
        for :meth:`_complete`), which the session's tests hold to the general answer."""
        if self._send_published is not None:
            try:
                rest = self._send_published(*get)
            except OSError as exc:
                raise NodeUnavailable(f"send to {self._channel.peer} failed: {exc}") from exc
            if rest:  # the socket took part: the rest is a copy (nothing is pinned)
                return Answer(get, [], [], started, [rest])
            if rest is not None:
                self._latencies.observe(_GET, time.perf_counter() - started)
                return None
        self._counters.add("requests_get")
        key = (get.namespace, get.block)
        held = self._store.acquire_dram_one(key)
        if held is None and self._store.on_ssd(key):
            return Answer(get, [key], [None], started)
        unsent = self._send_now(self._answers.get_one_reply(get.request_id, held), (held,))
        if unsent:
            return Answer(get, [key], [held], started, unsent)
        self._store.release((held,))
        self._latencies.observe(_GET, time.perf_counter() - started)
        return None

    def _answer(self, answer: Answer) -> Answer | None:
        """Reply to a read begun, unless some of its blocks must be read from SSD first."""
        if self._store.wants_ssd(answer.keys, answer.held):
            return answer
        answer.unsent = self._send_now(self._answers.reply(answer), answer.held)
        if answer.unsent:
            return answer
        self._answers.end(answer)
        return None

    def _put_now(self, request: PutRequest, started: float) -> Answer | PutRequest | None:
        """Store a put whose whole payload has arrived; the request, untouched, when it must wait
        (bytes still on their way, a write-through, a channel without callbacks)."""
        if self._pollable is None or self._puts.write_through:
            return request
        if self._connection.payload_buffered + self._pollable.pending() < self._connection.payload_left:
            return request
        self._counters.add("requests_put")
        outcomes: list[Outcome] = []
        steps = self._puts.store(request, self._write_refusal(request.namespace), outcomes, arrived=True)
        try:
            for target in steps:
                if isinstance(target, memoryview):  # the payload is all here: never a count to wait for
                    self._receive_payload_now(target)
        finally:
            steps.close()  # a put cut short aborts its reservations
        return self._reply_now(request, self._puts.reply(request, outcomes), started)

    def _one_sided(self, request: OneSided) -> Reply:
        """The answer to a request of the one-sided data plane (:mod:`kvpool_server.data.nixl`)."""
        nixl = self._nixl
        try:
            if nixl is None:
                raise KVPoolError("this node has no one-sided data plane (nixl)", ErrorCode.INVALID_ARGUMENT)
            match request:
                case PeerRequest():
                    self._answers.one_sided = True  # this client reads what it locates through NIXL
                    return [encode(nixl.answer(request.request_id))]
                case ReserveRequest():
                    if self._puts.write_through:
                        raise KVPoolError("a write-through node takes puts over the wire", ErrorCode.INVALID_ARGUMENT)
                    nixl.expect_transfers()
                    return self._leases.reserve(request)
                case CommitRequest():
                    return self._leases.commit(request)
        except KVPoolError as exc:
            return [self._answers.error_frame(request.request_id, request_op(request), exc)]

    def _meter(self, tenant: object) -> None:
        """Serve a tenant with a byte rate through the coroutine only, counting what moves: its
        requests are then read one at a time, each after the wait its bytes call for."""
        if not isinstance(tenant, Tenant) or not tenant.quotas.rate:
            return
        self._rate = self._admission.rates.bucket(tenant.name, tenant.quotas.rate)
        self._channel = MeteredChannel(self._channel)
        self._pollable, self._send_at_once, self._send_published = None, _nothing_sent, None

    async def _within_rate(self) -> None:
        """Wait as long as the tenant's bytes so far call for."""
        assert self._rate is not None and isinstance(self._channel, MeteredChannel)
        wait = self._rate.charge(self._channel.take_moved())
        if wait:
            await asyncio.sleep(wait)

    def _check_token(self, event: Event, now: float) -> Refusal | None:
        """Check the HELLO's token again: a refusal that ends the connection when no tenant holds it
        any more; else the connection goes on as the tenant that holds it now."""
        if isinstance(event, Hello | Refusal | NeedData):
            return None
        self._token_checked = now
        verify = self._config.verify
        tenant = verify(self._token) if verify is not None else None
        if isinstance(tenant, Tenant):
            self._serve_as(tenant)
            return None
        return Refusal(event.request_id, request_op(event), AuthenticationError("the token was revoked"), close=True)

    def _hello(self, hello: Hello) -> Hello | Refusal:
        """Serve the connection as the tenant its HELLO proved, within the tenant's connection cap."""
        tenant = hello.identity
        assert tenant is None or isinstance(tenant, Tenant)
        self._token, self._token_checked = hello.token, time.perf_counter()
        if tenant is not None and tenant.quotas.connections:
            if not self._admission.join(tenant.name, tenant.quotas.connections):
                why = f"tenant {tenant.name} holds its {tenant.quotas.connections} connections to this node"
                return Refusal(hello.request_id, Op.HELLO, KVPoolError(why, ErrorCode.OVERLOADED), close=True)
            self._joined = tenant.name
        self._serve_as(tenant)
        return hello

    def _serve_as(self, tenant: Tenant | None) -> None:
        self._restricted = None if tenant is None or tenant.everything else tenant
        self._puts.tenant = self._restricted.name if self._restricted is not None else ""

    def _write_refusal(self, namespace: str) -> ErrorCode | None:
        """Why blocks of ``namespace`` are refused now; None: they are taken."""
        if not self._accepting_writes():
            return ErrorCode.DRAINING
        return write_refusal(self._restricted, namespace)

    def _denied(self, denied: Denied) -> Reply:
        """The answer to a request its tenant may not make."""
        request = denied.request
        if denied.error is not None:
            return [self._answers.error_frame(request.request_id, request_op(request), denied.error)]
        assert denied.statuses is not None
        return [encode(StatusResponse(request.request_id, request_op(request), denied.statuses))]

    def _reply_now(self, request: PutRequest | DeleteRequest | OneSided, reply: Reply, started: float) -> Answer | None:
        """Send a reply that pins no block; what the socket does not take at once is left to :meth:`_complete`."""
        unsent = self._send_now(reply, ())
        if unsent:
            return Answer(request, [], [], started, unsent)
        self._latencies.observe(OP_NAMES[request_op(request)], time.perf_counter() - started)
        return None

    def _send_now(self, reply: Reply, held: Sequence[HeldBlock | None]) -> list[bytes | memoryview] | None:
        """Send what the channel takes of ``reply`` at once; the rest, or None once all went.
        ``held`` is unpinned if the send fails."""
        try:
            unsent = self._send_at_once(reply)
        except BaseException:
            self._store.release(held)
            raise
        return [*unsent] if unsent else None

    def _receive_payload_now(self, target: memoryview) -> None:
        """Fill ``target`` with payload bytes the connection or the kernel already holds."""
        assert self._pollable is not None
        rest = target[self._connection.take_payload(target) :]
        while len(rest):
            received = self._pollable.recv_now(rest)
            if not received:  # the kernel counted them: a bug, not the peer's doing
                raise RuntimeError(f"payload from {self._channel.peer} announced as arrived is missing")
            self._connection.payload_received(received)
            rest = rest[received:]

    # -- the readiness callback: a driver ------------------------------------------

    async def _handed_over(self, idle: float | None) -> Handover:
        """Answer requests in the readiness callback until one needs this coroutine."""
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
            if isinstance(begun, Answer):  # begun in the callback, never to be finished
                self._store.release(begun.held)
            raise
        finally:
            self._pollable.serve_readable(None)
            self._turn = None

    async def _idle_bounded(self, turn: asyncio.Future[Handover], idle: float) -> Handover:
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
            get = self._connection.receive_get_one(self._chunk[: self._pollable.recv_now(self._chunk)])
            handed = self._answer_buffered(get)
        except NodeUnavailable as exc:
            if not self._connection.buffered:  # the peer left between frames
                self._handover(exc)
                return
            handed = None  # run() finds the end of the stream mid-frame
        except Exception as exc:  # a bug: run() raises it, the listener logs it and closes
            self._handover(exc)
            return
        if handed is not False:
            self._handover(handed)

    def _handover(self, handed: Handover | BaseException) -> None:
        assert self._pollable is not None and self._turn is not None
        self._pollable.serve_readable(None)  # run() reads from now on
        if self._turn.done():  # cancelled (shutdown) after this callback was queued
            return
        if isinstance(handed, BaseException):
            self._turn.set_exception(handed)
        else:
            self._turn.set_result(handed)

    def _answer_buffered(self, get: GetOne | None = None) -> Handover | Literal[False]:
        """Step ``get`` (a request taken off the socket whole), then every buffered request,
        until one must wait.

        Returns:
            False when all are answered; else what :meth:`run` must take over.
        """
        if get is not None:
            pending = self._step(get)
            if pending is not None:
                return pending
        while self._connection.buffered:
            event = self._connection.next_event()
            if isinstance(event, NeedData):
                if not self._receive_head_now():
                    return None
                continue
            pending = self._step(event)
            if pending is not None:
                return pending
        self._last_served = time.monotonic()
        return False

    def _receive_head_now(self) -> bool:
        """Receive the rest of a frame's head when the kernel already holds it: a batch's keys
        run past the callback's first chunk. False when they are still on their way (run()
        waits for them, under the head's deadline)."""
        assert self._pollable is not None
        missing = self._connection.head_size - self._connection.buffered
        if self._pollable.pending() < missing:
            return False
        rest = memoryview(bytearray(missing))
        self._connection.receive_data(rest[: self._pollable.recv_now(rest)])
        return True

    # -- the coroutine: the other driver ---------------------------------------------

    async def _complete(self, pending: Pending | None) -> bool:
        """Finish what :meth:`_step` left, waiting as it must; False when the connection must close."""
        match pending:
            case None:
                pass
            case Answer():
                await self._finish(pending)
            case PutRequest():
                await self._put(pending)
            case Hello():
                await self._channel.send([encode(HelloResponse(pending.request_id))])
                self._meter(pending.identity)
            case Refusal():
                if not pending.close:
                    await self._drop(self._connection.payload_left)
                await self._send_error(pending.request_id, pending.op, pending.error)
                return not pending.close
        return True

    async def _finish(self, answer: Answer) -> None:
        """Read the request's SSD blocks, make and send its reply, then unpin its blocks."""
        try:
            if answer.unsent is None:
                arena_only = isinstance(answer.request, LocateRequest)  # an unpromotable block is not read twice
                await self._store.acquire_rest(answer.keys, answer.held, arena_only=arena_only)
                answer.unsent = self._answers.reply(answer)
            await self._channel.send(answer.unsent)
        except BaseException:
            self._store.release(answer.held)
            raise
        self._answers.end(answer)

    async def _put(self, request: PutRequest) -> None:
        """Store a put as its bytes arrive (:meth:`Puts.store`), each block taking its slot only
        once its first bytes are here; the whole payload may take
        :meth:`SessionConfig.payload_deadline`. A write-through put is answered once on SSD."""
        started = time.perf_counter()
        self._counters.add("requests_put")
        outcomes: list[Outcome] = []
        steps = self._puts.store(request, self._write_refusal(request.namespace), outcomes)
        try:
            async with asyncio.timeout(self._config.payload_deadline(sum(request.lengths))):
                for wait in steps:
                    if isinstance(wait, memoryview):
                        await self._receive_payload(wait)
                    else:
                        await self._payload_buffered(wait)
        finally:
            steps.close()  # a put cut short aborts its reservations
        if self._puts.write_through:
            await self._puts.persist(outcomes)  # acknowledged once on SSD
        await self._channel.send(self._puts.reply(request, outcomes))
        self._latencies.observe(_PUT, time.perf_counter() - started)

    async def _payload_buffered(self, nbytes: int) -> None:
        """Wait, without a time limit of its own, until ``nbytes`` of the payload are here."""
        while self._connection.payload_buffered < nbytes:
            await self._receive_some()

    async def _receive_payload(self, target: memoryview) -> None:
        """Fill ``target`` with payload: the bytes that came with the head, then straight from the socket."""
        rest = target[self._connection.take_payload(target) :]
        if len(rest):
            await self._channel.recv_into([rest])
            self._connection.payload_received(len(rest))

    async def _drop(self, nbytes: int) -> None:
        """Receive and drop ``nbytes`` of payload through the daemon's one shared sink: no memory per connection."""
        for piece in self._puts.sink(nbytes):
            await self._receive_payload(piece)

    async def _send_error(self, request_id: int, op: Op, exc: KVPoolError) -> None:
        with contextlib.suppress(NodeUnavailable):  # the peer left: nobody to tell
            await self._channel.send([self._answers.error_frame(request_id, op, exc)])
