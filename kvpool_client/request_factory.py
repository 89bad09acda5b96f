"""The exchange of each op for a job, and the transport it goes over.

A get goes out of the node's shared arena mapped here when the node runs on this machine
(``shm``: copied with no connection where every block's place is known, else located with
``LOCATE`` and copied), else out of its arena read one-sided (``nixl``: located, then read),
and over the wire otherwise; a get of one key into one buffer over the wire is a
:class:`~kvpool_client.exchange.SingleGet`, the specialisation a blocking socket runs in line.
A put of :data:`ONE_SIDED_PUT_BYTES` or more writes its blocks one-sided into slots the node
reserves (``nixl``); a smaller one, or any without nixl, sends them over the wire. Every other
op goes over the wire. Request ids are unique per client.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import count

from kvpool_client import exchange
from kvpool_client.batching import Job
from kvpool_client.buffers import Target
from kvpool_client.core.channels.nixl_agent import NixlUnavailable
from kvpool_client.core.errors import KVPoolError
from kvpool_client.core.routing import Member
from kvpool_client.core.wire import (
    DeleteRequest,
    ExistsRequest,
    GetRequest,
    LocateRequest,
    PutRequest,
    ReserveRequest,
    WireLimits,
)
from kvpool_client.transport.nixl import RemoteArena
from kvpool_client.transport.shm import MappedArena

_MAX_DEPTH = (1 << 32) - 1  # depths travel as u32
# The least a put writes one-sided: below it, RESERVE and COMMIT (two round trips, and the node's
# work per block) cost the node more than receiving the bytes would (bench/one_sided.py).
ONE_SIDED_PUT_BYTES = 512 << 10

ArenaOf = Callable[[Member], MappedArena | None]
"""The node's shared arena mapped here (the shm transport), or None to read over tcp."""
PeerOf = Callable[[Member], RemoteArena | None]
"""The node's arena read and written one-sided (the nixl transport), or None."""


def _no_arena(member: Member) -> None:
    return None  # every get over the wire


class RequestFactory:
    """Builds each op's exchange for a job, with request ids unique per client.

    Args:
        verify_checksums: check each block read against the node's checksum.
        arena_of: the member's shared arena, when gets may copy from it; may raise
            :class:`~kvpool_client.transport.shm.SharedArenaUnavailable` (shm required).
        streams: how many frames a large job to one node may go out as at once (:func:`streams`).
        peer_of: the member's arena reached one-sided, when gets and puts may move their bytes
            themselves; may raise :class:`~kvpool_client.core.channels.nixl_agent.NixlUnavailable`
            (nixl required).
    """

    def __init__(
        self,
        verify_checksums: bool,
        arena_of: ArenaOf | None = None,
        streams: int = 1,
        peer_of: PeerOf | None = None,
        *,
        blocking: bool = True,
    ) -> None:
        self._blocking = blocking  # the caller may wait on a one-sided transfer in line (not an event loop)
        self._ids = count(1)
        self._verify = verify_checksums
        self._arena_of: ArenaOf = arena_of or _no_arena
        self._peer_of: PeerOf = peer_of or _no_arena
        self.streams = streams

    def put_streams(self, member: Member) -> int:
        """How many frames a large put to ``member`` may go out as at once (:attr:`streams`); one
        where it writes one-sided: one WRITE moves the whole batch, and its slots are reserved
        together (a batch split across connections would take the node's admission budget twice)."""
        try:
            return self.streams if self._peer_of(member) is None else 1
        except KVPoolError:
            return self.streams  # the put itself says what is missing

    def put(self, job: Job, views: Sequence[Target], limits: WireLimits) -> exchange.Exchange[list[int]]:
        blocks = [views[i] for i in job.indices]
        depths = None if None in job.depths else [min(d, _MAX_DEPTH) for d in job.depths if d is not None]
        lengths = [len(b) for b in blocks]
        try:
            peer = self._peer_of(job.member)
        except NixlUnavailable as exc:
            return exchange.fail(exc)
        if peer is not None and sum(lengths) >= ONE_SIDED_PUT_BYTES:
            reserve = ReserveRequest(next(self._ids), job.namespace, job.hashes, lengths, depths)
            return self._through(peer, exchange.put_one_sided(reserve, blocks, limits, peer), limits)
        return exchange.put(PutRequest(next(self._ids), job.namespace, job.hashes, lengths, depths), blocks, limits)

    def get(
        self, job: Job, targets: Sequence[Target | None], limits: WireLimits
    ) -> exchange.Request[exchange.GetAnswer]:
        """The exchange that gets ``job``'s keys into their ``targets`` (``None``: allocate one), out
        of the node's arena mapped here (:func:`exchange.get_shared`) or over the wire."""
        mine = list(map(targets.__getitem__, job.indices))  # no comprehension frame: most gets are one key
        try:
            arena = self._arena_of(job.member) or self._peer_of(job.member)
        except KVPoolError as exc:  # a required transport is unavailable
            return exchange.fail(exc)
        if arena is not None:
            located = LocateRequest(next(self._ids), job.namespace, job.hashes)
            return self._through(arena, exchange.get_shared(located, mine, limits, self._verify, arena), limits)
        return self._wire_get(job, mine, limits)

    def fetch(
        self, job: Job, targets: list[Target | None], limits: WireLimits
    ) -> exchange.GetAnswer | exchange.Request[exchange.GetAnswer]:
        """:meth:`get` of a job that is its whole batch (``targets``: one per key, in order), or its
        answer when the node's arena served it from known places without asking the node
        (:func:`exchange.copy_known`): what a get one node alone answers runs, the arena looked up
        once, before any connection is taken. An event loop's client reads a remote arena's known
        places in the exchange instead, whose transfers run off the loop."""
        try:
            arena = self._arena_of(job.member) or self._peer_of(job.member)
        except KVPoolError as exc:  # a required transport is unavailable
            return exchange.fail(exc)
        if arena is None:
            return self._wire_get(job, targets, limits)
        located = LocateRequest(next(self._ids), job.namespace, job.hashes)
        if isinstance(arena, RemoteArena) and not self._blocking:
            return self._through(arena, exchange.get_shared(located, targets, limits, self._verify, arena), limits)
        copied = exchange.copy_known(job.namespace, job.hashes, targets, arena, self._verify)
        if copied is not None:
            return copied
        return self._through(arena, exchange.locate_shared(located, targets, limits, self._verify, arena), limits)

    def _through(
        self, arena: MappedArena | RemoteArena, then: exchange.Exchange[exchange.T], limits: WireLimits
    ) -> exchange.Exchange[exchange.T]:
        """``then``, after a PEER exchange when ``arena`` is one-sided and does not know the node's agent yet."""
        if isinstance(arena, RemoteArena) and not arena.ready:
            return exchange.with_peer(next(self._ids), limits, arena, then)
        return then

    def _wire_get(
        self, job: Job, targets: list[Target | None], limits: WireLimits
    ) -> exchange.Request[exchange.GetAnswer]:
        """The get over the wire; one key into one buffer (a layer's load) is a :class:`exchange.SingleGet`."""
        if len(targets) == 1 and (target := targets[0]) is not None:
            return exchange.SingleGet(next(self._ids), job.namespace, job.hashes[0], target, limits, self._verify)
        return exchange.get(GetRequest(next(self._ids), job.namespace, job.hashes), targets, limits, self._verify)

    def gets_into(
        self, targets: Sequence[Target | None]
    ) -> Callable[[Job, WireLimits], exchange.Request[exchange.GetAnswer]]:
        """:meth:`get` of any job of a batch into its ``targets``: how a plan builds its requests."""
        return lambda job, limits: self.get(job, targets, limits)

    def exists(self, job: Job, limits: WireLimits, prefix: bool) -> exchange.Exchange[list[int]]:
        return exchange.exists(ExistsRequest(next(self._ids), job.namespace, job.hashes, prefix), limits)

    def delete(self, job: Job, limits: WireLimits) -> exchange.Exchange[list[int]]:
        return exchange.delete(DeleteRequest(next(self._ids), job.namespace, job.hashes), limits)
