"""Split a caller's batch into per-node requests and put the answers back in order.

Pure planning shared by the blocking and asyncio clients: no I/O here. Keys assigned
to nodes (by :mod:`~kvpool_client.replication` for writes, :mod:`~kvpool_client.failover`
for reads) are grouped by node, namespace and hash size (one frame carries one of
each), then chunked to the node's limits on keys and payload bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvpool_client import exchange
from kvpool_client.buffers import Target, target_of
from kvpool_client.core.errors import ErrorCode, KVPoolError, UsageError
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import Member, Router
from kvpool_client.core.wire import WireLimits
from kvpool_client.results import failure_code

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
    return [target_of(block, False) for block in blocks]


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
    return [target_of(target, True) for target in into]


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
