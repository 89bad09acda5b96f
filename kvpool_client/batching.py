"""Split a caller's batch into per-node requests and put the answers back in order.

Pure planning shared by the blocking and asyncio clients: no I/O here. Keys assigned
to nodes (by :mod:`~kvpool_client.replication` for writes, :mod:`~kvpool_client.failover`
for reads) are grouped by node, namespace and hash size (one frame carries one of
each), then chunked to the node's limits on keys and payload bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any, Protocol

from kvpool_client import exchange
from kvpool_client.buffers import Target, target_of
from kvpool_client.core.errors import ErrorCode, KVPoolError, UsageError
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import Member, Router
from kvpool_client.core.wire import DeleteRequest, ExistsRequest, GetRequest, LocateRequest, PutRequest, WireLimits
from kvpool_client.results import failure_code
from kvpool_client.transport.shm import MappedArena, SharedArenaUnavailable

_MAX_DEPTH = (1 << 32) - 1  # depths travel as u32
_DEFAULT_BLOCK_LIMIT = WireLimits().max_block_size  # a node's limit until its own is known
# The least payload worth a connection of its own (:func:`streams`): a second connection costs a
# thread hand-off, which must stay small beside the transfer it overlaps with the first.
STREAM_BYTES = 4 << 20


@dataclass(slots=True)
class Job:
    """One frame's worth of keys for one node; ``indices`` are positions in the batch."""

    member: Member
    namespace: str
    indices: list[int]
    hashes: list[bytes]
    depths: list[int | None]  # each key's chain depth, if its builder knew it


def check_keys(keys: Sequence[BlockKey]) -> None:
    """Raises UsageError for the first element of ``keys`` that is not a :class:`BlockKey`."""
    for index, key in enumerate(keys):
        if not isinstance(key, BlockKey):
            raise UsageError(f"key {index} is a {type(key).__name__}, expected BlockKey")


def group(keys: Sequence[BlockKey], assignments: Iterable[tuple[int, Member]]) -> list[Job]:
    """Jobs for ``(batch index, member)`` pairs: one per member, namespace and hash size.

    Jobs come in first-seen order and keep the order of the assignments inside each.
    """
    jobs: dict[tuple[str, str, int], Job] = {}
    for index, member in assignments:
        key = keys[index]
        slot = (member.node_id, key.namespace, len(key.hash))
        job = jobs.get(slot)
        if job is None:
            job = jobs[slot] = Job(member, key.namespace, [], [], [])
        job.indices.append(index)
        job.hashes.append(key.hash)
        job.depths.append(key.depth)
    return list(jobs.values())


def one_frame_job(member: Member, keys: Sequence[BlockKey]) -> Job | None:
    """The job of ``keys`` all sent to ``member``, as :func:`group` makes it; None when they
    need several frames (namespaces or hash sizes differ)."""
    first = keys[0]
    namespace, size = first.namespace, len(first.hash)
    if len(keys) > 1 and any(k.namespace != namespace or len(k.hash) != size for k in keys):
        return None
    return Job(member, namespace, list(range(len(keys))), [k.hash for k in keys], [k.depth for k in keys])


def plan(keys: Sequence[BlockKey], router: Router) -> list[Job]:
    """Group ``keys`` by their first reader, namespace and hash size, keeping the caller's order.

    Raises:
        UsageError: an element of ``keys`` is not a BlockKey.
    """
    check_keys(keys)
    return group(keys, ((i, router.placement(k).read_order[0]) for i, k in enumerate(keys)))


def chunk(job: Job, limits: WireLimits, sizes: Sequence[int] | None = None) -> list[Job]:
    """Split ``job`` so each piece fits ``limits`` (keys per frame, payload bytes per frame).

    Args:
        sizes: payload bytes of each key of the batch (by batch index): what a put
            sends, or what a get may receive.
    """
    pieces: list[Job] = []
    start, payload = 0, 0
    for end, index in enumerate(job.indices):
        size = sizes[index] if sizes is not None else 0
        if end > start and (end - start >= limits.max_keys or payload + size > limits.max_payload):
            pieces.append(_slice(job, start, end))
            start, payload = end, 0
        payload += size
    pieces.append(_slice(job, start, len(job.indices)) if start else job)  # a job that fits is its own piece
    return pieces


def streams(job: Job, sizes: Sequence[int] | None, most: int) -> list[Job]:
    """``job`` as up to ``most`` runs of its keys of about equal payload, each of at least
    :data:`STREAM_BYTES`, that the client sends to the node at once, each on its own
    connection; ``[job]`` when it is smaller, or carries no payload (``sizes`` None).

    On one connection the node's work on a large batch (finding each key, its reply) and
    the client's (its views, its result) wait for each other's bytes; on two they overlap.
    """
    if sizes is None or most < 2:
        return [job]
    payloads = [sizes[i] for i in job.indices]
    for parts in range(min(most, sum(payloads) // STREAM_BYTES, len(payloads)), 1, -1):
        runs = _even_runs(payloads, parts)
        if runs is not None:
            return [_slice(job, start, end) for start, end in runs]
    return [job]


def _even_runs(payloads: Sequence[int], parts: int) -> list[tuple[int, int]] | None:
    """``(start, end)`` of ``parts`` consecutive runs of ``payloads``, each ending where the sum so
    far first reaches its share of the total; None when a run would hold under :data:`STREAM_BYTES`
    (or a block over several shares leaves fewer runs)."""
    total = sum(payloads)
    runs: list[tuple[int, int]] = []
    start, sent, run_start_sent = 0, 0, 0
    for end, size in enumerate(payloads, 1):
        sent += size
        if sent * parts >= total * (len(runs) + 1) or end == len(payloads):
            if sent - run_start_sent < STREAM_BYTES:
                return None
            runs.append((start, end))
            start, run_start_sent = end, sent
    return runs if len(runs) == parts else None


def read_streams(targets: Sequence[Target | None], most: int) -> int:
    """The ``most`` a get into ``targets`` may split by: 1 when a target is None, whose size in
    :func:`expected_sizes` is only a bound (it would split batches of small blocks)."""
    return 1 if None in targets else most


def _slice(job: Job, start: int, end: int) -> Job:
    return Job(job.member, job.namespace, job.indices[start:end], job.hashes[start:end], job.depths[start:end])


def source_views(keys: Sequence[BlockKey], blocks: Sequence[Any], limits_for: Callable[[int], int]) -> list[Target]:
    """Byte views (or regions) of the blocks to put, checked against the block-size limit.

    Args:
        limits_for: the largest block size accepted for batch index ``i``.

    Raises:
        UsageError: counts differ, a block is empty, too large or not a contiguous buffer.
    """
    views = block_views(keys, blocks)
    check_block_sizes(views, limits_for)
    return views


def block_views(keys: Sequence[BlockKey], blocks: Sequence[Any]) -> list[Target]:
    """Byte views (or regions) of the blocks to put (no size check yet: that needs the nodes' limits).

    Raises:
        UsageError: counts differ, or a block is not a contiguous buffer.
    """
    if len(keys) != len(blocks):
        raise UsageError(f"{len(keys)} keys but {len(blocks)} blocks")
    return [target_of(b, writable=False) for b in blocks]


def check_block_sizes(views: Sequence[Target], limits_for: Callable[[int], int]) -> None:
    """Raises UsageError (BLOCK_TOO_LARGE) for the first empty block or one over ``limits_for(i)``."""
    for i, view in enumerate(views):
        if not 0 < len(view) <= limits_for(i):
            raise UsageError(
                f"block {i} is {len(view)} bytes; the node allows 1..{limits_for(i)} (its slab_size, "
                "kvpool-server --slab-size)",
                ErrorCode.BLOCK_TOO_LARGE,
            )


def block_limit(owners: Iterable[Member], known: Mapping[str, WireLimits]) -> int:
    """The largest block every owner with known limits accepts (the default limit if none is known)."""
    sizes = [known[m.node_id].max_block_size for m in owners if m.node_id in known]
    return min(sizes) if sizes else _DEFAULT_BLOCK_LIMIT


def target_views(keys: Sequence[BlockKey], into: Sequence[Any] | None) -> list[Target | None]:
    """Writable byte views (or regions) of the get destinations (``None``: allocate per block)."""
    if into is None:
        return [None] * len(keys)
    if len(keys) != len(into):
        raise UsageError(f"{len(keys)} keys but {len(into)} destination buffers")
    return [target_of(b, writable=True) for b in into]


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


def expected_sizes(targets: Sequence[Target | None]) -> list[int]:
    """Bytes a get may receive per key: the target's size, or the largest block if none."""
    return [len(t) if t is not None else _DEFAULT_BLOCK_LIMIT for t in targets]


def scatter(into: list[Any], job: Job, values: Sequence[Any]) -> None:
    """Write a job's per-key answers back to their batch positions."""
    for index, value in zip(job.indices, values, strict=True):
        into[index] = value


def leading_ok(statuses: Sequence[int]) -> int:
    """Count of leading OK statuses: the usable prefix of a lookup."""
    for i, status in enumerate(statuses):
        if status != ErrorCode.OK:
            return i
    return len(statuses)


def statuses_of(job: Job, outcome: list[int] | KVPoolError) -> list[int]:
    """A job's per-key statuses: the node's answer, or its failure's code for every key."""
    if isinstance(outcome, KVPoolError):
        return [failure_code(outcome)] * len(job.indices)
    return outcome


def get_answer(job: Job, outcome: exchange.GetAnswer | KVPoolError) -> exchange.GetAnswer:
    """A get job's per-key statuses and filled buffers (none when the node failed)."""
    if isinstance(outcome, KVPoolError):
        return [failure_code(outcome)] * len(job.indices), [None] * len(job.indices)
    return outcome


class RoundPlan(Protocol):
    """A multi-round plan (:class:`~kvpool_client.replication.WritePlan`, :class:`~kvpool_client.failover.ReadPlan`)."""

    def next_round(self, usable: Callable[[str], bool]) -> list[Job]: ...

    def record(self, job: Job, codes: Sequence[int]) -> None: ...
