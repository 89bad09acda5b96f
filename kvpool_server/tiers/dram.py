"""The DRAM tier: blocks in the shared arena, an index, and eviction when full.

Data-plane worker threads and the control plane share one tier, so every method
that changes state takes the tier's lock, for a few dictionary operations only;
``contains`` and ``view`` are single reads, atomic under the GIL.
Byte transfers happen outside the lock, straight into or out of the
``memoryview`` slices this tier hands out, while the block is pinned.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable
import threading
from itertools import count, islice, takewhile

import xxhash

from kvpool_client.errors import ErrorCode
from kvpool_server.alloc.arena import SharedArena
from kvpool_server.alloc.generations import SlotGenerations
from kvpool_server.alloc.slab import Allocation, SlabAllocator
from kvpool_server.eviction import EvictionPolicy, LRUPolicy
from kvpool_server.index import BlockEntry, BlockStatus, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.usage import NamespaceUsage, TierUsage

# How many candidates per size class to weigh when a whole slab must be freed.
_SLAB_VICTIM_SCAN = 64
# How far down each class's order to look for a block of a namespace over its quota.
_QUOTA_VICTIM_SCAN = 4096


def checksum(data: memoryview | bytes) -> int:
    """The per-block checksum: xxh3-64, about memcpy speed."""
    return xxhash.xxh3_64_intdigest(data)


class DramTier:
    """Blocks in one shared-memory arena with an index and per-size-class eviction.

    Args:
        arena: where block bytes live.
        allocator: slot bookkeeping over ``arena``.
        counters: where hits, misses and evictions are counted (``dram_*``).
        policy_factory: builds the eviction order for each size class.
        on_evict: told the key of every evicted block, under the tier's lock (keep it cheap).
        generations: slot generations for same-node readers, bumped on every free and
            when a pinned block is unlinked (its free waits for the last reader).
        namespace_quota: most slot bytes one namespace may hold (0: no quota); past
            it, the namespace's own least recent blocks make room.
    """

    def __init__(
        self,
        arena: SharedArena,
        allocator: SlabAllocator,
        counters: Counters,
        policy_factory: Callable[[], EvictionPolicy] = LRUPolicy,
        on_evict: Callable[[StoreKey], None] | None = None,
        generations: SlotGenerations | None = None,
        namespace_quota: int = 0,
    ) -> None:
        self._quota = namespace_quota
        self._ns_bytes: Counter[str] = Counter()  # slot bytes per namespace, writing blocks included
        self._on_evict = on_evict
        self.generations = generations
        self._arena = arena
        self._alloc = allocator
        self._counters = counters
        self._new_policy = policy_factory
        self._index: dict[StoreKey, BlockEntry] = {}
        self._by_offset: dict[int, BlockEntry] = {}
        self._policies: dict[int, EvictionPolicy] = {}  # slot size -> order of readable blocks
        self._ticks = count(1)
        self._lock = threading.Lock()

    # -- writes ---------------------------------------------------------------

    def reserve(self, key: StoreKey, length: int, depth: int = 0) -> BlockEntry | ErrorCode:
        """Reserve room for a new block, evicting if needed; a refused reserve evicts nothing.

        Args:
            depth: the block's position in its prefix chain, for the eviction policy.

        Returns:
            A ``WRITING`` entry whose :meth:`view` receives the bytes, or a status:
            ``ALREADY_EXISTS`` (stored: put-if-absent), ``BUSY`` (another writer),
            ``INVALID_ARGUMENT`` (an empty block), ``BLOCK_TOO_LARGE``, ``OUT_OF_SPACE``
            (everything evictable is pinned),
            ``QUOTA_EXCEEDED`` (the namespace's evictable blocks cannot make room for it
            within its quota).
        """
        if length <= 0:
            return ErrorCode.INVALID_ARGUMENT
        if length > self._alloc.slab_size:
            return ErrorCode.BLOCK_TOO_LARGE
        with self._lock:
            existing = self._index.get(key)
            if existing is not None:
                return ErrorCode.ALREADY_EXISTS if existing.readable else ErrorCode.BUSY
            # Victims are chosen first and evicted only for a reserve that then succeeds.
            victims = self._quota_victims(key[0], self._alloc.slot_size_for(length))
            if victims is None:
                return ErrorCode.QUOTA_EXCEEDED
            if victims and not self._room_after(victims, length):
                return ErrorCode.OUT_OF_SPACE
            for victim in victims:
                self._evict(victim)
                self._counters.add("dram_quota_evictions")
            allocation = self._allocate(length)
            if allocation is None:
                return ErrorCode.OUT_OF_SPACE
            entry = BlockEntry(key, allocation.offset, length, allocation.slot_size, pins=1, depth=depth)
            self._index[key] = self._by_offset[entry.offset] = entry
            self._ns_bytes[key[0]] += entry.slot_size
            return entry

    def slot_size(self, length: int) -> int | None:
        """The slot a block of ``length`` bytes would take; None where :meth:`reserve` refuses the length."""
        return self._alloc.slot_size_for(length) if 0 < length <= self._alloc.slab_size else None

    def commit(self, entry: BlockEntry, known_checksum: int | None = None, *, keep_pin: bool = False) -> None:
        """Make a fully written block readable and let eviction see it.

        Args:
            known_checksum: the bytes' checksum, already verified by the caller (a
                promotion from SSD); otherwise it is computed here.
            keep_pin: the writer goes on reading the block: its pin becomes a
                reader's, released with :meth:`release`.
        """
        if known_checksum is None:  # outside the lock: the writer owns the slot
            known_checksum = checksum(self.view(entry))
        entry.checksum = known_checksum
        with self._lock:
            entry.status = BlockStatus.COMPLETE
            entry.last_access = next(self._ticks)
            self._policy(entry.slot_size).insert(entry.key, entry.depth)
            if not keep_pin:
                self._release_pin(entry)
        self._counters.add("dram_blocks_written")

    def abort(self, entry: BlockEntry) -> None:
        """Drop a reservation whose bytes never fully arrived."""
        with self._lock:
            self._unlink(entry)
            self._release_pin(entry)

    # -- reads ----------------------------------------------------------------

    def acquire(self, key: StoreKey, *, touch: bool = True) -> BlockEntry | None:
        """Pin a readable block for a reader; ``None`` on a miss.

        Args:
            touch: a client read: count the hit or miss and refresh the block's
                recency. Internal copies (hand-off) pass False.
        """
        with self._lock:
            entry = self._index.get(key)
            if entry is not None and entry.readable:
                entry.pins += 1
                if touch:
                    entry.last_access = next(self._ticks)
                    self._policies[entry.slot_size].touch(key)
            else:
                entry = None
        if touch:
            self._counters.add("dram_hits" if entry is not None else "dram_misses")
        return entry

    def refresh(self, entries: Iterable[BlockEntry]) -> None:
        """Make these readable blocks the most recent, the last one most of all."""
        with self._lock:
            for entry in entries:
                if entry.readable and self._index.get(entry.key) is entry:
                    entry.last_access = next(self._ticks)
                    self._policies[entry.slot_size].touch(entry.key)

    def release(self, entry: BlockEntry) -> None:
        """Unpin a block acquired for reading."""
        with self._lock:
            self._release_pin(entry)

    def view(self, entry: BlockEntry) -> memoryview:
        """The block's bytes in the arena (writable while ``WRITING``)."""
        return self._arena.slice(entry.offset, entry.length)

    def generation(self, entry: BlockEntry) -> int:
        """The generation of ``entry``'s slot (0 without generations); stable while it is pinned."""
        return 0 if self.generations is None else self.generations.get(entry.offset)

    def contains(self, key: StoreKey) -> bool:
        entry = self._index.get(key)  # one dict read: atomic under the GIL
        return entry is not None and entry.readable

    def pin_coldest(self, share: float, skip: Callable[[StoreKey], bool], limit: int) -> list[BlockEntry]:
        """Pin up to ``limit`` blocks among the coldest ``share`` of each size class.

        The demoter copies these to SSD ahead of eviction. Blocks for which ``skip``
        is true (already on SSD) and pinned blocks are passed over. Release each with
        :meth:`release`.
        """
        picked: list[BlockEntry] = []
        with self._lock:
            for policy in self._policies.values():
                window = max(1, round(share * len(policy)))
                # At most a quarter of a class at once, so puts always find something to evict.
                room = max(1, len(policy) // 4)
                for key in islice(policy.candidates(), window):
                    entry = self._index[key]
                    if not entry.pins and not skip(key):
                        entry.pins += 1
                        picked.append(entry)
                        room -= 1
                        if len(picked) >= limit:
                            return picked
                        if not room:
                            break
        return picked

    def readable_keys(self) -> list[StoreKey]:
        """A snapshot of every readable block's key."""
        with self._lock:
            return [key for key, entry in self._index.items() if entry.readable]

    def namespace_bytes(self) -> dict[str, int]:
        """Slot bytes per namespace, kept as blocks come and go (cheap: for every metrics scrape)."""
        with self._lock:
            return dict(self._ns_bytes)

    def namespace_usage(self) -> dict[str, NamespaceUsage]:
        """Readable blocks and their bytes per namespace (walks the index: an admin call)."""
        usage: defaultdict[str, NamespaceUsage] = defaultdict(NamespaceUsage)
        with self._lock:
            for (namespace, _), entry in self._index.items():
                if entry.readable:
                    usage[namespace].add(entry.length)
        return dict(usage)

    def prefix_hits(self, keys: Iterable[StoreKey]) -> int:
        """Number of leading ``keys`` stored and readable."""
        return sum(1 for _ in takewhile(self.contains, keys))

    # -- removal --------------------------------------------------------------

    def delete(self, key: StoreKey) -> bool:
        """Remove a readable block; a pinned one is freed by its last reader."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or not entry.readable:
                return False
            self._unlink(entry)
            if not entry.pins:
                self._free(entry)
        self._counters.add("dram_deletes")
        return True

    def discard_corrupt(self, entry: BlockEntry) -> None:
        """Unlink a block whose bytes no longer match its checksum."""
        with self._lock:
            if entry.unlinked:
                return
            self._unlink(entry)
            if not entry.pins:
                self._free(entry)
        self._counters.add("dram_corrupt_blocks")

    def usage(self) -> TierUsage:
        with self._lock:
            return TierUsage(self._alloc.capacity, self._alloc.used_bytes, len(self._index))

    # -- internals ------------------------------------------------------------

    def _policy(self, slot_size: int) -> EvictionPolicy:
        policy = self._policies.get(slot_size)
        if policy is None:
            policy = self._policies[slot_size] = self._new_policy()
        return policy

    def _quota_victims(self, namespace: str, slot_size: int) -> list[BlockEntry] | None:
        """The namespace's least recent blocks whose eviction lets one more slot fit its quota.

        Returns:
            The victims, least recent first (none needed: empty); None when its evictable
            blocks are not enough (the rest pinned or being written, or the slot exceeds the quota).
        """
        if self._quota and slot_size > self._quota:
            return None  # no eviction can make it fit: spare the look at every block
        excess = self._ns_bytes[namespace] + slot_size - self._quota if self._quota else 0
        victims: dict[StoreKey, BlockEntry] = {}
        while excess > 0:
            victim = self._oldest_of(namespace, victims)
            if victim is None:
                return None
            victims[victim.key] = victim
            excess -= victim.slot_size
        return list(victims.values())

    def _oldest_of(self, namespace: str, taken: Container[StoreKey]) -> BlockEntry | None:
        """The least recent evictable block of ``namespace`` not in ``taken`` (a bounded look at each order)."""
        best: BlockEntry | None = None
        for policy in self._policies.values():
            for key in islice((c for c in policy.candidates() if c not in taken), _QUOTA_VICTIM_SCAN):
                entry = self._index[key]
                if key[0] == namespace and not entry.pins:
                    if best is None or entry.last_access < best.last_access:
                        best = entry
                    break
        return best

    def _room_after(self, victims: list[BlockEntry], length: int) -> bool:
        """Whether a slot for ``length`` can be had once ``victims`` are gone (decided before evicting them).

        It can when the arena has room, a victim's slot fits it, the victims empty a whole
        slab, or eviction would find room anyway (see :meth:`_evict_for`).
        """
        size = self._alloc.slot_size_for(length)
        if self._alloc.has_room(length) or any(v.slot_size == size for v in victims):
            return True
        emptied = Counter(self._alloc.slab_of(v.offset) for v in victims)
        if any(gone == len(self._entries_in_slab(slab)) for slab, gone in emptied.items()):
            return True
        evictable = self._first_evictable(self._policies.get(size))
        return evictable is not None or self._oldest_evictable_slab(exclude=size) is not None

    def _allocate(self, length: int) -> Allocation | None:
        allocation = self._alloc.allocate(length)
        while allocation is None and self._evict_for(self._alloc.slot_size_for(length)):
            allocation = self._alloc.allocate(length)
        return allocation

    def _evict_for(self, slot_size: int) -> bool:
        """Free room for one slot of ``slot_size``; False when nothing can go.

        Evicts the class's own least recent block, unless another size class holds
        an evictable slab whose blocks are older still: then that whole slab changes
        class, so a block size in demand can grow at the expense of a cold one.
        """
        victim = self._first_evictable(self._policies.get(slot_size))
        slab = self._oldest_evictable_slab(exclude=slot_size)
        if slab is not None and (victim is None or slab[0] < victim.last_access):
            for entry in self._entries_in_slab(slab[1]):
                self._evict(entry)
            return True
        if victim is None:
            return False
        self._evict(victim)
        return True

    def _first_evictable(self, policy: EvictionPolicy | None) -> BlockEntry | None:
        for key in policy.candidates() if policy else ():
            entry = self._index[key]
            if not entry.pins:
                return entry
        return None

    def _oldest_evictable_slab(self, exclude: int) -> tuple[int, int] | None:
        """(newest access, slab) of the coldest fully evictable slab of another size class.

        A slab is as recent as its most recently used block: taking it evicts them all,
        so one cold block must not doom a slab of hot ones. Each class offers the slab
        of its least recent block (a bounded look at its order) as the candidate.
        """
        best: tuple[int, int] | None = None
        for size, policy in self._policies.items():
            if size == exclude:
                continue
            for key in islice(policy.candidates(), _SLAB_VICTIM_SCAN):
                slab = self._alloc.slab_of(self._index[key].offset)
                newest = self._slab_newest_access(slab)
                if newest is not None:
                    if best is None or newest < best[0]:
                        best = (newest, slab)
                    break
        return best

    def _slab_newest_access(self, slab: int) -> int | None:
        """The most recent access of the slab's blocks; None if any is pinned or being written."""
        entries = self._entries_in_slab(slab)
        if not all(e.readable and not e.pins for e in entries):
            return None
        return max(e.last_access for e in entries)

    def _entries_in_slab(self, slab: int) -> list[BlockEntry]:
        size = self._alloc.slab_slot_size(slab)
        start = slab * self._alloc.slab_size
        offsets = range(start, start + self._alloc.slab_size - size + 1, size) if size else ()
        return [self._by_offset[o] for o in offsets if o in self._by_offset]

    def _evict(self, entry: BlockEntry) -> None:
        self._unlink(entry)
        self._free(entry)
        self._counters.add("dram_evictions")
        if self._on_evict is not None:
            self._on_evict(entry.key)

    def _unlink(self, entry: BlockEntry) -> None:
        if self._index.get(entry.key) is entry:
            del self._index[entry.key]
        policy = self._policies.get(entry.slot_size)
        if policy is not None:
            policy.remove(entry.key)
        if entry.pins and entry.readable and self.generations is not None:
            # Freed only when its last reader leaves; a same-node client holding its
            # location must see it gone now (an unpinned block is freed, and bumped, at once).
            self.generations.bump(entry.offset)
        entry.unlinked = True

    def _release_pin(self, entry: BlockEntry) -> None:
        entry.pins -= 1
        if entry.unlinked and not entry.pins:
            self._free(entry)

    def _free(self, entry: BlockEntry) -> None:
        del self._by_offset[entry.offset]
        self._ns_bytes[entry.key[0]] -= entry.slot_size
        if not self._ns_bytes[entry.key[0]]:
            del self._ns_bytes[entry.key[0]]
        if self.generations is not None:  # before the slot can be handed out again
            self.generations.bump(entry.offset)
        self._alloc.free(entry.offset)
