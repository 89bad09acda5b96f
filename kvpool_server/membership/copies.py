"""Copying this node's blocks to the nodes that own them: the machinery hand-off and repair share.

Planning is pure: :func:`plan_copies` groups keys by the owners rendezvous
placement gives them. Copying goes through the regular asyncio client, one
target node at a time: DRAM blocks are sent straight from the arena (pinned for
the copy, recency untouched), SSD blocks after a read. :class:`Pacer` bounds the
bytes per second and yields to the event loop between batches, so serving and
the control plane are never starved by a copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType

from kvpool_client.aio import AsyncKVPoolClient
from kvpool_client.core.auth import Credentials
from kvpool_client.core.config import ClientConfig
from kvpool_client.core.errors import ErrorCode, KVPoolError
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import Member, place
from kvpool_server.index import StoreKey
from kvpool_server.tiers.store import BlockStore, HeldBlock

log = logging.getLogger("kvpool.membership.copies")

PUT_BATCH = 32  # blocks per put: a few MiB in flight, pinned no longer than one request
EXISTS_BATCH = 512  # keys per existence check: no payload, so larger batches are cheap
# Failures of the target itself rather than of a block: the rest of the call would fail the same way.
# BUSY is not among the answers that count as stored: another writer's put may still abort.
_UNREACHABLE = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT, ErrorCode.SHUTTING_DOWN})
# The target cannot take the block (no room, its namespace quota, its block limit): a retry soon after fails alike.
_REFUSALS = frozenset({ErrorCode.OUT_OF_SPACE, ErrorCode.QUOTA_EXCEEDED, ErrorCode.BLOCK_TOO_LARGE})


def plan_copies(
    keys: Iterable[StoreKey], members: Sequence[Member], replicas: int, exclude: str = ""
) -> dict[str, list[StoreKey]]:
    """Which of ``keys`` each owner should hold: node id -> keys, in the order given.

    Args:
        keys: blocks held here.
        members: the nodes that take writes (placement ranks them all, whatever their state).
        replicas: owners per key.
        exclude: a node id left out of the result (this node: it holds them already).
    Returns:
        Every owner other than ``exclude`` with the keys it owns; owners with none are absent.
    """
    by_owner: dict[str, list[StoreKey]] = defaultdict(list)
    for key in keys:
        for owner in place(key[1], members, replicas):
            if owner.node_id != exclude:
                by_owner[owner.node_id].append(key)
    return dict(by_owner)


def chunks(items: Sequence[StoreKey], size: int) -> Iterable[Sequence[StoreKey]]:
    """``items`` in consecutive slices of at most ``size``."""
    return (items[start : start + size] for start in range(0, len(items), size))


@dataclass(slots=True)
class CopyTally:
    """What happened to blocks sent (or meant to be sent) to one target.

    Attributes:
        copies: stored on the target by this copy.
        present: the target had them already: found by the existence check (nothing
            sent), or answered by the put as already stored (ALREADY_EXISTS).
        failed: the target did not store them (unreachable, refused, full, larger than
            its block limit) or did not confirm them (BUSY: another writer's put in progress).
        refused: of ``failed``, those the target refused for room or size (full, its
            namespace quota, over its block limit).
        gone: no longer held here when their turn came (evicted or deleted).
        bytes: payload bytes sent to a target that answered.
    """

    copies: int = 0
    present: int = 0
    failed: int = 0
    refused: int = 0
    gone: int = 0
    bytes: int = 0

    def add(self, other: CopyTally) -> None:
        self.copies += other.copies
        self.present += other.present
        self.failed += other.failed
        self.refused += other.refused
        self.gone += other.gone
        self.bytes += other.bytes


class Pacer:
    """Spaces batches so that copies average at most ``rate`` bytes per second.

    Time spent without sending (existence checks, reads from SSD) earns at most
    ``burst_s`` of credit, so a slow stretch is not followed by an unpaced burst.

    Args:
        rate: bytes per second; 0: no limit (batches still yield to the loop).
        clock: monotonic seconds (a parameter so tests can drive it).
        burst_s: the most credit idle time earns, in seconds of ``rate``.
    """

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic, burst_s: float = 0.1) -> None:
        self._rate = rate
        self._clock = clock
        self._burst_s = burst_s
        self._due = clock()  # when the bytes counted so far are paid for

    def delay(self, sent: int) -> float:
        """Count ``sent`` bytes; returns the seconds to wait before the next batch."""
        if self._rate <= 0:
            return 0.0
        now = self._clock()
        self._due = max(self._due, now - self._burst_s) + sent / self._rate
        return max(0.0, self._due - now)

    async def pace(self, sent: int) -> None:
        """Count ``sent`` bytes and wait out the delay; always yields at least once."""
        await asyncio.sleep(self.delay(sent))


class BlockCopier:
    """Copies blocks held in ``blocks`` to one node; use as an async context manager.

    Blocks larger than the target's block limit count as failed one by one and are
    left out of the put; the rest of their batch is sent. When a request fails at the
    transport level (the target is unreachable, times out or is shutting down),
    :attr:`broken` is set and the rest of that call's keys count as failed without
    being sent; the next :meth:`copy` call tries the target again.

    Args:
        blocks: this node's block store.
        target: the node to copy to.
        credentials: the cluster's token and TLS settings, presented to the target.
        pacer: shared by every copier of one run, so the bound holds for the run.
    """

    def __init__(self, blocks: BlockStore, target: Member, credentials: Credentials, pacer: Pacer) -> None:
        self.target = target
        self.broken = False
        self._block_limit: int | None = None  # the target's, once its server info was read
        self._blocks = blocks
        self._pacer = pacer
        config = ClientConfig(nodes=(target.address,), auth_token=credentials.token, tls=credentials.tls)
        self._client = AsyncKVPoolClient(config=config)

    async def __aenter__(self) -> BlockCopier:
        await self._client.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._client.close()

    async def copy(self, keys: Sequence[StoreKey], *, skip_present: bool) -> AsyncIterator[CopyTally]:
        """Send ``keys`` to the target, yielding a tally per batch (count them live).

        Args:
            keys: blocks to copy.
            skip_present: ask the target first (batched EXISTS) and send only what it lacks.
        """
        self.broken = False  # an earlier call's outage may be over: give the target another chance
        limit = await self._limit()
        for part in chunks(keys, EXISTS_BATCH):
            present = await self._held_by_target(part) if skip_present and not self.broken else set()
            if present:
                yield CopyTally(present=len(present))
            for batch in chunks([k for k in part if k not in present], PUT_BATCH):
                if self.broken:
                    yield CopyTally(failed=len(batch))
                    continue
                tally = await self._put_batch(batch, limit)
                yield tally
                await self._pacer.pace(tally.bytes)

    async def _limit(self) -> int | None:
        """The target's largest block (read once); None: unknown, the put finds out.

        Unreachable sets :attr:`broken`: the puts would fail the same way.
        """
        if self._block_limit is None and not self.broken:
            try:
                info = await self._client.server_info(self.target.address)
            except KVPoolError as exc:
                log.warning("server info failed", extra={"target": self.target.node_id, "error": str(exc)})
                self.broken = exc.code in _UNREACHABLE
                return None
            self._block_limit = info.limits.max_block_size
        return self._block_limit

    async def _held_by_target(self, keys: Sequence[StoreKey]) -> set[StoreKey]:
        """The keys the target says it stores; an unreachable target stores none (the put then fails)."""
        try:
            found = await self._client.exists([BlockKey(*key) for key in keys])
        except KVPoolError as exc:
            log.warning("existence check failed", extra={"target": self.target.node_id, "error": str(exc)})
            return set()
        return {key for key, held in zip(keys, found, strict=True) if held}

    async def _put_batch(self, batch: Sequence[StoreKey], limit: int | None) -> CopyTally:
        """Put the blocks of ``batch`` still held here that fit ``limit``; the batch's tally."""
        held = await self._blocks.acquire(batch, touch=False)
        try:
            present = [(key, block) for key, block in zip(batch, held, strict=True) if block is not None]
            # One oversized block would make the client refuse the whole put: leave it out.
            fits = [(key, block) for key, block in present if limit is None or len(block.view) <= limit]
            too_large = len(present) - len(fits)
            tally = CopyTally(gone=len(batch) - len(present), failed=too_large, refused=too_large)
            if fits:
                tally.add(await self._put(fits))
        finally:
            self._blocks.release(held)
        return tally

    async def _put(self, blocks: list[tuple[StoreKey, HeldBlock]]) -> CopyTally:
        """Put the held blocks (with their chain depth, for eviction order); sets or clears :attr:`broken`."""
        keys = [BlockKey(ns, h, depth=_depth(block)) for (ns, h), block in blocks]
        try:
            result = await self._client.put(keys, [block.view for _, block in blocks])
        except KVPoolError as exc:  # refused before sending (a block over the limit): nothing went out
            log.warning("copy batch failed", extra={"target": self.target.node_id, "error": str(exc)})
            self.broken = exc.code in _UNREACHABLE
            return CopyTally(failed=len(blocks), refused=len(blocks) if exc.code in _REFUSALS else 0)
        statuses = list(result.statuses)
        self.broken = any(s in _UNREACHABLE for s in statuses)
        tally = CopyTally(copies=statuses.count(ErrorCode.OK), present=statuses.count(ErrorCode.ALREADY_EXISTS),
                          refused=sum(s in _REFUSALS for s in statuses))  # fmt: skip
        tally.failed = len(blocks) - tally.copies - tally.present
        tally.bytes = sum(
            len(block.view) for (_, block), s in zip(blocks, statuses, strict=True) if s not in _UNREACHABLE
        )
        return tally


def _depth(block: HeldBlock) -> int | None:
    """The block's chain depth if the writer gave one (0 means head or unknown)."""
    return (block.entry.depth or None) if block.entry is not None else None
