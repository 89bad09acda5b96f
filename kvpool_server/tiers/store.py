"""The daemon's blocks across tiers: DRAM in front, an optional SSD tier behind it.

Writes land in DRAM. A :class:`~kvpool_server.tiers.demoter.Demoter` copies the
coldest DRAM blocks to SSD ahead of their eviction, so evicting them later costs
nothing. A read that misses DRAM but hits SSD is served from SSD and, by policy,
promoted: read straight into a fresh DRAM slot, which then serves it.

SSD reads run on a thread pool (file I/O never blocks an event loop). DRAM calls
stay inline: they are dictionary operations under the DRAM tier's short lock. The
SSD blocks of one request are read by one pool task, in disk order: a prefix chain's
records lie back to back (the demoter writes them together), so they are read as one
sequential stretch, which the kernel's read-ahead keeps the device busy on. Other
requests' reads run beside it on the other pool threads.

With read-ahead on, a client reading SSD records in log order, up or down (a long
prefix reloaded batch by batch), makes the store read the next ones into DRAM on a
pool thread while the reply is sent (:mod:`~kvpool_server.tiers.read_streams` decides
what), so the next batch finds them there. A read of blocks still being read
ahead waits for that read instead of reading them a second time.

A delete and a promotion of the same key exclude each other for the few
dictionary operations that decide the outcome, so a deleted block is never
committed back into DRAM by a promotion that read it just before.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import takewhile

from kvpool_client.core.errors import ErrorCode
from kvpool_server.index import BlockEntry, BlockStatus, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import DramTier
from kvpool_server.tiers.read_streams import ReadAheadPlanner, Stretch
from kvpool_server.tiers.spans import plan_spans
from kvpool_server.tiers.ssd import SsdTier
from kvpool_server.tiers.usage import NamespaceUsage, TierUsage

log = logging.getLogger("kvpool.ssd")


@dataclass(frozen=True, slots=True)
class TierReport:
    """One tier's usage and event counts, as GetStats and /metrics show them.

    ``promotions`` are blocks copied up out of this tier, ``demotions`` blocks
    copied down into it; ``failure`` says why the tier stopped taking writes.
    """

    name: str
    usage: TierUsage
    hits: int
    misses: int
    evictions: int
    promotions: int
    demotions: int
    corrupt_blocks: int
    io_errors: int
    failure: str

    @classmethod
    def from_counters(cls, name: str, usage: TierUsage, values: dict[str, int], failure: str | None) -> TierReport:
        def count(event: str) -> int:
            return values.get(f"{name}_{event}", 0)

        return cls(
            name,
            usage,
            count("hits"),
            count("misses"),
            count("evictions"),
            count("promotions"),
            count("demotions"),
            count("corrupt_blocks"),
            count("io_errors"),
            failure or "",
        )


# An SSD read of one request: (position in the request, the DRAM slot it promotes to or None, its target).
_Read = tuple[int, BlockEntry | None, memoryview]


@dataclass(slots=True)  # not frozen: one is made per block read, and a frozen one sets each field by object.__setattr__
class HeldBlock:
    """A block's bytes held for a reader until :meth:`BlockStore.release` (read-only to holders).

    ``entry`` is the DRAM pin behind ``view``; None when the bytes were read from
    SSD into a private buffer (no promotion).
    """

    view: memoryview
    checksum: int
    entry: BlockEntry | None


class BlockStore:
    """Reads, lookups and deletes across the DRAM and SSD tiers.

    Args:
        dram: the DRAM tier; writes land in it (:meth:`reserve`, :meth:`commit`).
        ssd: the SSD tier, or None for a DRAM-only node.
        counters: the daemon's counters.
        promote_on_hit: copy a block read from SSD into DRAM.
        write_through: a put is acknowledged only once its blocks are on SSD
            (see :meth:`persist`).
        io_threads: threads for SSD reads.
        read_ahead: bytes a sequential reader of SSD records is read ahead of,
            into DRAM; 0: no read-ahead. Needs ``promote_on_hit``.
    """

    def __init__(
        self,
        dram: DramTier,
        ssd: SsdTier | None,
        counters: Counters,
        *,
        promote_on_hit: bool = True,
        write_through: bool = False,
        io_threads: int = 4,
        read_ahead: int = 0,
    ) -> None:
        self.dram = dram
        self.ssd = ssd
        self._counters = counters
        self._promote = promote_on_hit
        self.write_through = write_through and ssd is not None
        self._pool = ThreadPoolExecutor(io_threads, "kvpool-ssd-read") if ssd is not None else None
        self.graves: queue.SimpleQueue[StoreKey] = queue.SimpleQueue()  # tombstones for the demoter to write
        self._delete_lock = threading.Lock()  # a delete against a promotion's commit
        self._planner = ReadAheadPlanner(read_ahead) if ssd is not None and promote_on_hit and read_ahead else None
        self._reading_ahead: dict[StoreKey, Future[None]] = {}  # key -> the read-ahead bringing it to DRAM
        self._reading_ahead_lock = threading.Lock()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)  # a read waiting for a cancelled read-ahead wakes

    # -- lookups (no I/O) -----------------------------------------------------

    def contains(self, key: StoreKey) -> bool:
        return self.dram.contains(key) or (self.ssd is not None and self.ssd.contains(key))

    def prefix_hits(self, keys: Iterable[StoreKey]) -> int:
        """Number of leading ``keys`` stored in any tier."""
        return sum(1 for _ in takewhile(self.contains, keys))

    def readable_keys(self) -> list[StoreKey]:
        """Every stored key, each once (DRAM first)."""
        keys = self.dram.readable_keys()
        if self.ssd is not None:
            seen = set(keys)
            keys += [k for k in self.ssd.keys() if k not in seen]
        return keys

    def namespace_bytes(self) -> dict[str, dict[str, int]]:
        """Per tier, the bytes each namespace holds (tracked incrementally)."""
        tiers = {"dram": self.dram.namespace_bytes()}
        if self.ssd is not None:
            tiers["ssd"] = self.ssd.namespace_bytes()
        return tiers

    def namespace_usage(self) -> dict[str, dict[str, NamespaceUsage]]:
        """Per tier (``dram``, ``ssd``), each namespace's blocks and bytes."""
        tiers = {"dram": self.dram.namespace_usage()}
        if self.ssd is not None:
            tiers["ssd"] = self.ssd.namespace_usage()
        return tiers

    def usage(self) -> dict[str, TierUsage]:
        tiers = {"dram": self.dram.usage()}
        if self.ssd is not None:
            tiers["ssd"] = self.ssd.usage()
        return tiers

    def reports(self) -> list[TierReport]:
        """Usage and counts of every tier, DRAM first."""
        values = self._counters.snapshot()
        failures = {"ssd": self.ssd.failure() if self.ssd is not None else None}
        return [
            TierReport.from_counters(name, usage, values, failures.get(name)) for name, usage in self.usage().items()
        ]

    # -- deletes --------------------------------------------------------------

    def delete(self, key: StoreKey) -> bool:
        """Remove ``key`` from every tier; True if any held it.

        The SSD index forgets it at once; its tombstone is written by the demoter.
        A block only in DRAM gets one too: an older copy of it may still lie in the
        segment files (demoted, then evicted from SSD), and a restart would bring
        that back. A key held nowhere gets none, so deletes of unknown keys cost
        no disk.
        """
        with self._delete_lock:
            in_dram = self.dram.delete(key)
            on_ssd = self.ssd is not None and self.ssd.forget(key)
        if self.ssd is not None and (in_dram or on_ssd):
            self.graves.put(key)
        return in_dram or on_ssd

    def flush(self, matches: Callable[[str], bool]) -> int:
        """Delete every block whose namespace ``matches`` from every tier; returns how many went.

        Walks the indexes (O(blocks)): an admin operation, run off the event loop.
        """
        keys = {key for key in self.readable_keys() if matches(key[0])}
        return sum(self.delete(key) for key in keys)

    # -- writes: a put reserves, fills, then commits or aborts -------------------

    def slot_size(self, length: int) -> int | None:
        """The slot a block of ``length`` bytes takes; None where :meth:`reserve` refuses the length."""
        return self.dram.slot_size(length)

    def reserve(self, key: StoreKey, length: int, depth: int) -> BlockEntry | ErrorCode:
        """A DRAM slot for a new block, evicting for it; or why there is none (the block exists,
        its length is refused, nothing could be evicted)."""
        return self.dram.reserve(key, length, depth)

    def slot(self, entry: BlockEntry) -> memoryview:
        """The reserved slot a block's bytes go into."""
        return self.dram.view(entry)

    def commit(self, entry: BlockEntry, checksum: int | None = None) -> None:
        """Make a filled block readable; it stays pinned for :meth:`persist` on a write-through node.

        Args:
            checksum: the bytes' checksum as their writer gave it (a one-sided put); None: computed here.
        """
        self.dram.commit(entry, checksum, keep_pin=self.write_through)

    def abort(self, entry: BlockEntry) -> None:
        """Free a reservation whose bytes never all arrived: nothing of it was ever readable."""
        self.dram.abort(entry)

    # -- write-through ----------------------------------------------------------

    async def persist(self, entries: Sequence[BlockEntry]) -> None:
        """Write just-committed blocks to SSD, then release their pins.

        The caller committed them with ``keep_pin=True``, so eviction cannot take
        them meanwhile. A block SSD cannot take (disk error, already there) stays
        in DRAM: the failure is counted and logged by the SSD tier.
        """
        assert self.ssd is not None and self._pool is not None
        writes = []
        for entry in entries:
            write = self._pool.submit(self.write_down, entry)
            # Unpinned when its write ends, even if the put is cancelled meanwhile.
            write.add_done_callback(partial(self._unpin_written, entry))
            writes.append(asyncio.wrap_future(write))
        await asyncio.gather(*writes)

    def _unpin_written(self, entry: BlockEntry, _write: Future[bool]) -> None:
        self.dram.release(entry)

    def write_down(self, entry: BlockEntry) -> bool:
        """Copy a pinned DRAM block to SSD (blocking: a pool or demoter thread); True if written.

        A pinned block is unlinked only by a delete, so one unlinked before or
        during the write is not written, or is forgotten again with a tombstone:
        a deleted block must not come back from SSD.
        """
        assert self.ssd is not None
        if entry.unlinked:
            return False
        written = self.ssd.write(entry.key, self.dram.view(entry), entry.checksum, entry.depth)
        if written and entry.unlinked and self.ssd.forget(entry.key):
            self.ssd.bury(entry.key)
        return written

    # -- reads ----------------------------------------------------------------

    async def acquire(
        self, keys: Sequence[StoreKey], *, touch: bool = True, arena_only: bool = False
    ) -> list[HeldBlock | None]:
        """Hold each key's bytes for reading (None: a miss); release them with :meth:`release`.

        Args:
            touch: a client read: count hits and misses, refresh recency, promote.
            arena_only: hold only blocks in the DRAM arena (promoted if need be); an
                SSD block that cannot be promoted is left unread, as None.
                Internal copies (hand-off) pass False.

        Raises:
            asyncio.CancelledError: the caller was cancelled; nothing stays pinned
                (SSD reads already running release their blocks when they finish).
        """
        held = self.acquire_dram(keys, touch=touch)
        try:
            await self.acquire_rest(keys, held, touch=touch, arena_only=arena_only)
        except BaseException:
            self.release(held)
            raise
        return held

    def acquire_dram(self, keys: Sequence[StoreKey], *, touch: bool = True) -> list[HeldBlock | None]:
        """The blocks :meth:`acquire` holds without waiting: those in DRAM (None for the others)."""
        # Tail first: a chain's head ends up the most recent.
        entries = [self.dram.acquire(k, touch=touch) for k in reversed(keys)][::-1]
        if self._planner is not None and touch:
            self._note_read_ahead_hits(entries)
        return [None if e is None else self._dram_held(e) for e in entries]

    def acquire_dram_one(self, key: StoreKey) -> HeldBlock | None:
        """:meth:`acquire_dram` of one key, without its lists (a single-block get)."""
        entry = self.dram.acquire(key)
        if entry is None:
            return None
        if self._planner is not None:
            self._note_read_ahead_hits((entry,))
        return self._dram_held(entry)

    def on_ssd(self, key: StoreKey) -> bool:
        """Whether the SSD tier holds ``key``: a DRAM miss of it that :meth:`acquire_rest` must read."""
        return self.ssd is not None and self.ssd.contains(key)

    def wants_ssd(self, keys: Sequence[StoreKey], held: Sequence[HeldBlock | None]) -> bool:
        """Whether some key ``held`` misses is on the SSD tier: :meth:`acquire_rest` must read it."""
        return bool(self._ssd_misses(keys, held))

    def _ssd_misses(self, keys: Sequence[StoreKey], held: Sequence[HeldBlock | None]) -> list[int]:
        ssd = self.ssd
        return [] if ssd is None else [i for i, h in enumerate(held) if h is None and ssd.contains(keys[i])]

    async def acquire_rest(
        self, keys: Sequence[StoreKey], held: list[HeldBlock | None], *, touch: bool = True, arena_only: bool = False
    ) -> None:
        """Fill the misses of :meth:`acquire_dram`'s ``held`` from the SSD tier, in place.

        On failure the caller still releases ``held``, and blocks read meanwhile
        are released when their read ends.
        """
        misses = self._ssd_misses(keys, held)
        if not misses:
            return
        if self._planner is not None:
            misses = await self._take_read_ahead(keys, held, misses, touch)
        if misses:
            assert self._pool is not None
            load = self._pool.submit(self._load_many, [keys[i] for i in misses], touch, arena_only)
            try:
                loaded = await asyncio.wrap_future(load)
            except BaseException:
                load.add_done_callback(self._release_load)  # its blocks never reach the caller
                raise
            for i, block in zip(misses, loaded, strict=True):
                held[i] = block
        if touch:  # hits were touched before the promotions: order the whole chain again, tail first
            self.dram.refresh([b.entry for b in reversed(held) if b is not None and b.entry is not None])

    def _release_load(self, load: Future[list[HeldBlock | None]]) -> None:
        if not load.cancelled() and load.exception() is None:
            self.release(load.result())

    @property
    def arena_id(self) -> int | None:
        """The id of the shared arena same-node readers map; None where DRAM is not shared."""
        generations = self.dram.generations
        return None if generations is None else generations.arena_id

    def generation(self, entry: BlockEntry) -> int:
        """The generation of a held block's slot: a same-node reader checks it around its copy."""
        return self.dram.generation(entry)

    def discard_corrupt(self, entry: BlockEntry) -> None:
        """Drop a DRAM block whose bytes no longer match its checksum."""
        self.dram.discard_corrupt(entry)

    def release(self, held: Iterable[HeldBlock | None]) -> None:
        for block in held:
            if block is not None and block.entry is not None:
                self.dram.release(block.entry)

    def _dram_held(self, entry: BlockEntry) -> HeldBlock:
        return HeldBlock(self.dram.view(entry), entry.checksum, entry)

    def _load_many(self, keys: list[StoreKey], touch: bool, arena_only: bool) -> list[HeldBlock | None]:
        """Read blocks from SSD in one pass (on a pool thread): into DRAM slots when promoting, else buffers."""
        assert self.ssd is not None
        held: list[HeldBlock | None] = [None] * len(keys)
        reads: list[_Read] = []
        finished = 0  # reads handed to the reader (or dropped) so far
        promoted = 0
        try:
            for i, key in enumerate(keys):
                target = self._target(key, touch, arena_only)
                if isinstance(target, HeldBlock):
                    held[i] = target
                elif target is not None:
                    reads.append((i, *target))
            sums = self.ssd.read_many([keys[i] for i, _, _ in reads], [view for _, _, view in reads], touch=touch)
            for (i, slot, view), checksum in zip(reads, sums, strict=True):
                block = held[i] = self._finish(slot, view, checksum, arena_only)
                finished += 1
                promoted += slot is not None and block is not None and block.entry is slot
        except BaseException:  # the reader gets nothing: no slot may stay reserved or pinned for it
            self.release(held)
            self._drop_slots(reads[finished:])
            raise
        if promoted:
            self._counters.add("ssd_promotions", promoted)
        if self._planner is not None and touch:
            self._follow([keys[i] for i, block in enumerate(held) if block is not None and block.entry is not None])
        return held

    # -- read-ahead -------------------------------------------------------------

    def _note_read_ahead_hits(self, entries: Sequence[BlockEntry | None]) -> None:
        """Count clients' first reads of read-ahead blocks, refresh them on SSD as a read
        from there would (tail first), and keep their streams going."""
        hits = [e for e in entries if e is not None and e.read_ahead]
        if not hits:
            return
        for entry in hits:
            entry.read_ahead = False
        self.dram.publish_read(hits)  # held back from the shared index until now
        assert self.ssd is not None
        self.ssd.touch([entry.key for entry in reversed(hits)])
        self._counters.add("ssd_read_ahead_hits", len(hits))
        self._follow([entry.key for entry in hits])

    def _follow(self, keys: Sequence[StoreKey]) -> None:
        """Show the planner the SSD records a client read; start the read-ahead it plans."""
        assert self._planner is not None and self.ssd is not None
        locations = [loc for key in keys if (loc := self.ssd.location_of(key)) is not None]
        ranges: list[Stretch] = []
        for span in plan_spans(locations):
            here = self.ssd.log_range(span.location)
            if ranges and ranges[-1].end == here.start:  # on across a segment's end: one read still
                here = Stretch(ranges.pop().start, here.end)
            ranges.append(here)
        for read in ranges:
            ahead = self._planner.observe(read)
            if ahead is not None:
                self._start_read_ahead(self.ssd.keys_before(ahead) if ahead.backward else self.ssd.keys_between(ahead))

    def _start_read_ahead(self, keys: list[StoreKey]) -> None:
        """Read ``keys`` ahead as one pool task. Stretches planned one after another are
        read side by side, but each by one task: several readers of one segment file make
        the kernel's read-ahead lose track of them, which undoes what reading ahead gains."""
        with self._reading_ahead_lock:
            keys = [key for key in keys if key not in self._reading_ahead and not self.dram.contains(key)]
            if not keys:
                return
            assert self._pool is not None
            try:
                job = self._pool.submit(self._read_ahead, keys)
            except RuntimeError:  # shutting down: nothing is read ahead any more
                return
            self._reading_ahead.update(dict.fromkeys(keys, job))
        job.add_done_callback(lambda _: self._read_ahead_done(keys, job))  # at once if already done

    def _read_ahead_done(self, keys: list[StoreKey], job: Future[None]) -> None:
        with self._reading_ahead_lock:
            for key in keys:
                if self._reading_ahead.get(key) is job:
                    del self._reading_ahead[key]

    def _read_ahead(self, keys: list[StoreKey]) -> None:
        """Read blocks from SSD into fresh DRAM slots (a pool thread); any that do not fit are skipped."""
        assert self.ssd is not None
        slots: list[BlockEntry] = []
        for key in keys:
            length = self.ssd.length_of(key)
            slot = None if length is None else self.dram.reserve(key, length)
            if isinstance(slot, BlockEntry):  # else in DRAM already, being written, or no room
                slot.read_ahead = True
                slots.append(slot)
        reads: list[_Read] = [(i, slot, self.dram.view(slot)) for i, slot in enumerate(slots)]
        finished = read = 0
        try:
            sums = self.ssd.read_many([slot.key for slot in slots], [view for _, _, view in reads], touch=False)
            for entry, (_, _, view), checksum in zip(slots, reads, sums, strict=True):
                block = self._finish(entry, view, checksum, arena_only=True)
                finished += 1
                if block is not None:
                    self.dram.release(entry)  # committed with a reader's pin: drop it
                    read += 1
        except Exception as exc:  # only a guess ahead of reads: a failure costs the reads their speed
            self._drop_slots(reads[finished:])
            log.error("SSD read-ahead failed", extra={"blocks": len(reads), "error": repr(exc)})
        if read:
            self._counters.add("ssd_read_ahead", read)
            self._counters.add("ssd_promotions", read)  # copied up out of SSD, as a client's promotion is

    async def _take_read_ahead(
        self, keys: Sequence[StoreKey], held: list[HeldBlock | None], misses: list[int], touch: bool
    ) -> list[int]:
        """Wait for the read-ahead bringing any of ``misses`` to DRAM and hold what it
        brought, in place; returns the misses left for SSD."""
        with self._reading_ahead_lock:
            jobs = {id(job): job for i in misses if (job := self._reading_ahead.get(keys[i])) is not None}
        if not jobs:
            return misses
        await asyncio.wait([asyncio.wrap_future(job) for job in jobs.values()])
        arrived = [self.dram.acquire(keys[i], touch=False) for i in misses]  # their misses were counted
        if touch:
            self._note_read_ahead_hits(arrived)
        for i, entry in zip(misses, arrived, strict=True):
            if entry is not None:
                held[i] = self._dram_held(entry)
        return self._ssd_misses(keys, held)

    def _drop_slots(self, reads: list[_Read]) -> None:
        """Free the DRAM slots of promotions never handed to the reader: abort those still
        reserved, unpin one committed when its :meth:`_finish` failed after the commit."""
        for _, slot, _ in reads:
            if slot is None:
                continue
            if slot.status is not BlockStatus.WRITING:
                self.dram.release(slot)  # committed with the reader's pin
            elif not slot.unlinked:  # unlinked: aborted already
                self.dram.abort(slot)

    def _target(
        self, key: StoreKey, touch: bool, arena_only: bool
    ) -> tuple[BlockEntry | None, memoryview] | HeldBlock | None:
        """Where ``key``'s block is read to: a reserved DRAM slot (promotion), or a private
        buffer (slot None); the DRAM block when it got there meanwhile; None: leave it unread."""
        assert self.ssd is not None
        length = self.ssd.length_of(key)
        if length is None:
            return None
        if self._promote and touch:
            entry = self.dram.reserve(key, length)
            if isinstance(entry, BlockEntry):
                return entry, self.dram.view(entry)
            raced = self.dram.acquire(key, touch=False)  # promoted or put meanwhile?
            if raced is not None:
                return self._dram_held(raced)
        if arena_only:
            return None
        return None, memoryview(bytearray(length))  # not promoted: DRAM is full of pinned blocks

    def _finish(
        self, slot: BlockEntry | None, view: memoryview, checksum: int | None, arena_only: bool
    ) -> HeldBlock | None:
        """Hand a block read from SSD to the reader; a promoted one is committed, still pinned for it.

        A block deleted (or evicted from SSD) during the read is served from a
        private copy, which is not in the arena: with ``arena_only``, None.
        """
        if slot is None:
            return None if checksum is None else HeldBlock(view, checksum, None)
        if checksum is None:
            self.dram.abort(slot)
            return None
        assert self.ssd is not None
        with self._delete_lock:
            if self.ssd.contains(slot.key):
                self.dram.commit(slot, checksum, keep_pin=True)
                return self._dram_held(slot)
        # deleted (or evicted from SSD) while read: serve this reader, keep no copy
        private = None if arena_only else memoryview(bytearray(view))
        self.dram.abort(slot)
        return None if private is None else HeldBlock(private, checksum, None)
