"""The shared index's memory and upkeep: the published table in the arena file, the hit marks beside it.

Same-node clients find blocks in the published table without asking the daemon
(:mod:`kvpool_client.core.wire.published`), so those reads never reach the DRAM tier's
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
writable by the arena's group, whose members may read the arena. The daemon also
renews the table's heartbeat every 0.1 s, by which readers tell a killed daemon's
table from a live one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

from kvpool_client.core.wire.published import (
    BEAT_INTERVAL_S,
    DEFAULT_PROBE_LIMIT,
    MarkWriter,
    aligned_offset,
    marks_bytes,
    table_bytes,
)
from kvpool_server.alloc.arena import ARENA_PREFIX, SharedArena
from kvpool_server.alloc.generations import SlotGenerations
from kvpool_server.index.published import HitMarks, PublishedIndex
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import DramTier

try:
    from kvpool_client.core.wire._arena_reader import ArenaReader
except ImportError:  # not compiled where this was installed: one-key GETs take the Python path alone
    ArenaReader = None  # type: ignore[assignment,misc]

log = logging.getLogger("kvpool.server")

DRAIN_INTERVAL_S = 0.5
BEATS_PER_DRAIN = round(DRAIN_INTERVAL_S / BEAT_INTERVAL_S)
FULL_DRAIN_EVERY = 20  # every 10 s each mark is compared, dirty chunk or not (see HitMarks)
ARENA_BYTES_PER_ENTRY = 32 * 1024  # the default size: two entries per 64 KiB of arena
MIN_ENTRIES = 1024
_MARKS_MODE = 0o660  # the daemon and its group (same-node readers) write marks; nobody else reads them


def entries_for(setting: int, dram_capacity: int) -> int:
    """The table size the ``shared_index_entries`` setting asks for (0: no table).

    -1 sizes it from the arena: two entries per 64 KiB (at least 1024); other values
    are rounded up to a power of two.
    """
    if setting < 0:
        return power_of_two(max(MIN_ENTRIES, dram_capacity // ARENA_BYTES_PER_ENTRY))
    return power_of_two(setting) if setting else 0


def power_of_two(entries: int) -> int:
    """``entries`` rounded up to a power of two."""
    return 1 << max(0, entries - 1).bit_length()


def marks_name(arena_name: str) -> str:
    """The marks file's name beside arena ``kvpool-<pid>-<n>``: ``kvpool-marks-<pid>-<n>`` (found by the
    stale-arena sweep, not by globs for one daemon's arena)."""
    return arena_name.replace(ARENA_PREFIX, f"{ARENA_PREFIX}marks-", 1)


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
        self._marks_file = SharedArena(
            str(arena.path.parent), marks_name(arena.path.name), marks_bytes(entries), mode=_MARKS_MODE
        )
        self.marks_path = str(self._marks_file.path)
        self._marks = HitMarks(self._marks_file.view, entries)
        self._drains = 0
        self._reader: ArenaReader | None = None
        self.table.beat(time.monotonic_ns())

    def reader(self, generations: SlotGenerations, arena: SharedArena) -> ArenaReader | None:
        """The compiled reader of this table, for the daemon's own sends of published blocks
        (:mod:`kvpool_server.data.published_gets`); None where it was not built. Let go of in
        :meth:`close`."""
        if ArenaReader is not None and self._reader is None:
            header, marks = self.table.header, MarkWriter(self._marks_file.view, self.table.header.entries)
            self._reader = ArenaReader(
                self.table.words, generations.words, arena.view[: arena.capacity], marks.words,
                header.entries, header.probe_limit, generations.header.granule, marks.first, marks.shift, False,
            )  # fmt: skip
        return self._reader

    def drain(self, dram: DramTier, counters: Counters) -> int:
        """Refresh the blocks read through the table since the last drain; returns how many."""
        self._drains += 1
        entries = self._marks.drain(full=self._drains % FULL_DRAIN_EVERY == 0)
        touched = dram.touch_published(entries) if entries else 0
        if touched:
            counters.add("shared_index_touches", touched)
        return touched

    async def run(self, dram: DramTier, counters: Counters) -> None:
        """Renew the heartbeat every :data:`BEAT_INTERVAL_S` and drain every :data:`DRAIN_INTERVAL_S`,
        until cancelled (a failed drain is logged, not fatal)."""
        for beats in itertools.count(1):
            await asyncio.sleep(BEAT_INTERVAL_S)
            self.table.beat(time.monotonic_ns())
            if beats % BEATS_PER_DRAIN:
                continue
            try:
                self.drain(dram, counters)
            except Exception as exc:  # the marks are a hint: losing one drain costs only recency
                log.error("draining hit marks failed", extra={"error": repr(exc)})

    def close(self) -> None:
        """Tell readers the table is retired, then let go of the table and remove the marks file."""
        self.table.retire()
        if self._reader is not None:
            self._reader.release()
        self.table.close()
        self._marks.close()
        self._marks_file.close()
