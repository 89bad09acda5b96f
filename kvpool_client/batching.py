"""Split a caller's batch into per-node requests and put the answers back in order.

Pure planning shared by the blocking and asyncio clients: no I/O here. A batch is
grouped by owning node, namespace and hash size (one frame carries one of each),
then chunked to the node's limits on keys and payload bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any

from kvpool_client import exchange
from kvpool_client.buffers import byte_view
from kvpool_client.errors import ErrorCode, UsageError
from kvpool_client.keys import BlockKey
from kvpool_client.routing import Member, Router
from kvpool_client.wire import DeleteRequest, ExistsRequest, GetRequest, PutRequest, WireLimits


@dataclass(slots=True)
class Job:
    """One frame's worth of keys for one node; ``indices`` are positions in the batch."""

    member: Member
    namespace: str
    indices: list[int]
    hashes: list[bytes]


def plan(keys: Sequence[BlockKey], router: Router) -> list[Job]:
    """Group ``keys`` by owner, namespace and hash size, keeping the caller's order."""
    jobs: dict[tuple[str, str, int], Job] = {}
    for index, key in enumerate(keys):
        if not isinstance(key, BlockKey):
            raise UsageError(f"key {index} is a {type(key).__name__}, expected BlockKey")
        owner = router.owners(key)[0]
        slot = (owner.address, key.namespace, len(key.hash))
        job = jobs.get(slot)
        if job is None:
            job = jobs[slot] = Job(owner, key.namespace, [], [])
        job.indices.append(index)
        job.hashes.append(key.hash)
    return list(jobs.values())


def chunk(job: Job, limits: WireLimits, sizes: Sequence[int] | None = None) -> list[Job]:
    """Split ``job`` so each piece fits ``limits`` (keys per frame, payload bytes per frame).

    Args:
        sizes: payload bytes of each key of the batch (by batch index), for puts.
    """
    pieces: list[Job] = []
    start, payload = 0, 0
    for end, index in enumerate(job.indices):
        size = sizes[index] if sizes is not None else 0
        if end > start and (end - start >= limits.max_keys or payload + size > limits.max_payload):
            pieces.append(_slice(job, start, end))
            start, payload = end, 0
        payload += size
    pieces.append(_slice(job, start, len(job.indices)))
    return pieces


def _slice(job: Job, start: int, end: int) -> Job:
    return Job(job.member, job.namespace, job.indices[start:end], job.hashes[start:end])


def source_views(keys: Sequence[BlockKey], blocks: Sequence[Any], limits_for: Callable[[int], int]) -> list[memoryview]:
    """Byte views of the blocks to put, checked against the block-size limit.

    Args:
        limits_for: the largest block size accepted for batch index ``i``.

    Raises:
        UsageError: counts differ, a block is empty, too large or not a contiguous buffer.
    """
    if len(keys) != len(blocks):
        raise UsageError(f"{len(keys)} keys but {len(blocks)} blocks")
    views = [byte_view(b, writable=False) for b in blocks]
    for i, view in enumerate(views):
        if not 0 < len(view) <= limits_for(i):
            raise UsageError(f"block {i} is {len(view)} bytes; allowed 1..{limits_for(i)}", ErrorCode.BLOCK_TOO_LARGE)
    return views


def target_views(keys: Sequence[BlockKey], into: Sequence[Any] | None) -> list[memoryview | None]:
    """Writable byte views of the get destinations (``None``: allocate per block)."""
    if into is None:
        return [None] * len(keys)
    if len(keys) != len(into):
        raise UsageError(f"{len(keys)} keys but {len(into)} destination buffers")
    return [byte_view(b, writable=True) for b in into]


class RequestFactory:
    """Builds each op's exchange for a job, with request ids unique per client."""

    def __init__(self, verify_checksums: bool) -> None:
        self._ids = count(1)
        self._verify = verify_checksums

    def put(self, job: Job, views: Sequence[memoryview], limits: WireLimits) -> exchange.Exchange[list[int]]:
        blocks = [views[i] for i in job.indices]
        request = PutRequest(next(self._ids), job.namespace, job.hashes, [len(b) for b in blocks])
        return exchange.put(request, blocks, limits)

    def get(
        self, job: Job, targets: Sequence[memoryview | None], limits: WireLimits
    ) -> exchange.Exchange[tuple[list[int], list[memoryview | None]]]:
        request = GetRequest(next(self._ids), job.namespace, job.hashes)
        return exchange.get(request, [targets[i] for i in job.indices], limits, self._verify)

    def exists(self, job: Job, limits: WireLimits, prefix: bool) -> exchange.Exchange[list[int]]:
        return exchange.exists(ExistsRequest(next(self._ids), job.namespace, job.hashes, prefix), limits)

    def delete(self, job: Job, limits: WireLimits) -> exchange.Exchange[list[int]]:
        return exchange.delete(DeleteRequest(next(self._ids), job.namespace, job.hashes), limits)


def scatter(into: list[Any], job: Job, values: Sequence[Any]) -> None:
    """Write a job's per-key answers back to their batch positions."""
    for index, value in zip(job.indices, values):
        into[index] = value


def leading_ok(statuses: Sequence[int]) -> int:
    """Count of leading OK statuses: the usable prefix of a lookup."""
    for i, status in enumerate(statuses):
        if status != ErrorCode.OK:
            return i
    return len(statuses)
