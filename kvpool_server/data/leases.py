"""Puts whose bytes the client writes itself: slots held under a lease, published on COMMIT.

A RESERVE takes a slot per block as a put does (put-if-absent, the namespace's quota, the
admission budget: :meth:`Puts.admit`), but no payload follows: the client writes each slot
one-sided (NIXL), then COMMITs with each block's checksum. Until then the slots are
reserved: pinned, and readable by nobody. A lease ends in one of four ways:

- COMMIT with a checksum per block publishes them (the tail of the chain first, as a put does);
- COMMIT with no checksums gives the slots back (the client's writes failed);
- its deadline passes (:meth:`SessionConfig.payload_deadline` of its bytes): the slots go back,
  nothing is published, a late COMMIT is answered ``TIMEOUT`` per block;
- the connection ends (the client left or was killed): the same.

The checksums are the writer's: the node does not read the bytes to check them (that is the
point of writing one-sided); a reader that verifies checksums catches a writer that lied, and
only about the blocks it wrote. A slot given back may be reused while a writer that outlived its
lease is still writing into it: a client writes right after its RESERVE, and a lease is long
against a write (seconds against microseconds), but nothing here can stop a writer stalled for
the whole deadline.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from kvpool_client.core.errors import ErrorCode, KVPoolError
from kvpool_client.core.wire import CommitRequest, Op, ReserveRequest, ReserveResponse, StatusResponse, encode
from kvpool_server.data.answers import Reply
from kvpool_server.data.puts import Outcome, Puts, depths
from kvpool_server.index import BlockEntry
from kvpool_server.stats import Counters
from kvpool_server.tiers.store import BlockStore

_TIMEOUT = int(ErrorCode.TIMEOUT)


@dataclass(slots=True)
class Lease:
    """A RESERVE's slots (or why a block has none), in the request's order."""

    outcomes: list[Outcome]
    nbytes: int
    expiry: asyncio.TimerHandle | None = None


class Leases:
    """One connection's leases.

    Args:
        deadline: seconds a lease of so many bytes is held.
        refusal: why a namespace's blocks are refused now (the node drains, the tenant may not
            write there); None: they are taken.
    """

    def __init__(
        self,
        store: BlockStore,
        puts: Puts,
        counters: Counters,
        deadline: Callable[[int], float],
        refusal: Callable[[str], ErrorCode | None],
    ) -> None:
        self._store = store
        self._puts = puts
        self._counters = counters
        self._deadline = deadline
        self._refusal = refusal
        self._ids = itertools.count(1)
        self._held: dict[int, Lease] = {}

    def reserve(self, request: ReserveRequest) -> Reply:
        """Take the blocks' slots under a new lease; answer where each lies."""
        arena_id = self._store.arena_id
        assert arena_id is not None  # a node without an arena has no one-sided peer
        refusal = self._refusal(request.namespace)
        outcomes: list[Outcome] = []
        for h, length, depth in zip(request.hashes, request.lengths, depths(request), strict=True):
            key = (request.namespace, h)
            outcomes.append(self._puts.admit(key, length, depth) if refusal is None else refusal)
        lease_id = next(self._ids)
        lease = self._held[lease_id] = Lease(outcomes, sum(request.lengths))
        lease.expiry = asyncio.get_running_loop().call_later(self._deadline(lease.nbytes), self._expire, lease_id)
        statuses = [int(ErrorCode.OK if isinstance(o, BlockEntry) else o) for o in outcomes]
        offsets = [o.offset if isinstance(o, BlockEntry) else 0 for o in outcomes]
        return [encode(ReserveResponse(request.request_id, arena_id, lease_id, statuses, offsets))]

    def commit(self, request: CommitRequest) -> Reply:
        """Publish a lease's blocks with their checksums, or (no checksums) give its slots back."""
        lease = self._held.pop(request.lease, None)
        if lease is None:  # expired (or never granted): nothing of it is stored
            return [encode(StatusResponse(request.request_id, Op.COMMIT, [_TIMEOUT] * len(request.checksums)))]
        if lease.expiry is not None:
            lease.expiry.cancel()
        if not request.checksums:
            self._abort(lease)
            return [encode(StatusResponse(request.request_id, Op.COMMIT, []))]
        if len(request.checksums) != len(lease.outcomes):
            self._abort(lease)
            raise KVPoolError(
                f"{len(request.checksums)} checksums for a lease of {len(lease.outcomes)} blocks",
                ErrorCode.INVALID_ARGUMENT,
            )
        for outcome, checksum in zip(reversed(lease.outcomes), reversed(request.checksums), strict=True):
            if isinstance(outcome, BlockEntry):
                self._store.commit(outcome, checksum)
                self._puts.admitted(outcome)
        self._counters.add("bytes_in_nixl", lease.nbytes)
        statuses = [int(ErrorCode.OK if isinstance(o, BlockEntry) else o) for o in lease.outcomes]
        return [encode(StatusResponse(request.request_id, Op.COMMIT, statuses))]

    def close(self) -> None:
        """The connection ended: every lease left gives its slots back."""
        for lease_id in list(self._held):
            self._drop(lease_id)

    def _expire(self, lease_id: int) -> None:
        if lease_id in self._held:
            self._counters.add("leases_expired")
            self._drop(lease_id)

    def _drop(self, lease_id: int) -> None:
        lease = self._held.pop(lease_id)
        if lease.expiry is not None:
            lease.expiry.cancel()
        self._abort(lease)

    def _abort(self, lease: Lease) -> None:
        for outcome in lease.outcomes:
            if isinstance(outcome, BlockEntry):
                self._store.abort(outcome)
                self._puts.admitted(outcome)
