"""One node's tiers, opened and closed in order.

One shared-memory arena holds the DRAM tier's blocks, their slot generations and the shared
index that same-node clients read without asking; the SSD tier and its demoter come with
``ssd_dir``. Opening first removes the arenas of daemons that died, and undoes itself if a
step fails. Closing has two steps: the tiers (flushing DRAM to SSD when asked), then the arena,
once nothing that maps it (a gRPC call, a data connection) is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpool_server.alloc.arena import ARENA_PREFIX, SharedArena, remove_stale_arenas
from kvpool_server.alloc.generations import SlotGenerations
from kvpool_server.alloc.slab import SlabAllocator
from kvpool_server.eviction import POLICIES
from kvpool_server.tiers.demoter import Demoter, count_lost_evictions
from kvpool_server.tiers.dram import DramTier
from kvpool_server.tiers.quotas import GroupQuotas
from kvpool_server.tiers.shared_index import SharedIndex
from kvpool_server.tiers.ssd import SsdConfig, SsdTier
from kvpool_server.tiers.store import BlockStore

if TYPE_CHECKING:
    from kvpool_server.config_sections import DramSection, SsdSection
    from kvpool_server.stats import Counters

log = logging.getLogger("kvpool.server")


@dataclass(slots=True)
class NodeTiers:
    """The open tiers; build with :meth:`open`.

    Attributes:
        arena: the DRAM tier's shared-memory file.
        generations: the slot generations in the arena file, with the arena's id.
        shared_index: the published index; None with ``shared_index_entries`` 0.
        store: the block store over DRAM and, with ``ssd_dir``, SSD.
        demoter: running when there is an SSD tier.
    """

    arena: SharedArena
    generations: SlotGenerations
    shared_index: SharedIndex | None
    store: BlockStore
    demoter: Demoter | None

    @classmethod
    async def open(
        cls,
        dram: DramSection,
        ssd: SsdSection,
        counters: Counters,
        dram_groups: GroupQuotas | None = None,
        ssd_groups: GroupQuotas | None = None,
    ) -> NodeTiers:
        """Map the arena, then open the SSD tier (its segments are scanned on a thread) and start the demoter.

        Raises:
            OSError: the arena or the SSD directory cannot be made or read.
        """
        with contextlib.ExitStack() as undo:  # unwound in reverse: the index before the arena
            arena = await asyncio.to_thread(_map_arena, dram)  # prefaulting takes seconds per GiB
            undo.callback(_unmap, arena)
            arena_id = int.from_bytes(os.urandom(8), "little") or 1  # tells this arena from a restarted daemon's
            generations = SlotGenerations(arena.extra, dram.capacity, arena_id)
            undo.callback(generations.close)
            entries = dram.index_entries()
            index = SharedIndex(arena, entries, arena_id) if entries else None
            if index is not None:
                undo.callback(index.close)
            policy = POLICIES[dram.eviction_policy]  # the SSD tier evicts in the same order
            disk = await asyncio.to_thread(SsdTier, ssd_config(ssd), counters, policy, ssd_groups) if ssd.dir else None
            if disk is not None:
                undo.callback(disk.close)
            memory = DramTier(
                arena,
                SlabAllocator(dram.capacity, dram.slab_size),
                counters,
                policy_factory=policy,
                on_evict=count_lost_evictions(disk, counters) if disk is not None else None,
                generations=generations,
                namespace_quota=dram.namespace_quota,
                published=index.table if index is not None else None,
                group_quotas=dram_groups,
            )
            store = BlockStore(
                memory,
                disk,
                counters,
                promote_on_hit=ssd.promote_on_hit,
                write_through=ssd.write_through,
                io_threads=ssd.io_threads,
                read_ahead=min(ssd.read_ahead, dram.capacity // 4),
            )
            demoter = Demoter(store, ssd.demote_share) if disk is not None else None
            if demoter is not None:
                demoter.start()
            undo.pop_all()
        return cls(arena, generations, index, store, demoter)

    async def close_tiers(self, flush_s: float) -> None:
        """Stop the demoter (writing DRAM's blocks to SSD for at most ``flush_s``), then close the store."""
        if self.demoter is not None:
            await asyncio.to_thread(self.demoter.stop, flush_s)
        await asyncio.to_thread(self.store.close)
        if self.store.ssd is not None:
            self.store.ssd.close()

    def close_arena(self) -> None:
        """Retire the shared index (its readers move to the next arena), then let go of the arena."""
        if self.shared_index is not None:
            self.shared_index.close()
        self.generations.close()
        _unmap(self.arena)


def ssd_config(ssd: SsdSection) -> SsdConfig:
    """The SSD tier's settings."""
    return SsdConfig(
        ssd.dir,
        ssd.capacity,
        ssd.segment_size,
        ssd.fsync,
        gc_live_ratio=ssd.gc_live_ratio,
        namespace_quota=ssd.namespace_quota,
    )


def _map_arena(dram: DramSection) -> SharedArena:
    """A new arena in ``shm_dir``, after removing the arenas of daemons that died."""
    for stale in remove_stale_arenas(dram.shm_dir):
        log.warning("removed the arena of a daemon that died", extra={"path": str(stale)})
    if dram.prefault_arena:  # seconds per GiB: say so before the wait
        log.info("prefaulting the DRAM arena", extra={"bytes": dram.capacity, "shm_dir": dram.shm_dir})
    started = time.monotonic()
    name = f"{ARENA_PREFIX}{os.getpid()}-{time.monotonic_ns()}"
    arena = SharedArena(dram.shm_dir, name, dram.capacity, prefault=dram.prefault_arena, extra=dram.arena_extra_bytes())
    log.info("DRAM arena ready", extra={"bytes": dram.capacity, "seconds": round(time.monotonic() - started, 2)})
    return arena


def _unmap(arena: SharedArena) -> None:
    try:
        arena.close()
    except BufferError:
        log.warning("arena still mapped by an unfinished request; it is freed at exit")
