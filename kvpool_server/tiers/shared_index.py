"""The shared index's memory and upkeep: the published table in the arena file, the hit marks beside it.

Same-node clients find blocks in the published table without asking the daemon
(:mod:`kvpool_client.wire.published`), so those reads never reach the DRAM tier's
eviction order by themselves. They leave hit marks in a small file of their own
instead (the arena is read-only to them); every :data:`DRAIN_INTERVAL_S` the daemon
compares the marks and refreshes the marked blocks, least recently read first. So
a block read only through the table keeps its place in the order, with half a
second's resolution; what is lost is each read's exact moment and count (hits
through the table are not in ``dram_hits``: ``shared_index_touches`` counts the
blocks refreshed, once per drain each).

The table sits in the arena file after the slot generations, on a cache line; the
marks file is created next to the arena, locked like it (so a daemon that died
leaves nothing behind: :func:`~kvpool_server.alloc.arena.remove_stale_arenas`), and
writable by the arena's group, whose members may read the arena.
"""

from __future__ import annotations

import asyncio
import logging

from kvpool_client.wire.published import DEFAULT_PROBE_LIMIT, aligned_offset, marks_bytes, table_bytes
from kvpool_server.alloc.arena import SharedArena
from kvpool_server.alloc.generations import SlotGenerations
from kvpool_server.index.published import HitMarks, PublishedIndex
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import DramTier

log = logging.getLogger("kvpool.server")

DRAIN_INTERVAL_S = 0.5
FULL_DRAIN_EVERY = 20  # every 10 s each mark is compared, dirty chunk or not (see HitMarks)
ARENA_BYTES_PER_ENTRY = 32 * 1024  # the default size: two entries per 64 KiB of arena
MIN_ENTRIES = 1024
_MARKS_MODE = 0o660  # the daemon and its group (same-node readers) write marks; nobody else reads them


def default_entries(dram_capacity: int) -> int:
    """Entries for an arena of ``dram_capacity`` bytes: two per 64 KiB, a power of two (at least 1024)."""
    return power_of_two(max(MIN_ENTRIES, dram_capacity // ARENA_BYTES_PER_ENTRY))


def power_of_two(entries: int) -> int:
    """``entries`` rounded up to a power of two."""
    return 1 << max(0, entries - 1).bit_length()


def table_offset(capacity: int) -> int:
    """Where the table starts in the arena file: after the blocks and their slot generations."""
    return aligned_offset(capacity + SlotGenerations.region_bytes(capacity))


def extra_bytes(capacity: int, entries: int) -> int:
    """Bytes the arena file needs past its blocks: the generations and, with ``entries``, the table."""
    if not entries:
        return SlotGenerations.region_bytes(capacity)
    return table_offset(capacity) - capacity + table_bytes(entries)


class SharedIndex:
    """The published table of one arena, its hit marks, and their drain.

    Args:
        arena: the daemon's arena, mapped with :func:`extra_bytes` past its blocks.
        entries: table size, a power of two.
        arena_id: the arena's id (as in its slot generations).
        probe_limit: see :class:`~kvpool_server.index.published.PublishedIndex`.

    Raises:
        OSError: the marks file cannot be made.
        ValueError: the arena has no room for the table.
    """

    def __init__(self, arena: SharedArena, entries: int, arena_id: int, probe_limit: int = DEFAULT_PROBE_LIMIT) -> None:
        self.offset = table_offset(arena.capacity)
        self.table = PublishedIndex(arena.extra[self.offset - arena.capacity :], entries, arena_id, probe_limit)
        self._marks_file = SharedArena(str(arena.path.parent), f"{arena.path.name}-marks", marks_bytes(entries),
                                       mode=_MARKS_MODE)
        self.marks_path = str(self._marks_file.path)
        self._marks = HitMarks(self._marks_file.view, entries)
        self._drains = 0

    def drain(self, dram: DramTier, counters: Counters) -> int:
        """Refresh the blocks read through the table since the last drain; returns how many."""
        self._drains += 1
        entries = self._marks.drain(full=self._drains % FULL_DRAIN_EVERY == 0)
        touched = dram.touch_published(entries) if entries else 0
        if touched:
            counters.add("shared_index_touches", touched)
        return touched

    async def run(self, dram: DramTier, counters: Counters, interval_s: float = DRAIN_INTERVAL_S) -> None:
        """Drain every ``interval_s`` until cancelled (a failed drain is logged, not fatal)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.drain(dram, counters)
            except Exception as exc:  # the marks are a hint: losing one drain costs only recency
                log.error("draining hit marks failed", extra={"error": repr(exc)})

    def close(self) -> None:
        """Tell readers the table is retired, then let go of the table and remove the marks file."""
        self.table.retire()
        self.table.close()
        self._marks.close()
        self._marks_file.close()
