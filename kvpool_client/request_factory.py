"""The exchange of each op for a job, and the transport it goes over.

A get goes out of the node's shared arena mapped here when the node runs on this machine
(``shm``: copied with no connection where every block's place is known, else located with
``LOCATE`` and copied), and over the wire otherwise; a get of one key into one buffer over the
wire is a :class:`~kvpool_client.exchange.SingleGet`. Every other op goes over the wire. Request
ids are unique per client.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import count

from kvpool_client import exchange
from kvpool_client.batching import Job
from kvpool_client.buffers import Target
from kvpool_client.core.routing import Member
from kvpool_client.core.wire import DeleteRequest, ExistsRequest, GetRequest, LocateRequest, PutRequest, WireLimits
from kvpool_client.transport.shm import MappedArena, SharedArenaUnavailable

_MAX_DEPTH = (1 << 32) - 1  # depths travel as u32

ArenaOf = Callable[[Member], MappedArena | None]
"""The node's shared arena mapped here (the shm transport), or None to read over tcp."""


class RequestFactory:
    """Builds each op's exchange for a job, with request ids unique per client.

    Args:
        verify_checksums: check each block read against the node's checksum.
        arena_of: the member's shared arena, when gets may copy from it; may raise
            :class:`~kvpool_client.transport.shm.SharedArenaUnavailable` (shm required).
        streams: how many frames a large job to one node may go out as at once (:func:`streams`).
    """

    def __init__(self, verify_checksums: bool, arena_of: ArenaOf | None = None, streams: int = 1) -> None:
        self._ids = count(1)
        self._verify = verify_checksums
        self._arena_of = arena_of
        self.streams = streams

    def put(self, job: Job, views: Sequence[Target], limits: WireLimits) -> exchange.Exchange[list[int]]:
        blocks = [views[i] for i in job.indices]
        depths = None if None in job.depths else [min(d, _MAX_DEPTH) for d in job.depths if d is not None]
        request = PutRequest(next(self._ids), job.namespace, job.hashes, [len(b) for b in blocks], depths)
        return exchange.put(request, blocks, limits)

    def get(
        self, job: Job, targets: Sequence[Target | None], limits: WireLimits
    ) -> exchange.Exchange[exchange.GetAnswer]:
        mine = list(map(targets.__getitem__, job.indices))  # no comprehension frame: most gets are one key
        shared = self._shared_get(job.member, job.namespace, job.hashes, mine, limits)
        if shared is not None:
            return shared
        return exchange.get(GetRequest(next(self._ids), job.namespace, job.hashes), mine, limits, self._verify)

    def gets_into(
        self, targets: Sequence[Target | None]
    ) -> Callable[[Job, WireLimits], exchange.Exchange[exchange.GetAnswer]]:
        """:meth:`get` of any job of a batch into its ``targets``: how a plan builds its requests."""
        return lambda job, limits: self.get(job, targets, limits)

    def get_one(
        self, member: Member, namespace: str, block: bytes, target: Target, limits: WireLimits
    ) -> exchange.SingleGet | exchange.Exchange[exchange.GetAnswer] | None:
        """:meth:`get` of one key into one buffer, its node's arena looked up once: None when the block
        was copied out of the arena with no connection (:meth:`copy_shared`); over the wire, a
        :class:`~exchange.SingleGet`."""
        try:
            arena = self._arena(member)
        except SharedArenaUnavailable as exc:
            return exchange.fail(exc)
        if arena is None:
            return exchange.SingleGet(next(self._ids), namespace, block, target, limits, self._verify)
        if arena.vouched_for() and exchange.copy_known_one(namespace, block, target, arena, self._verify):
            return None
        return self._located_get(arena, namespace, [block], [target], limits)

    def _shared_get(
        self, member: Member, namespace: str, hashes: list[bytes], targets: list[Target | None], limits: WireLimits
    ) -> exchange.Exchange[exchange.GetAnswer] | None:
        """The get out of the member's arena mapped here (or the failure to map a required one); None: over the wire."""
        try:
            arena = self._arena(member)
        except SharedArenaUnavailable as exc:
            return exchange.fail(exc)
        return None if arena is None else self._located_get(arena, namespace, hashes, targets, limits)

    def _located_get(
        self,
        arena: MappedArena,
        namespace: str,
        hashes: list[bytes],
        targets: list[Target | None],
        limits: WireLimits,
    ) -> exchange.Exchange[exchange.GetAnswer]:
        """The get that asks the node where the blocks lie (LOCATE), then copies them out of ``arena``."""
        located = LocateRequest(next(self._ids), namespace, hashes)
        return exchange.get_shared(located, targets, limits, self._verify, arena)

    def _arena(self, member: Member) -> MappedArena | None:
        """The member's arena mapped here; None: read over the wire. Raises SharedArenaUnavailable (shm required)."""
        return self._arena_of(member) if self._arena_of is not None else None

    def copy_shared(self, job: Job, targets: Sequence[Target | None]) -> exchange.GetAnswer | None:
        """A same-node get served from the node's arena with no connection at all, when every
        block's location is known here (:func:`exchange.copy_known`) and the node's heartbeat
        vouches for it; None: run :meth:`get`."""
        arena = self._vouched_arena(job.member)
        if arena is None:
            return None
        mine = list(map(targets.__getitem__, job.indices))
        return exchange.copy_known(job.namespace, job.hashes, mine, arena, self._verify)

    def _vouched_arena(self, member: Member) -> MappedArena | None:
        """The member's arena, mapped here and vouched for by its heartbeat; None: ask the node."""
        try:
            arena = self._arena(member)
        except SharedArenaUnavailable:
            return None  # get() reports it
        return arena if arena is not None and arena.vouched_for() else None

    def exists(self, job: Job, limits: WireLimits, prefix: bool) -> exchange.Exchange[list[int]]:
        return exchange.exists(ExistsRequest(next(self._ids), job.namespace, job.hashes, prefix), limits)

    def delete(self, job: Job, limits: WireLimits) -> exchange.Exchange[list[int]]:
        return exchange.delete(DeleteRequest(next(self._ids), job.namespace, job.hashes), limits)
