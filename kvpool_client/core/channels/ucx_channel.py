"""A data-plane channel over UCX (ucxx), shared by the daemon and the clients.

Importing this module imports ucxx; :mod:`kvpool_client.transport.ucx` imports it
only when a node is dialled over ``ucx``, so kvpool works without ucxx installed.

Progress: each event loop that uses UCX owns one UCX worker through a
:class:`WorkerPump`. In ``blocking`` mode the pump watches the worker's epoll
descriptor with ``loop.add_reader``, progresses the worker when it fires, resolves
the asyncio futures of completed requests, and re-arms the worker once nothing is
posted; while requests are posted it progresses on every loop turn. An idle
connection costs no CPU. ucxx's own asyncio layer is not used: without its
notifier thread it waits for each request by spinning ``asyncio.sleep(0)``, and it
keeps one process-wide worker, which cannot be progressed from several threads.
``polling`` progresses on every loop turn (lowest latency, one core busy).

Framing (tag messages with exact sizes, zero copy for payload) is in
:mod:`kvpool_client.core.channels.ucx_frames`. Each connection starts with a hello
over the UCX stream API in which each side names its receive tags (random per
connection: tag matching is per worker, so tags keep connections apart).

Buffer safety: a request that fails or times out aborts the endpoint, which
cancels every request still posted on it, before the error reaches the caller;
so no late message lands in an arena slot or tensor its owner has reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

# Read when UCX loads, before any context exists; it flags variables UCX reads later as unused.
os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")

import ucxx._lib.libucxx as ucx_api  # after the variable above
from ucxx._lib.arr import Array
from ucxx.types import Tag, TagMaskFull

from kvpool_client.core.channels import ucx_frames as frames
from kvpool_client.core.channels.copy import copy_into
from kvpool_client.core.channels.ucx_builds import nixl_build
from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable, ProtocolError, UsageError

T = TypeVar("T")
Buffer = bytes | bytearray | memoryview

PROGRESS_MODES = ("blocking", "polling")
_SPIN_S = 0.002  # how long a busy worker spins without progress before it sleeps on epoll
_WATCHDOG_S = 0.5  # progress at least this often: a missed epoll wake-up cannot stall a request
_CLOSE_NS = 200_000_000  # most time an abort waits for UCX to cancel an endpoint's requests


@dataclass(frozen=True, slots=True)
class UcxSettings:
    """How a process's UCX context is made.

    Args:
        tls: ``UCX_TLS``; ``tcp,sm`` is fast on one node and correct across nodes
            (``sm`` alone cannot connect). ``rc,...`` needs a system UCX with verbs.
        progress_mode: ``blocking`` (epoll, idle costs nothing) or ``polling``.
        net_devices: ``UCX_NET_DEVICES``; empty leaves UCX's choice.

    Variables already set in the environment (``UCX_TLS`` ...) win over these
    (see :meth:`apply`).
    """

    tls: str = "tcp,sm"
    progress_mode: str = "blocking"
    net_devices: str = ""

    def __post_init__(self) -> None:
        if self.progress_mode not in PROGRESS_MODES:
            raise UsageError(
                f"ucx progress mode must be one of {', '.join(PROGRESS_MODES)}, not {self.progress_mode!r}"
            )

    def ucx_environment(self) -> dict[str, str]:
        """The ``UCX_*`` variables these settings stand for."""
        wanted = {
            "UCX_TLS": self.tls,
            "UCX_MM_ERROR_HANDLING": "y",  # without it shared memory is silently not used with error handling on
            "UCX_TCP_TX_SEG_SIZE": "256K",  # larger than the default: a block takes fewer TCP sends
            "UCX_TCP_RX_SEG_SIZE": "256K",
            "UCX_TCP_CM_REUSEADDR": "y",  # a restarted daemon binds its port while old connections sit in TIME_WAIT
        }
        if self.net_devices:
            wanted["UCX_NET_DEVICES"] = self.net_devices
        return wanted

    def apply(self) -> None:
        """Put these settings into the environment, where UCX reads them, except variables already set.

        UCX takes per-transport options (error handling of shared memory, TCP
        segment sizes) only from the environment: options passed to a context
        were silently ignored here. So they are process-wide, and the first UCX
        context of a process fixes them.
        """
        for name, value in self.ucx_environment().items():
            os.environ.setdefault(name, value)


class WorkerPump:
    """One UCX worker, progressed by the running event loop of the thread that made it."""

    def __init__(self, settings: UcxSettings) -> None:
        nixl = nixl_build()
        if nixl is not None:
            raise KVPoolError(
                f"this process runs NIXL's UCX already ({nixl}: the nixl transport); ucxx's UCX cannot share "
                "a process with it: use one of the two per process",
                ErrorCode.UNAVAILABLE,
            )
        self.loop = asyncio.get_running_loop()
        settings.apply()
        self.context = ucx_api.UCXContext({})
        self.worker = ucx_api.UCXWorker(self.context)
        self._blocking = settings.progress_mode == "blocking"
        self._requests: list[tuple[Any, asyncio.Future[None], tuple[Any, ...]]] = []
        self._probes: list[tuple[Tag, Any, asyncio.Future[Any]]] = []
        self._scheduled = False
        self._closed = False
        self._progressed_at = 0.0  # monotonic time UCX last made progress
        if self._blocking:
            self.worker.init_blocking_progress_mode()
            self.loop.add_reader(self.worker.epoll_file_descriptor, self.schedule)
        self._watchdog = self.loop.call_later(_WATCHDOG_S, self._tick)

    def wait(self, request: Any, *keep: Any) -> asyncio.Future[None]:
        """A future done when ``request`` completes; ``keep`` (its buffers) lives until then."""
        future: asyncio.Future[None] = self.loop.create_future()
        self._requests.append((request, future, keep))
        self._progressed_at = time.monotonic()  # a new request: spin for it before sleeping
        self.schedule()
        return future

    def probe(self, tag: Tag, endpoint: Any) -> asyncio.Future[Any]:
        """A future with the probe result of the next message on ``tag`` (removed from the queue)."""
        future: asyncio.Future[Any] = self.loop.create_future()
        self._probes.append((tag, endpoint, future))
        self.schedule()
        return future

    def schedule(self) -> None:
        if not self._scheduled and not self._closed:
            self._scheduled = True
            self.loop.call_soon(self._pass)

    def close(self) -> None:
        """Stop progressing; waiters fail. The worker itself goes with its last reference."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.cancel()
        if self._blocking:
            self.loop.remove_reader(self.worker.epoll_file_descriptor)
        for _, future, _ in self._requests:
            _fail(future, NodeUnavailable("the UCX worker was closed"))
        for _, _, future in self._probes:
            _fail(future, NodeUnavailable("the UCX worker was closed"))
        self._requests, self._probes = [], []

    def _tick(self) -> None:
        self.schedule()
        self._watchdog = self.loop.call_later(_WATCHDOG_S, self._tick)

    def _pass(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        progressed = False
        while self.worker.progress_once():
            progressed = True
        progressed = self._resolve_requests() | self._resolve_probes() | progressed
        now = time.monotonic()
        if progressed:
            self._progressed_at = now
        # While a transfer moves, progress on every loop turn: a rendezvous moves in
        # fragments, and sleeping on epoll between them adds a wake-up to each. After
        # 2 ms without progress (the peer is not running, or nothing is posted) sleep
        # on epoll, so that the spinning threads of several clients and the daemon do
        # not keep the cores busy. Arming fails (False) while events are pending.
        spin = self._requests and now - self._progressed_at < _SPIN_S
        if spin and not progressed:
            # Spin politely: a peer waiting for a core (the daemon behind four clients
            # on two cores) gets this one; with an idle core this returns at once.
            os.sched_yield()
        if not self._blocking or spin or not self.worker.arm():
            self.schedule()

    def _resolve_requests(self) -> bool:
        """Settle the futures of finished requests; True when any finished."""
        pending = []
        for entry in self._requests:
            request, future = entry[0], entry[1]
            if not request.completed:
                if not future.cancelled():
                    pending.append(entry)
                continue
            try:
                request.check_error()
            except Exception as exc:  # any UCX error means the peer or link is gone
                _fail(future, NodeUnavailable(f"UCX request failed: {exc}"))
            else:
                if not future.done():
                    future.set_result(None)
        finished = len(pending) < len(self._requests)
        self._requests = pending
        return finished

    def _resolve_probes(self) -> bool:
        """Hand matched messages to their probes; True when any matched."""
        waiting = []
        for tag, endpoint, future in self._probes:
            if future.done():
                continue
            result = self.worker.tag_probe(tag, TagMaskFull, True)
            if result.matched:
                future.set_result(result)
            elif not endpoint.alive:
                _fail(future, NodeUnavailable("the UCX peer closed the connection"))
            else:
                waiting.append((tag, endpoint, future))
        matched = len(waiting) < len(self._probes)
        self._probes = waiting
        return matched


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # retrieved: a caller that stopped waiting must not log it


class UcxChannel:
    """Ordered bytes over one UCX endpoint, with the interface of the TCP channels.

    Serves a daemon's :class:`~kvpool_server.data.session.Session` and, through
    :mod:`kvpool_client.transport.ucx`, the clients' exchanges.

    Args:
        pump: the worker the endpoint belongs to (this loop's).
        endpoint: a connected ``UCXEndpoint`` whose hello is done.
        send_base, recv_base: the peer's and this side's tag bases.
        stall_timeout: most seconds one wait may take once a transfer has started
            (``recv_some`` is exempt: an idle connection is fine); None: no limit.
        max_segment: the largest segment accepted (the node's frame limit).
    """

    def __init__(
        self,
        pump: WorkerPump,
        endpoint: Any,
        send_base: int,
        recv_base: int,
        peer: str,
        stall_timeout: float | None = None,
        max_segment: int = 1 << 30,
    ) -> None:
        self.peer = peer
        self.deadline: float | None = None  # monotonic; bounds every wait too when set (client requests)
        self._pump = pump
        self._endpoint = endpoint
        self._head_out, self._segment_out = Tag(send_base), Tag(send_base | 1)
        self._head_in, self._segment_in = Tag(recv_base), Tag(recv_base | 1)
        self._stall_timeout = stall_timeout
        self._max_segment = max_segment
        self._inline = bytearray()  # received bytes not handed out yet
        self._segments: deque[int] = deque()  # sizes of the current unit's segments not received yet
        self.broken = False

    # -- sending -------------------------------------------------------------------

    async def send(self, buffers: Sequence[Buffer]) -> None:
        """Send every byte of ``buffers``, in order; payload buffers go without a copy.

        Raises:
            UsageError: a buffer is not contiguous.
            NodeUnavailable: the peer is gone.
            TimeoutError: the transfer stalled past the stall timeout or deadline.
        """
        views = [_contiguous(b) for b in buffers if len(b)]
        waits: list[asyncio.Future[None]] = []
        post = self._post
        for unit in frames.plan_units([len(v) for v in views]):
            segments = [views[i] for i in unit.segments]
            head = frames.encode_head([views[i] for i in unit.inline], [len(s) for s in segments])
            waits.append(post(lambda h=head: self._endpoint.tag_send(Array(h), self._head_out), head))
            for segment in segments:
                waits.append(post(lambda s=segment: self._endpoint.tag_send(Array(s), self._segment_out), segment))
        await self._await(asyncio.gather(*waits), self._stall_timeout)

    # -- receiving -----------------------------------------------------------------

    async def recv_into(self, targets: Sequence[memoryview]) -> None:
        """Fill every buffer in ``targets`` exactly, in order.

        Raises:
            UsageError: a target is not writable and contiguous.
            NodeUnavailable: the peer is gone before all bytes came.
            TimeoutError: the peer went silent past the stall timeout or deadline.
            ProtocolError: the peer broke the framing.
        """
        rest = [_writable(t) for t in targets if len(t)]
        while rest:
            rest = self._take_inline(rest)
            if not rest:
                return
            if not self._segments:
                await self._recv_head(self._stall_timeout)
                continue
            slices, rest = frames.fit_segments(self._segments, rest)
            if slices:
                waits = [self._post(self._segment_receiver(s), s) for s in slices]
                await self._await(asyncio.gather(*waits), self._stall_timeout)
            else:
                await self._bounce_segment()

    async def recv_some(self, target: memoryview) -> int:
        """Receive at least one byte into ``target``, waiting as long as it takes."""
        return await self._recv_some(_writable(target), None)

    async def recv_upto(self, nbytes: int) -> bytes:
        """Receive between 1 and ``nbytes`` bytes, bounded by the stall timeout."""
        data = bytearray(nbytes)
        count = await self._recv_some(memoryview(data), self._stall_timeout)
        return bytes(data[:count])

    async def recv_exactly(self, nbytes: int) -> bytearray:
        data = bytearray(nbytes)
        await self.recv_into([memoryview(data)])
        return data

    def reusable(self) -> bool:
        """True when the peer is there and nothing unasked was received."""
        return not self.broken and self._endpoint.alive and not self._inline and not self._segments

    def close(self) -> None:
        """Abort the endpoint (idempotent): requests still posted on it are cancelled."""
        self.broken = True
        endpoint, self._endpoint = self._endpoint, _Closed()
        if not isinstance(endpoint, _Closed):
            _abort(endpoint)

    async def _recv_some(self, target: memoryview, timeout: float | None) -> int:
        while not self._inline:
            if not self._segments:
                await self._recv_head(timeout)
            elif self._segments[0] <= len(target):
                size = self._segments.popleft()
                await self._await(self._post(self._segment_receiver(target[:size]), target), timeout)
                return size
            else:
                await self._bounce_segment()
        return self._copy_inline(target)

    def _copy_inline(self, target: memoryview) -> int:
        count = min(len(target), len(self._inline))
        with memoryview(self._inline) as inline:  # released before the del below resizes it
            copy_into(target[:count], inline[:count])
        del self._inline[:count]
        return count

    def _take_inline(self, targets: list[memoryview]) -> list[memoryview]:
        """Hand out inline bytes to the leading targets; returns what is left to fill."""
        rest = targets
        while self._inline and rest:
            count = self._copy_inline(rest[0])
            rest = rest[1:] if count == len(rest[0]) else [rest[0][count:], *rest[1:]]
        return rest

    async def _recv_head(self, timeout: float | None) -> None:
        probed = await self._await(self._pump.probe(self._head_in, self._endpoint), timeout)
        if probed.length > frames.HEAD_LIMIT:
            self.close()
            raise ProtocolError(f"a ucx head of {probed.length} bytes is over {frames.HEAD_LIMIT}")
        raw = bytearray(probed.length)
        receive = self._endpoint.tag_recv_with_handle
        await self._await(self._post(lambda: receive(Array(raw), probed), raw), timeout)
        try:
            inline, sizes = frames.decode_head(raw, self._max_segment)
        except ProtocolError:
            self.close()
            raise
        self._inline += inline
        self._segments.extend(sizes)

    async def _bounce_segment(self) -> None:
        """Receive the next segment into a scratch buffer: the reader's buffers are cut differently."""
        scratch = bytearray(self._segments.popleft())
        await self._await(self._post(self._segment_receiver(memoryview(scratch)), scratch), self._stall_timeout)
        self._inline += scratch

    def _segment_receiver(self, target: memoryview) -> Any:
        endpoint, tag = self._endpoint, self._segment_in
        return lambda: endpoint.tag_recv(Array(target), tag, TagMaskFull)

    # -- waiting ---------------------------------------------------------------------

    def _post(self, submit: Any, *keep: Any) -> asyncio.Future[None]:
        """Submit one request on the endpoint and track it; a dead endpoint raises NodeUnavailable."""
        if self.broken:
            raise NodeUnavailable(f"the ucx connection to {self.peer} is closed")
        try:
            self._endpoint.raise_on_error()
            request = submit()
        except KVPoolError:
            raise
        except Exception as exc:  # ucxx raises its own error family
            self.close()
            raise NodeUnavailable(f"ucx to {self.peer} failed: {exc}") from exc
        return self._pump.wait(request, *keep)

    async def _await(self, waiter: Awaitable[T], timeout: float | None) -> T:
        """Await ``waiter`` within ``timeout`` and the deadline; any failure aborts the connection first."""
        limit = self._limit(timeout)
        try:
            return await asyncio.wait_for(waiter, limit)
        except TimeoutError:
            self.close()
            raise TimeoutError(f"{self.peer} stalled for more than {limit:.3f}s") from None
        except BaseException:
            self.close()  # cancelled or failed mid-transfer: the stream position is lost
            raise

    def _limit(self, timeout: float | None) -> float | None:
        if self.deadline is None:
            return timeout
        left = max(0.0, self.deadline - time.monotonic())
        return left if timeout is None else min(left, timeout)


class _Closed:
    """Stands in for an aborted endpoint: every use fails as a closed connection would."""

    alive = False

    def raise_on_error(self) -> None:
        raise NodeUnavailable("the ucx connection is closed")


def _abort(endpoint: Any) -> None:
    with contextlib.suppress(Exception):  # closing a dead endpoint may fail; it is gone either way
        endpoint.close_blocking(period=_CLOSE_NS, max_attempts=1)
        endpoint.remove_close_callback()


def _contiguous(buffer: Buffer) -> memoryview:
    """A flat byte view; ucxx does not check contiguity itself (it would send wrong bytes)."""
    view = memoryview(buffer)
    if not view.c_contiguous:
        raise UsageError("a buffer sent over ucx must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _writable(target: memoryview) -> memoryview:
    view = _contiguous(target)
    if view.readonly:
        raise UsageError("a buffer received over ucx must be writable")
    return view


# -- connecting ----------------------------------------------------------------------


def new_tag_base() -> int:
    """A random even 64-bit tag base: heads on it, segments on it + 1."""
    return int.from_bytes(os.urandom(8), "little") & ~1


async def hello(pump: WorkerPump, endpoint: Any, *, initiator: bool, timeout: float) -> tuple[int, int]:
    """Exchange tag bases over the stream API; returns (the peer's base, this side's base).

    Raises:
        NodeUnavailable: the peer is unreachable or left.
        TimeoutError: no hello within ``timeout``.
        ProtocolError: the peer is not a kvpool ucx peer.
    """
    mine = new_tag_base()
    ours, theirs = frames.encode_hello(mine), bytearray(frames.HELLO.size)

    async def step(send: bool) -> None:
        buffer = ours if send else theirs
        request = endpoint.stream_send(Array(buffer)) if send else endpoint.stream_recv(Array(buffer))
        await pump.wait(request, buffer)

    try:
        for send in (True, False) if initiator else (False, True):
            await asyncio.wait_for(step(send), timeout)
    except BaseException:
        _abort(endpoint)
        raise
    return frames.decode_hello(theirs), mine


def listen(pump: WorkerPump, port: int, on_connection: Callable[[Any], None]) -> Any:
    """A UCX listener on ``port`` (0: any) of every interface; ``on_connection(endpoint)`` runs during progress.

    The listener stops when the returned object is released.
    """
    return ucx_api.UCXListener.create(pump.worker, port, on_connection, (), deliver_endpoint=True)


async def connect(pump: WorkerPump, host: str, port: int, timeout: float, stall_timeout: float | None) -> UcxChannel:
    """Dial a node's ucx endpoint and say hello.

    Raises:
        NodeUnavailable: it cannot be reached.
        TimeoutError: the hello did not finish within ``timeout``.
    """
    try:
        endpoint = ucx_api.UCXEndpoint.create(pump.worker, host, port, True)
    except Exception as exc:  # ucxx raises its own error family
        raise NodeUnavailable(f"cannot connect to ucx://{host}:{port}: {exc}") from exc
    peer_base, mine = await hello(pump, endpoint, initiator=True, timeout=timeout)
    return UcxChannel(pump, endpoint, peer_base, mine, f"{host}:{port}", stall_timeout)
