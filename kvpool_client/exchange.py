"""One request/response exchange per data-plane op, written once for every transport.

Each exchange is a generator that *yields* the I/O it needs (:class:`Send`,
:class:`Receive`, :class:`ReceiveInto`, and :class:`Transfer` for a one-sided
copy) and is resumed with the result. It owns
the protocol logic (encoding, decoding, where each payload byte goes, checksum
verification); :func:`run_sync` and :func:`run_async` are the only places that
touch a connection. So the blocking client and the asyncio client cannot drift
apart, and the protocol logic is tested without sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar, cast

from kvpool_client.buffers import Target, spans
from kvpool_client.buffers import checksum as checksum_of
from kvpool_client.core.errors import ErrorCode, KVPoolError, ProtocolError, error_for_code
from kvpool_client.core.wire import (
    HEADER_SIZE,
    CommitRequest,
    DeleteRequest,
    ErrorResponse,
    ExistsRequest,
    GetRequest,
    GetResponse,
    HelloRequest,
    HelloResponse,
    LocateRequest,
    LocateResponse,
    Op,
    PeerRequest,
    PeerResponse,
    PingRequest,
    PingResponse,
    PutRequest,
    ReserveRequest,
    ReserveResponse,
    Response,
    StatusResponse,
    WireLimits,
    decode_header,
    decode_message,
    encode,
)
from kvpool_client.core.wire.codec import answer_meta_size
from kvpool_client.core.wire.layout import PEER_RESPONSE
from kvpool_client.core.wire.one_key import (
    GET_ONE_ANSWER_SIZE,
    PUT_ONE_ANSWER_SIZE,
    decode_get_one,
    decode_put_one_answer,
    encode_get_one_request,
    encode_put_one_request,
)
from kvpool_client.transport.nixl import RemoteArena
from kvpool_client.transport.shm import MappedArena, SlotLocation

T = TypeVar("T")
Arena = MappedArena | RemoteArena  # a node's arena that gets copy out of: mapped here, or one-sided
_DRAIN_CHUNK = 1 << 20
_OK = int(ErrorCode.OK)
_OVERLOADED = int(ErrorCode.OVERLOADED)


# Steps are not frozen: three are made per request, and a frozen one sets each field through object.__setattr__.
@dataclass(slots=True)
class Send:
    buffers: list[bytes | memoryview]


@dataclass(slots=True)
class Receive:
    nbytes: int


@dataclass(slots=True)
class ReceiveUpTo:
    """Whatever has arrived, 1 to ``nbytes`` bytes: reads header and meta in one call."""

    nbytes: int


@dataclass(slots=True)
class ReceiveInto:
    targets: list[memoryview]


@dataclass(slots=True)
class Transfer:
    """A one-sided transfer (NIXL READs and WRITEs) that blocks until done: the asyncio driver
    runs it on ``thread``, so its event loop goes on while the bytes move (or while a hung node
    lets the transfer time out). Its outcome is raised or returned inside the exchange."""

    work: Callable[[], Any]
    thread: Executor
    value: Any = None
    error: Exception | None = None

    def run(self) -> None:
        try:
            self.value = self.work()
        except Exception as exc:  # raised again inside the exchange, which may handle it
            self.error = exc

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


Step = Send | Receive | ReceiveUpTo | ReceiveInto | Transfer
Exchange = Generator[Step, Any, T]
GetAnswer = tuple[list[int], list[Target | None]]  # per-key statuses, filled buffers (None where not OK)


class SyncConnection(Protocol):
    def send(self, buffers: list[bytes | memoryview]) -> None: ...

    def recv_exactly(self, nbytes: int) -> bytearray: ...

    def recv_upto(self, nbytes: int) -> bytes: ...

    def recv_into(self, targets: list[memoryview]) -> None: ...


class AsyncConnection(Protocol):
    async def send(self, buffers: list[bytes | memoryview]) -> None: ...

    async def recv_exactly(self, nbytes: int) -> bytearray: ...

    async def recv_upto(self, nbytes: int) -> bytes: ...

    async def recv_into(self, targets: list[memoryview]) -> None: ...


def run_sync(connection: SyncConnection, exchange: Exchange[T]) -> T:
    """Drive ``exchange`` over a blocking connection."""
    reply: Any = None
    while True:
        try:
            step = exchange.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result
        # Dispatched inline, not in a helper: this loop runs three times per request.
        reply = None
        if isinstance(step, Send):
            connection.send(step.buffers)
        elif isinstance(step, ReceiveUpTo):
            reply = connection.recv_upto(step.nbytes)
        elif isinstance(step, ReceiveInto):
            connection.recv_into(step.targets)
        elif isinstance(step, Transfer):
            step.run()
        else:
            reply = connection.recv_exactly(step.nbytes)


async def run_async(connection: AsyncConnection, exchange: Exchange[T]) -> T:
    """Drive ``exchange`` over an asyncio connection."""
    reply: Any = None
    while True:
        try:
            step = exchange.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result
        reply = None
        if isinstance(step, Send):
            await connection.send(step.buffers)
        elif isinstance(step, ReceiveUpTo):
            reply = await connection.recv_upto(step.nbytes)
        elif isinstance(step, ReceiveInto):
            await connection.recv_into(step.targets)
        elif isinstance(step, Transfer):
            await asyncio.get_running_loop().run_in_executor(step.thread, step.run)
        else:
            reply = await connection.recv_exactly(step.nbytes)


# -- exchanges ----------------------------------------------------------------


def put(request: PutRequest, blocks: Sequence[Target], limits: WireLimits) -> Exchange[list[int]]:
    """Send blocks (each one view, or the regions it is gathered from); returns one status per key
    (OK, ALREADY_EXISTS, BUSY, ...)."""
    count = len(request.hashes)
    if count != 1:
        yield Send([encode(request), *(view for block in blocks for view in spans(block))])
        response = yield from _response(request.request_id, Op.PUT, limits, answer_meta_size(Op.PUT, count))
        return _statuses(response, count)
    depth = request.depths[0] if request.depths else None
    head = encode_put_one_request(request.request_id, request.namespace, request.hashes[0], request.lengths[0], depth)
    yield Send([head, *spans(blocks[0])])
    answer: bytes = yield ReceiveUpTo(PUT_ONE_ANSWER_SIZE)
    status = decode_put_one_answer(answer, request.request_id, limits)
    if status is None:  # an error, or an answer in pieces: read the general way
        meta = answer_meta_size(Op.PUT, 1)
        return _statuses((yield from _response(request.request_id, Op.PUT, limits, meta, answer)), 1)
    return [status]


def get(
    request: GetRequest,
    targets: Sequence[Target | None],
    limits: WireLimits,
    verify: bool,
) -> Exchange[GetAnswer]:
    """Fetch blocks into ``targets``; a ``None`` target gets a new buffer of the stored size.

    Returns:
        Per-key statuses and the filled buffers (``None`` where not OK). A stored
        block whose length differs from its target is drained: ``SIZE_MISMATCH``.
    """
    hashes = request.hashes
    yield Send(
        [
            encode_get_one_request(request.request_id, request.namespace, hashes[0])
            if len(hashes) == 1
            else encode(request)
        ]
    )
    head: bytes = yield ReceiveUpTo(HEADER_SIZE + answer_meta_size(Op.GET, len(hashes)))
    return (yield from _get_answer(head, request.request_id, targets, limits, verify))


def _get_answer(
    head: bytes, request_id: int, targets: Sequence[Target | None], limits: WireLimits, verify: bool
) -> Exchange[GetAnswer]:
    """The rest of :func:`get` once ``head``, the answer's first bytes (up to its header and
    meta), is here."""
    one = decode_get_one(head, request_id, limits) if len(targets) == 1 else None
    if one is not None:
        return (yield from _get_one(*one, targets[0], verify))
    expected_meta = answer_meta_size(Op.GET, len(targets))
    response = yield from _response(request_id, Op.GET, limits, expected_meta, head)
    if not isinstance(response, GetResponse) or len(response.statuses) != len(targets):
        raise ProtocolError(f"expected {len(targets)} GET results, got {response!r}")
    statuses = list(response.statuses)
    filled: list[Target | None] = [None] * len(targets)
    sinks: list[memoryview] = []
    scratch: memoryview | None = None  # only for blocks that do not fit their target
    for i, (target, length) in enumerate(zip(targets, response.lengths, strict=True)):
        if statuses[i] != _OK:
            continue
        if target is None:
            target = memoryview(bytearray(length))
        if len(target) == length:
            filled[i] = target
            sinks.extend(spans(target))
        else:
            statuses[i] = ErrorCode.SIZE_MISMATCH
            scratch = scratch or memoryview(bytearray(min(_DRAIN_CHUNK, max(response.lengths))))
            sinks.extend(_scratch_slices(scratch, length))
    yield ReceiveInto(sinks)
    if verify:
        for i, view in enumerate(filled):
            if view is not None and checksum_of(view) != response.checksums[i]:
                statuses[i], filled[i] = ErrorCode.CHECKSUM_MISMATCH, None
    return statuses, filled


def _get_one(status: int, length: int, checksum: int, target: Target | None, verify: bool) -> Exchange[GetAnswer]:
    """The rest of :func:`get` for one key whose answer :func:`decode_get_one` read: what the
    general path returns for it, without its per-key lists."""
    if status != _OK:
        return [status], [None]
    if target is None:
        target = memoryview(bytearray(length))
    if len(target) != length:
        yield ReceiveInto(_scratch_slices(memoryview(bytearray(min(_DRAIN_CHUNK, length))), length))
        return [int(ErrorCode.SIZE_MISMATCH)], [None]
    yield ReceiveInto(list(spans(target)))
    if verify and checksum_of(target) != checksum:
        return [int(ErrorCode.CHECKSUM_MISMATCH)], [None]
    return [status], [target]


@dataclass(slots=True)
class SingleGet:
    """A get of one key into one buffer, the most common request of all.

    Over a transport that runs exchanges (ucx, asyncio) it is :meth:`steps`, the :func:`get`
    exchange. Over a blocking socket, :meth:`run_sync` performs the usual answer (the block,
    of the target's size) in line, without the exchange's generator and steps (their cost shows
    in a one-block get's client CPU); any other answer is read by :func:`get`'s own code
    from where :meth:`run_sync` stopped. Both return what :func:`get` returns.
    """

    request_id: int
    namespace: str
    block: bytes
    target: Target
    limits: WireLimits
    verify: bool

    def steps(self) -> Exchange[GetAnswer]:
        return get(GetRequest(self.request_id, self.namespace, [self.block]), [self.target], self.limits, self.verify)

    def run_sync(self, connection: SyncConnection) -> GetAnswer:
        request_id, target = self.request_id, self.target
        connection.send([encode_get_one_request(request_id, self.namespace, self.block)])
        head = connection.recv_upto(GET_ONE_ANSWER_SIZE)
        one = decode_get_one(head, request_id, self.limits)
        if one is None or one[0] != _OK or one[1] != len(target):  # a miss, an error, another size
            return run_sync(connection, _get_answer(head, request_id, [target], self.limits, self.verify))
        connection.recv_into(list(spans(target)))
        if self.verify and checksum_of(target) != one[2]:
            return [int(ErrorCode.CHECKSUM_MISMATCH)], [None]
        return [_OK], [target]


Request = Exchange[T] | SingleGet
"""What a client runs on a connection: an exchange, or a :class:`SingleGet` (a get's exchange)."""


def steps_of(request: Request[T]) -> Exchange[T]:
    """``request`` as the exchange a transport that runs steps (ucx, asyncio) runs."""
    if isinstance(request, SingleGet):
        return cast("Exchange[T]", request.steps())  # T is GetAnswer: a SingleGet is a get
    return request


def get_shared(
    request: LocateRequest,
    targets: Sequence[Target | None],
    limits: WireLimits,
    verify: bool,
    arena: Arena,
) -> Exchange[GetAnswer]:
    """Fetch blocks by copying them out of the node's ``arena`` (mapped here, or read one-sided), as
    :func:`get` does over the wire:
    from their known places with no I/O (:func:`copy_known`), else located first (:func:`locate_shared`).

    A plan runs it on a connection it took first, so a node that cannot be reached fails the
    exchange before any block is copied into ``targets``.
    """
    copied = yield from _in_arena(arena, partial(copy_known, request.namespace, request.hashes, targets, arena, verify))
    if copied is not None:
        return copied
    return (yield from locate_shared(request, targets, limits, verify, arena))


def _in_arena(arena: Arena, work: Callable[[], T]) -> Exchange[T]:
    """``work``, which copies out of or into ``arena``: in line from a mapping (a memcpy); a
    :class:`Transfer` step of its own when the arena is a node's, reached one-sided."""
    if isinstance(arena, MappedArena):
        return work()
    step = Transfer(work, arena.thread)
    yield step
    return cast("T", step.outcome())


def locate_shared(
    request: LocateRequest,
    targets: Sequence[Target | None],
    limits: WireLimits,
    verify: bool,
    arena: Arena,
) -> Exchange[GetAnswer]:
    """:func:`get_shared` of blocks whose places the node is asked for.

    The node says where each block lies (LOCATE); each is copied into its target (out of the
    mapping, or in one READ of them all) and kept only if its slot's generation did not change
    meanwhile (read after every copy: one READ more, one-sided). Blocks whose
    slot was reused during the copy, and blocks the node holds outside the arena,
    are fetched with one GET on the same connection. An answer for another arena
    (the node restarted) marks ``arena`` stale and fetches everything with GET.
    """
    yield Send([encode(request)])
    response = yield from _response(
        request.request_id, Op.LOCATE, limits, answer_meta_size(Op.LOCATE, len(request.hashes))
    )
    if not isinstance(response, LocateResponse) or len(response.statuses) != len(targets):
        raise ProtocolError(f"expected {len(targets)} LOCATE results, got {response!r}")
    if response.arena_id != arena.arena_id:
        arena.stale = True  # the node restarted: its arena is another file now
        count = len(targets)
        filled: list[Target | None] = [None] * count
        statuses, again = [int(ErrorCode.NOT_IN_ARENA)] * count, list(range(count))
    else:
        statuses, filled, again = yield from _in_arena(arena, partial(_copy_located, response, targets, arena, verify))
        for i, view in enumerate(filled):
            if view is not None:
                where = SlotLocation(response.offsets[i], response.lengths[i], response.generations[i])
                arena.known.remember(request.namespace, request.hashes[i], where, response.checksums[i])
    if again:
        rest = GetRequest(request.request_id, request.namespace, [request.hashes[i] for i in again])
        codes, views = yield from get(rest, [targets[i] for i in again], limits, verify)
        for i, code, view in zip(again, codes, views, strict=True):
            statuses[i], filled[i] = code, view
    return statuses, filled


def copy_known(
    namespace: str,
    hashes: Sequence[bytes],
    targets: Sequence[Target | None],
    arena: Arena,
    verify: bool,
) -> GetAnswer | None:
    """The blocks copied out of ``arena`` without asking the node, when every block's location is
    known (an earlier answer within its ttl, or the node's published index while the node's
    heartbeat vouches for it) and holds: each generation the same before its copy (a block gone
    costs no copy) and after it, and its checksum matching when this client or the node verifies
    them. None: ask the node.

    No connection: a client runs it on a mapped arena before it takes one at all; a remote arena
    (read one-sided: the generations, the blocks, the generations again) as the first
    :class:`Transfer` of :func:`get_shared`. With the compiled reader each block is
    one call (found, copied, checked): an engine loads the blocks a lookup just found, so a block
    missing midway, whose batch is then asked for whole, is rare; otherwise every block is found
    before any is copied.
    """
    verify = verify or arena.verify_checksums
    if isinstance(arena, MappedArena) and arena.compiled and (now := arena.trusted_now()) is not None:
        for block, target in zip(hashes, targets, strict=True):
            if target is None:
                break  # the general reader sizes the buffer it allocates
            copied = arena.read_published(namespace, block, target, verify, now)
            if copied is None:  # not published (yet): an earlier answer may know it
                place = arena.known.find(namespace, block)
                copied = place is not None and _copy_known(namespace, block, *place, target, arena, verify)
            if not copied:
                return None
        else:
            return [_OK] * len(targets), list(targets)
    known = arena.known.lookup(namespace, hashes)
    if known is None:
        return None
    filled = [memoryview(bytearray(k[0].length)) if t is None else t for k, t in zip(known, targets, strict=True)]
    if any(len(target) != location.length for (location, _), target in zip(known, filled, strict=True)):
        return None  # the node's answer reports it
    held = arena.copy_held_all([(location, target) for (location, _), target in zip(known, filled, strict=True)])
    copied = True
    for block, (_, checksum), target, kept in zip(hashes, known, filled, held, strict=True):
        if not kept or (verify and checksum_of(target) != checksum):
            arena.known.forget(namespace, block)
            copied = False
    return ([_OK] * len(filled), list(filled)) if copied else None


def _copy_known(
    namespace: str,
    block: bytes,
    location: SlotLocation,
    checksum: int,
    target: Target,
    arena: MappedArena,
    verify: bool,
) -> bool:
    """Copy a block from its known location into ``target``; False when it is no longer there.

    Its generation is read before the copy (a block gone already costs no copy, and the
    target stays as it was) and after it (the slot was not reused meanwhile).
    """
    if len(target) != location.length:
        return False  # the node's answer reports it
    if not arena.copy_held(location, target) or (verify and checksum_of(target) != checksum):
        arena.known.forget(namespace, block)
        return False
    return True


def _copy_located(
    response: LocateResponse, targets: Sequence[Target | None], arena: Arena, verify: bool
) -> tuple[list[int], list[Target | None], list[int]]:
    """Copy each located block into its target: (statuses, filled buffers, indices to GET instead)."""
    statuses = list(response.statuses)
    filled: list[Target | None] = [None] * len(targets)
    copied: list[tuple[int, SlotLocation, Target]] = []
    for i, target in enumerate(targets):
        if statuses[i] != _OK:
            continue
        location = SlotLocation(response.offsets[i], response.lengths[i], response.generations[i])
        target = memoryview(bytearray(location.length)) if target is None else target
        if len(target) != location.length:
            statuses[i] = ErrorCode.SIZE_MISMATCH
            continue
        filled[i] = target
        copied.append((i, location, target))
    arena.copy_all([(location, target) for _, location, target in copied])
    again = [i for i, status in enumerate(statuses) if status == ErrorCode.NOT_IN_ARENA]
    # Every check comes after every copy: a reuse during one shows.
    held = arena.unchanged_all([location for _, location, _ in copied])
    for (i, _, target), unchanged in zip(copied, held, strict=True):
        if not unchanged:
            filled[i] = None
            again.append(i)
        elif verify and checksum_of(target) != response.checksums[i]:
            statuses[i], filled[i] = ErrorCode.CHECKSUM_MISMATCH, None
    return statuses, filled, sorted(again)


def with_peer(request_id: int, limits: WireLimits, arena: RemoteArena, then: Exchange[T]) -> Exchange[T]:
    """``then``, once ``arena`` knows the node's one-sided peer (asked with PEER first if it does not)."""
    if not arena.ready:
        yield Send([encode(PeerRequest(request_id))])
        response = yield from _response(request_id, Op.PEER, limits, PEER_RESPONSE.size)
        if not isinstance(response, PeerResponse):
            raise ProtocolError(f"expected a PEER response, got {response!r}")
        yield from _in_arena(arena, partial(arena.connect, response))
    return (yield from then)


def put_one_sided(
    request: ReserveRequest, blocks: Sequence[Target], limits: WireLimits, arena: RemoteArena
) -> Exchange[list[int]]:
    """Store blocks by writing them into slots the node reserved: RESERVE, one WRITE, COMMIT; returns
    what :func:`put` returns.

    A node holds no more reserved bytes than its admission budget (over every connection):
    blocks it refused ``OVERLOADED`` are reserved again once the others are committed; a round
    that reserves none (other puts hold the budget) sends the rest over the wire, which takes
    a block's slot only while its bytes arrive. An answer for another arena (the node
    restarted) marks ``arena`` stale and puts the rest over the wire; a WRITE that fails gives
    its slots back before it raises.
    """
    statuses = [_OVERLOADED] * len(request.hashes)
    pending, one_sided = list(range(len(request.hashes))), True
    while pending:
        depths = None if request.depths is None else [request.depths[i] for i in pending]
        hashes, lengths = [request.hashes[i] for i in pending], [request.lengths[i] for i in pending]
        mine = [blocks[i] for i in pending]
        if one_sided:
            rest = ReserveRequest(request.request_id, request.namespace, hashes, lengths, depths)
            codes = yield from _reserve_write_commit(rest, mine, limits, arena)
        else:
            codes = yield from put(
                PutRequest(request.request_id, request.namespace, hashes, lengths, depths), mine, limits
            )
        for i, code in zip(pending, codes, strict=True):
            statuses[i] = code
        left = [i for i, code in zip(pending, codes, strict=True) if code == _OVERLOADED]
        if not left or not one_sided:
            break
        one_sided = len(left) < len(pending)  # a round that reserved nothing: the rest over the wire
        pending = left
    return statuses


def _reserve_write_commit(
    request: ReserveRequest, blocks: Sequence[Target], limits: WireLimits, arena: RemoteArena
) -> Exchange[list[int]]:
    """One round of :func:`put_one_sided`."""
    count = len(request.hashes)
    yield Send([encode(request)])
    reserved = yield from _response(request.request_id, Op.RESERVE, limits, answer_meta_size(Op.RESERVE, count))
    if not isinstance(reserved, ReserveResponse) or len(reserved.statuses) != count:
        raise ProtocolError(f"expected {count} RESERVE results, got {reserved!r}")
    mine = [i for i, status in enumerate(reserved.statuses) if status == _OK]
    if reserved.arena_id != arena.arena_id:
        arena.stale = True
        yield from _commit(request.request_id, reserved.lease, [], limits)  # gives the slots back
        wired = PutRequest(request.request_id, request.namespace, request.hashes, request.lengths, request.depths)
        return (yield from put(wired, blocks, limits))
    if mine:
        try:
            yield from _in_arena(arena, partial(arena.write_all, [(reserved.offsets[i], blocks[i]) for i in mine]))
        except KVPoolError:
            arena.stale = True
            yield from _commit(request.request_id, reserved.lease, [], limits)
            raise
    checksums = [checksum_of(blocks[i]) if status == _OK else 0 for i, status in enumerate(reserved.statuses)]
    committed = yield from _commit(request.request_id, reserved.lease, checksums, limits)
    return [committed[i] if status == _OK else status for i, status in enumerate(reserved.statuses)]


def _commit(request_id: int, lease: int, checksums: list[int], limits: WireLimits) -> Exchange[list[int]]:
    """COMMIT a lease (no checksums: give its slots back); one status per block."""
    yield Send([encode(CommitRequest(request_id, lease, checksums))])
    response = yield from _response(request_id, Op.COMMIT, limits, answer_meta_size(Op.COMMIT, len(checksums)))
    return _statuses(response, len(checksums))


def fail(error: KVPoolError) -> Exchange[Any]:
    """An exchange that fails with ``error`` before any I/O (e.g. a required transport is missing)."""
    raise error
    yield  # unreachable: makes this a generator, so the error surfaces when it is run


def exists(request: ExistsRequest, limits: WireLimits) -> Exchange[list[int]]:
    yield Send([encode(request)])
    response = yield from _response(
        request.request_id, Op.EXISTS, limits, answer_meta_size(Op.EXISTS, len(request.hashes))
    )
    return _statuses(response, len(request.hashes))


def delete(request: DeleteRequest, limits: WireLimits) -> Exchange[list[int]]:
    yield Send([encode(request)])
    response = yield from _response(
        request.request_id, Op.DELETE, limits, answer_meta_size(Op.DELETE, len(request.hashes))
    )
    return _statuses(response, len(request.hashes))


def ping(request: PingRequest, limits: WireLimits) -> Exchange[None]:
    yield Send([encode(request)])
    response = yield from _response(request.request_id, Op.PING, limits, 0)
    if not isinstance(response, PingResponse):
        raise ProtocolError(f"expected a PING response, got {response!r}")


def hello(request: HelloRequest, limits: WireLimits) -> Exchange[None]:
    """Prove the cluster's token on a new connection.

    Raises:
        AuthenticationError: the node rejected the token (it then closes the connection).
    """
    yield Send([encode(request)])
    response = yield from _response(request.request_id, Op.HELLO, limits, 0)
    if not isinstance(response, HelloResponse):
        raise ProtocolError(f"expected a HELLO response, got {response!r}")


def _response(request_id: int, op: Op, limits: WireLimits, expected_meta: int, head: bytes = b"") -> Exchange[Response]:
    """Read one response frame's header and meta; raise the node's error if it sent one.

    Header and meta usually come in one receive of up to ``HEADER_SIZE + expected_meta``
    bytes: the meta of a successful answer has exactly that size, so the read never
    reaches into the payload; an error answer has no payload at all. ``head``: the
    first bytes of the frame, when that receive was made already.
    """
    if not head:
        head = yield ReceiveUpTo(HEADER_SIZE + expected_meta)
    while len(head) < HEADER_SIZE:
        head += yield ReceiveUpTo(HEADER_SIZE + expected_meta - len(head))
    header = decode_header(head[:HEADER_SIZE], limits)
    end = HEADER_SIZE + header.meta_len
    if len(head) > end:
        raise ProtocolError(f"meta of {header.meta_len} bytes is shorter than the {expected_meta} expected")
    if len(head) < end:
        head += yield Receive(end - len(head))
    response = decode_message(header, head[HEADER_SIZE:], limits)
    answers = header.is_response and header.request_id == request_id and header.request_op == op
    # A node that could not parse our header addresses its error to (0, PING).
    unaddressed = header.request_id == 0 and header.request_op == Op.PING
    if isinstance(response, ErrorResponse) and (answers or unaddressed):
        raise error_for_code(response.code, response.message)
    if not answers:
        raise ProtocolError(f"response {header} does not answer {op.name} request {request_id}")
    return response  # type: ignore[return-value]


def _statuses(response: Response, count: int) -> list[int]:
    if not isinstance(response, StatusResponse) or len(response.statuses) != count:
        raise ProtocolError(f"expected {count} statuses, got {response!r}")
    return response.statuses


def _scratch_slices(scratch: memoryview, length: int) -> list[memoryview]:
    slices = []
    while length:
        chunk = min(length, len(scratch))
        slices.append(scratch[:chunk])
        length -= chunk
    return slices
