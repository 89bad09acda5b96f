"""Slot generations: a u64 per arena granule, bumped whenever a slot is freed.

Same-node readers copy blocks straight out of the arena without pinning them
(see :mod:`kvpool_client.transport.shm`); the generation of a block's slot, read
before and after the copy, tells them whether the slot was freed (and so maybe
reused) meanwhile. The counters live in the arena file itself, past the blocks
(:class:`~kvpool_server.alloc.arena.SharedArena`'s ``extra`` region), so a reader
maps one file and the counters always belong to the blocks next to them. The
layout is in :mod:`kvpool_client.core.wire.generations`.

Only the daemon writes, under the DRAM tier's lock; each counter is an aligned
8-byte word, so a reader never sees a torn value.
"""

from __future__ import annotations

from kvpool_client.core.wire.generations import GRANULE, HEADER_BYTES, GenerationsHeader, encode_header


class SlotGenerations:
    """The generation counters of one arena, in a shared memory region.

    Args:
        region: at least :meth:`region_bytes` writable bytes (the arena's ``extra``).
        capacity: the arena's size in bytes.
        arena_id: the arena's random id, written into the header.

    Raises:
        ValueError: ``region`` is too small.
    """

    def __init__(self, region: memoryview, capacity: int, arena_id: int) -> None:
        self.header = GenerationsHeader(arena_id, GRANULE, -(-capacity // GRANULE))
        if len(region) < self.header.nbytes:
            raise ValueError(f"generations need {self.header.nbytes} bytes, the region has {len(region)}")
        region[:HEADER_BYTES] = encode_header(self.header)
        self._counters = region[HEADER_BYTES : self.header.nbytes].cast("Q")

    @staticmethod
    def region_bytes(capacity: int) -> int:
        """Bytes the counters of an arena of ``capacity`` bytes take, header included."""
        return GenerationsHeader(0, GRANULE, -(-capacity // GRANULE)).nbytes

    @property
    def arena_id(self) -> int:
        return self.header.arena_id

    def bump(self, offset: int) -> None:
        """The slot at ``offset`` is being freed: no reader may trust an earlier generation."""
        index = self.header.index(offset)
        self._counters[index] += 1

    def get(self, offset: int) -> int:
        """The current generation of the slot starting at ``offset``."""
        return int(self._counters[self.header.index(offset)])

    @property
    def words(self) -> memoryview:
        """The generations, one u64 per granule (what a compiled reader checks)."""
        return self._counters

    def close(self) -> None:
        """Let go of the region, so the arena can be unmapped."""
        self._counters.release()
