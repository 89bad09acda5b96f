"""What the daemon answers a request without payload: pinned blocks and reply frames.

A GET or LOCATE first pins what DRAM holds (:meth:`Answers.begin`); what only the SSD
tier holds is read in by the session, which may wait; then :meth:`Answers.reply` makes the
reply frames (a get's blocks go out as views of their arena slots, not copies), and
:meth:`Answers.end` unpins them once they are sent. Nothing here touches a socket, so the
session's two loops (the readiness callback and the coroutine) answer alike.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kvpool_client.core.errors import ErrorCode, KVPoolError, LimitExceeded
from kvpool_client.core.wire import (
    CommitRequest,
    DeleteRequest,
    ErrorResponse,
    ExistsRequest,
    GetRequest,
    GetResponse,
    LocateRequest,
    LocateResponse,
    Op,
    PeerRequest,
    PingRequest,
    PingResponse,
    PutRequest,
    ReserveRequest,
    StatusResponse,
    WireLimits,
    encode,
)
from kvpool_client.core.wire.connection import GetOne, Request
from kvpool_client.core.wire.one_key import encode_get_one
from kvpool_server.index import StoreKey
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tiers.dram import checksum
from kvpool_server.tiers.store import BlockStore, HeldBlock

log = logging.getLogger("kvpool.data")

OP_NAMES = {op: op.name.lower() for op in Op}  # latency histogram labels
_REQUEST_OPS: dict[type, Op] = {
    GetOne: Op.GET,
    GetRequest: Op.GET,
    LocateRequest: Op.LOCATE,
    ExistsRequest: Op.EXISTS,
    DeleteRequest: Op.DELETE,
    PingRequest: Op.PING,
    PutRequest: Op.PUT,
    PeerRequest: Op.PEER,
    ReserveRequest: Op.RESERVE,
    CommitRequest: Op.COMMIT,
}
Reply = list[bytes | memoryview]


def request_op(request: GetOne | Request | PutRequest) -> Op:
    return _REQUEST_OPS[type(request)]


@dataclass(slots=True)
class Answer:
    """A request being answered: the blocks it holds pinned, and the reply not sent yet."""

    request: (
        GetOne | Request | PutRequest
    )  # a put (or another request without blocks) once answered, its reply still to send
    keys: list[StoreKey]  # the blocks it reads (GET, LOCATE)
    held: list[HeldBlock | None]
    started: float  # perf_counter when its head was in
    unsent: Reply | None = None  # None: not made yet (blocks to read from SSD first)


class Answers:
    """Answers one connection's requests from a :class:`BlockStore`."""

    def __init__(
        self,
        store: BlockStore,
        counters: Counters,
        latencies: Latencies,
        limits: WireLimits,
        verify_checksum_on_get: bool,
        peer: str,
    ) -> None:
        self._store = store
        self._counters = counters
        self._latencies = latencies
        self._limits = limits
        self._verify = verify_checksum_on_get
        self._peer = peer
        self.one_sided = False  # the client reads what it locates through NIXL, not a mapping

    def begin(self, request: Request, started: float) -> Answer:
        """Pin the request's blocks that DRAM holds (a GET or LOCATE)."""
        if not isinstance(request, (GetRequest, LocateRequest)):
            return Answer(request, [], [], started)
        keys = [(request.namespace, h) for h in request.hashes]
        return Answer(request, keys, self._store.acquire_dram(keys), started)

    def end(self, answer: Answer) -> None:
        """The reply is sent: unpin its blocks and time the request."""
        self._store.release(answer.held)
        self._latencies.observe(OP_NAMES[request_op(answer.request)], time.perf_counter() - answer.started)

    def reply(self, answer: Answer) -> Reply:
        request = answer.request
        match request:
            case GetOne():
                return self.get_one_reply(request.request_id, answer.held[0])
            case GetRequest():
                return self._get_reply(request, answer.held)
            case LocateRequest():
                return self._locate_reply(request, answer.keys, answer.held)
            case ExistsRequest():
                return [encode(StatusResponse(request.request_id, Op.EXISTS, self._exists(request)))]
            case DeleteRequest():
                ns = request.namespace
                statuses = [
                    int(ErrorCode.OK if self._store.delete((ns, h)) else ErrorCode.NOT_FOUND) for h in request.hashes
                ]
                return [encode(StatusResponse(request.request_id, Op.DELETE, statuses))]
            case PingRequest():
                return [encode(PingResponse(request.request_id))]
            case PutRequest() | PeerRequest() | ReserveRequest() | CommitRequest():
                raise AssertionError("answered when stepped (Session._one_sided, Puts.reply)")

    def _get_reply(self, request: GetRequest, held: list[HeldBlock | None]) -> Reply:
        if len(held) == 1:
            return self.get_one_reply(request.request_id, held[0])
        statuses, lengths, sums, views = [], [], [], []
        for block in held:
            status = self._check(block)
            statuses.append(int(status))
            if block is None or status is not ErrorCode.OK:
                lengths.append(0)
                sums.append(0)
                continue
            lengths.append(len(block.view))
            sums.append(block.checksum)
            views.append(block.view)
        if sum(lengths) > self._limits.max_payload:
            too_big = LimitExceeded(f"the blocks add up to {sum(lengths)} bytes, over {self._limits.max_payload}")
            return [self.error_frame(request.request_id, Op.GET, too_big)]
        self._counters.add("bytes_out", sum(lengths))
        return [encode(GetResponse(request.request_id, statuses, lengths, sums)), *views]

    def get_one_reply(self, request_id: int, block: HeldBlock | None) -> Reply:
        """:meth:`_get_reply` of one key, in one pack."""
        status = self._check(block)
        if block is None or status is not ErrorCode.OK:
            return [encode_get_one(request_id, int(status), 0, 0)]
        length = len(block.view)
        if length > self._limits.max_payload:
            too_big = LimitExceeded(f"the blocks add up to {length} bytes, over {self._limits.max_payload}")
            return [self.error_frame(request_id, Op.GET, too_big)]
        self._counters.add("bytes_out", length)
        return [encode_get_one(request_id, int(status), length, block.checksum), block.view]

    def _locate_reply(self, request: LocateRequest, keys: list[StoreKey], held: list[HeldBlock | None]) -> Reply:
        """Where each block lies in the shared arena; the same-node client copies it itself.

        Each block is held only while its location and slot generation are read:
        the reader detects a reuse of the slot by the generation, not by a pin.
        """
        arena_id = self._store.arena_id
        if arena_id is None:
            return [
                self.error_frame(
                    request.request_id, Op.LOCATE, KVPoolError("no shared arena", ErrorCode.INVALID_ARGUMENT)
                )
            ]
        rows = [self._location(key, block) for key, block in zip(keys, held, strict=True)]
        columns = [list(column) for column in zip(*rows, strict=True)] or [[] for _ in range(5)]
        response = LocateResponse(request.request_id, arena_id, *columns)
        self._counters.add("bytes_out_nixl" if self.one_sided else "bytes_out_shm", sum(response.lengths))
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
        return int(status), entry.offset, entry.length, entry.checksum, self._store.generation(entry)

    def _check(self, block: HeldBlock | None) -> ErrorCode:
        if block is None:
            return ErrorCode.NOT_FOUND
        entry = block.entry  # bytes read from SSD were verified on the way
        if entry is not None and self._verify and checksum(block.view) != entry.checksum:
            log.error("checksum mismatch, block dropped", extra={"key": entry.key[1].hex(), "ns": entry.key[0]})
            self._store.discard_corrupt(entry)
            return ErrorCode.CHECKSUM_MISMATCH
        return ErrorCode.OK

    def _exists(self, request: ExistsRequest) -> list[int]:
        ns, statuses, missed = request.namespace, [], False
        for h in request.hashes:
            # A prefix lookup stops looking at the first miss: what follows is useless.
            missed = (missed and request.prefix) or not self._store.contains((ns, h))
            statuses.append(int(ErrorCode.NOT_FOUND if missed else ErrorCode.OK))
        return statuses

    def error_frame(self, request_id: int, op: Op, exc: KVPoolError) -> bytes:
        """The error reply to a request, counted and logged."""
        self._counters.add(f"errors_{exc.code.name.lower()}")
        log.warning("bad request", extra={"peer": self._peer, "error": str(exc)})
        code = exc.code if not isinstance(exc, LimitExceeded) else ErrorCode.LIMIT_EXCEEDED
        return encode(ErrorResponse(request_id, op, int(code), str(exc)))
