"""The DRAM tier: blocks in the shared arena, an index, and eviction when full.

Data-plane worker threads and the control plane share one tier, so every method
that reads or changes the index takes the tier's lock, for a few array operations.
The index is compact (:mod:`kvpool_server.index`): a key table, one record column
per field, intrusive eviction lists and a per-slab map of slot to block, about 150
bytes a block in all.
Readable blocks are also published in a fixed-size table in shared memory
(:mod:`kvpool_server.index.published`), where same-node clients find them without a
request; their reads come back as hit marks (:meth:`DramTier.touch_published`).
Byte transfers happen outside the lock, straight into or out of the
``memoryview`` slices this tier hands out, while the block is pinned.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable, Sequence
from itertools import count, islice, takewhile

import numpy as np
import xxhash

from kvpool_client.core.errors import ErrorCode
from kvpool_server.alloc.arena import SharedArena
from kvpool_server.alloc.generations import SlotGenerations
from kvpool_server.alloc.slab import Allocation, SlabAllocator
from kvpool_server.eviction import EvictionPolicy, LRUPolicy
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.index.entry import COMPLETE, UNLINKED, BlockRecords
from kvpool_server.index.keys import KeyTable
from kvpool_server.index.published import PublishedIndex
from kvpool_server.index.slots import SlabSlots
from kvpool_server.stats import Counters
from kvpool_server.tiers.quotas import GroupQuotas, QuotaGroup, quota_groups
from kvpool_server.tiers.usage import NamespaceUsage, TierUsage

# How many candidates per size class to weigh when a whole slab must be freed.
_SLAB_VICTIM_SCAN = 64
# How far down each class's order to look for a block of a namespace over its quota.
_QUOTA_VICTIM_SCAN = 4096
# Blocks refreshed from hit marks per hold of the lock.
_TOUCH_BATCH = 1024


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
        group_quotas: the other quotas a namespace's blocks count against (a tenant's, over
            the namespaces it writes); past one, that group's least recent blocks make room.
        published: the shared table same-node readers find blocks in without asking
            (needs ``generations``): a block is published once committed and
            withdrawn when unlinked.
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
        published: PublishedIndex | None = None,
        group_quotas: GroupQuotas | None = None,
    ) -> None:
        self._quota = namespace_quota
        self._group_quotas = group_quotas
        self._ns_bytes: Counter[str] = Counter()  # slot bytes per namespace, writing blocks included
        self._on_evict = on_evict
        self.generations = generations
        self._published = published if generations is not None else None
        self._arena = arena
        self._alloc = allocator
        self._counters = counters
        self._new_policy = policy_factory
        self._keys = KeyTable()  # key -> block id, for blocks not unlinked
        self._blocks = BlockRecords()  # by block id
        self._slots = SlabSlots(allocator.slab_size)
        self._handles: dict[int, BlockEntry] = {}  # pinned blocks: one handle each while pinned
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
            existing = self._keys.find(key)
            if existing >= 0:
                return ErrorCode.ALREADY_EXISTS if self._blocks.flags[existing] & COMPLETE else ErrorCode.BUSY
            # Victims are chosen first and evicted only for a reserve that then succeeds.
            groups = quota_groups(key[0], self._quota, self._group_quotas)
            victims = self._quota_victims(groups, self._alloc.slot_size_for(length))
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
            return self._add(key, allocation, length, depth)

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
        block, blocks = entry.ident, self._blocks
        # A block read ahead is published once a client read it through the daemon (see publish_read).
        shared = self._published is not None and not blocks.read_ahead[block]
        digest = self._published.digest(entry.key) if shared and self._published is not None else None
        with self._lock:
            blocks.checksum[block] = known_checksum
            blocks.flags[block] |= COMPLETE
            blocks.last_access[block] = next(self._ticks)
            self._policy(blocks.slot_size[block]).insert(block, blocks.depth[block])
            published = self._publish(block, digest) if digest is not None else True
            if not keep_pin:
                self._release_pin(block)
        self._counters.add("dram_blocks_written")
        if not published:
            self._counters.add("shared_index_skipped")

    def abort(self, entry: BlockEntry) -> None:
        """Drop a reservation whose bytes never fully arrived."""
        with self._lock:
            self._unlink(entry.ident)
            self._release_pin(entry.ident)

    # -- reads ----------------------------------------------------------------

    def acquire(self, key: StoreKey, *, touch: bool = True) -> BlockEntry | None:
        """Pin a readable block for a reader; ``None`` on a miss.

        Args:
            touch: a client read: count the hit or miss and refresh the block's
                recency. Internal copies (hand-off) pass False.
        """
        blocks = self._blocks
        with self._lock:
            block = self._keys.find(key)
            entry = None
            if block >= 0 and blocks.flags[block] & COMPLETE:
                blocks.pins[block] += 1
                if touch:
                    blocks.last_access[block] = next(self._ticks)
                    self._policies[blocks.slot_size[block]].touch(block)
                entry = self._handle(block, key)
        if touch:
            self._counters.add("dram_hits" if entry is not None else "dram_misses")
        return entry

    def refresh(self, entries: Iterable[BlockEntry]) -> None:
        """Make these readable (and pinned) blocks the most recent, the last one most of all."""
        with self._lock:
            for entry in entries:
                if entry.readable:
                    self._blocks.last_access[entry.ident] = next(self._ticks)
                    self._policies[entry.slot_size].touch(entry.ident)

    def publish_read(self, entries: Iterable[BlockEntry]) -> None:
        """Publish blocks read ahead from SSD that a client has now read through the daemon.

        They are held back from the shared index until then: a same-node client reading
        them there would go unseen by the read-ahead, which follows a client's reads of
        them to keep its stream going.
        """
        published = self._published
        if published is None:
            return
        digests = [(entry, published.digest(entry.key)) for entry in entries]
        skipped = 0
        with self._lock:
            for entry, digest in digests:
                if entry.readable and not published.holds(entry.ident):
                    skipped += not self._publish(entry.ident, digest)
        if skipped:
            self._counters.add("shared_index_skipped", skipped)

    def touch_published(self, entries: Sequence[int]) -> int:
        """Refresh the blocks in these published entries, in order: same-node clients read them
        through the shared index, which the daemon does not see (their hit marks say so).

        Returns:
            How many blocks were refreshed (entries withdrawn meanwhile are passed over).
        """
        if self._published is None:
            return 0
        touched, blocks = 0, self._blocks
        for start in range(0, len(entries), _TOUCH_BATCH):  # let puts and gets in between batches
            with self._lock:
                for index in entries[start : start + _TOUCH_BATCH]:
                    block = self._published.block_at(index)
                    if block >= 0 and blocks.flags[block] & (COMPLETE | UNLINKED) == COMPLETE:
                        blocks.last_access[block] = next(self._ticks)
                        self._policies[blocks.slot_size[block]].touch(block)
                        touched += 1
        return touched

    def release(self, entry: BlockEntry) -> None:
        """Unpin a block acquired for reading."""
        with self._lock:
            self._release_pin(entry.ident)

    def view(self, entry: BlockEntry) -> memoryview:
        """The block's bytes in the arena (writable while ``WRITING``)."""
        return self._arena.slice(entry.offset, entry.length)

    def generation(self, entry: BlockEntry) -> int:
        """The generation of ``entry``'s slot (0 without generations); stable while it is pinned."""
        return 0 if self.generations is None else self.generations.get(entry.offset)

    def contains(self, key: StoreKey) -> bool:
        with self._lock:
            block = self._keys.find(key)
            return block >= 0 and bool(self._blocks.flags[block] & COMPLETE)

    def pin_coldest(self, share: float, skip: Callable[[StoreKey], bool], limit: int) -> list[BlockEntry]:
        """Pin up to ``limit`` blocks among the coldest ``share`` of each size class.

        The demoter copies these to SSD ahead of eviction. Blocks for which ``skip``
        is true (already on SSD) and pinned blocks are passed over. Release each with
        :meth:`release`.
        """
        picked: list[BlockEntry] = []
        pins = self._blocks.pins
        with self._lock:
            for policy in self._policies.values():
                window = max(1, round(share * len(policy)))
                # At most a quarter of a class at once, so puts always find something to evict.
                room = max(1, len(policy) // 4)
                for block in islice(policy.candidates(), window):
                    key = self._keys.key_of(block)
                    if not pins[block] and not skip(key):
                        pins[block] += 1
                        picked.append(self._handle(block, key))
                        room -= 1
                        if len(picked) >= limit:
                            return picked
                        if not room:
                            break
        return picked

    def readable_keys(self) -> list[StoreKey]:
        """A snapshot of every readable block's key."""
        with self._lock:  # copies in bulk under the lock; the tuples are built after it
            ids = self._keys.mapped()
            batch = self._keys.export(ids[np.frombuffer(self._blocks.flags, dtype=np.uint8)[ids] & COMPLETE != 0])
        return batch.keys()

    def namespace_bytes(self) -> dict[str, int]:
        """Slot bytes per namespace, kept as blocks come and go (cheap: for every metrics scrape)."""
        with self._lock:
            return dict(self._ns_bytes)

    def namespace_usage(self) -> dict[str, NamespaceUsage]:
        """Readable blocks and their bytes per namespace (walks the index: an admin call)."""
        usage: defaultdict[str, NamespaceUsage] = defaultdict(NamespaceUsage)
        with self._lock:
            for block in self._keys.mapped_ids():
                if self._blocks.flags[block] & COMPLETE:
                    usage[self._keys.namespace_of(block)].add(self._blocks.length[block])
        return dict(usage)

    def prefix_hits(self, keys: Iterable[StoreKey]) -> int:
        """Number of leading ``keys`` stored and readable."""
        return sum(1 for _ in takewhile(self.contains, keys))

    def index_bytes(self) -> int:
        """Bytes the index holds: key table, records, slot map and eviction orders (for benchmarks)."""
        with self._lock:
            policies = sum(getattr(p, "nbytes", lambda: 0)() for p in self._policies.values())
            return self._keys.nbytes() + self._blocks.nbytes() + self._slots.nbytes() + policies

    # -- removal --------------------------------------------------------------

    def delete(self, key: StoreKey) -> bool:
        """Remove a readable block; a pinned one is freed by its last reader."""
        with self._lock:
            block = self._keys.find(key)
            if block < 0 or not self._blocks.flags[block] & COMPLETE:
                return False
            self._unlink(block)
            if not self._blocks.pins[block]:
                self._free(block)
        self._counters.add("dram_deletes")
        return True

    def discard_corrupt(self, entry: BlockEntry) -> None:
        """Unlink a block whose bytes no longer match its checksum."""
        with self._lock:
            if entry.unlinked:
                return
            self._unlink(entry.ident)
            if not entry.pins:
                self._free(entry.ident)
        self._counters.add("dram_corrupt_blocks")

    def usage(self) -> TierUsage:
        with self._lock:
            return TierUsage(self._alloc.capacity, self._alloc.used_bytes, len(self._keys))

    # -- internals ------------------------------------------------------------

    def _add(self, key: StoreKey, allocation: Allocation, length: int, depth: int) -> BlockEntry:
        block = self._keys.insert(key)
        blocks = self._blocks
        blocks.ensure(block)
        blocks.offset[block], blocks.length[block], blocks.slot_size[block] = (
            allocation.offset,
            length,
            allocation.slot_size,
        )
        blocks.checksum[block], blocks.last_access[block], blocks.depth[block] = 0, 0, depth
        blocks.pins[block], blocks.flags[block], blocks.read_ahead[block] = 1, 0, 0
        self._slots.set(allocation.offset, allocation.slot_size, block)
        self._ns_bytes[key[0]] += allocation.slot_size
        return self._handle(block, key)

    def _publish(self, block: int, digest: tuple[int, int]) -> bool:
        """Publish a just-committed block with its slot's current generation; False: no room in its window."""
        assert self._published is not None and self.generations is not None
        blocks = self._blocks
        offset = blocks.offset[block]
        return self._published.publish(
            block, digest, offset, blocks.length[block], blocks.checksum[block], self.generations.get(offset)
        )

    def _handle(self, block: int, key: StoreKey) -> BlockEntry:
        """The one handle of a pinned block (readers of the same block share it)."""
        entry = self._handles.get(block)
        if entry is None:
            entry = self._handles[block] = BlockEntry(block, key, self._blocks)
        return entry

    def _policy(self, slot_size: int) -> EvictionPolicy:
        policy = self._policies.get(slot_size)
        if policy is None:
            policy = self._policies[slot_size] = self._new_policy()
        return policy

    def _quota_victims(self, groups: Sequence[QuotaGroup], slot_size: int) -> list[int] | None:
        """The least recent blocks of each quota group whose eviction lets one more slot fit every quota.

        Returns:
            The victims, least recent first within each group (none needed: empty); None when
            a group's evictable blocks are not enough (the rest pinned or being written, or the
            slot exceeds its quota).
        """
        victims: dict[int, None] = {}
        for group in groups:
            if slot_size > group.limit:
                return None  # no eviction can make it fit: spare the look at every block
            held = group.held(self._ns_bytes)
            going = sum(self._blocks.slot_size[v] for v in victims if group.covers(self._keys.namespace_of(v)))
            excess = held - going + slot_size - group.limit
            while excess > 0:
                victim = self._oldest_of(group.covers, victims)
                if victim is None:
                    return None
                victims[victim] = None
                excess -= self._blocks.slot_size[victim]
        return list(victims)

    def _oldest_of(self, covers: Callable[[str], bool], taken: Container[int]) -> int | None:
        """The least recent evictable block of a namespace ``covers`` not in ``taken`` (a bounded
        look at each order)."""
        best: int | None = None
        blocks = self._blocks
        for policy in self._policies.values():
            for block in islice((c for c in policy.candidates() if c not in taken), _QUOTA_VICTIM_SCAN):
                if covers(self._keys.namespace_of(block)) and not blocks.pins[block]:
                    if best is None or blocks.last_access[block] < blocks.last_access[best]:
                        best = block
                    break
        return best

    def _room_after(self, victims: list[int], length: int) -> bool:
        """Whether a slot for ``length`` can be had once ``victims`` are gone (decided before evicting them).

        It can when the arena has room, a victim's slot fits it, the victims empty a whole
        slab, or eviction would find room anyway (see :meth:`_evict_for`).
        """
        size = self._alloc.slot_size_for(length)
        blocks = self._blocks
        if self._alloc.has_room(length) or any(blocks.slot_size[v] == size for v in victims):
            return True
        emptied = Counter(self._alloc.slab_of(blocks.offset[v]) for v in victims)
        if any(gone == len(self._slots.blocks_in(slab)) for slab, gone in emptied.items()):
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
        if slab is not None and (victim is None or slab[0] < self._blocks.last_access[victim]):
            for block in self._slots.blocks_in(slab[1]):
                self._evict(block)
            return True
        if victim is None:
            return False
        self._evict(victim)
        return True

    def _first_evictable(self, policy: EvictionPolicy | None) -> int | None:
        pins = self._blocks.pins
        for block in policy.candidates() if policy else ():
            if not pins[block]:
                return block
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
            for block in islice(policy.candidates(), _SLAB_VICTIM_SCAN):
                slab = self._alloc.slab_of(self._blocks.offset[block])
                newest = self._slab_newest_access(slab)
                if newest is not None:
                    if best is None or newest < best[0]:
                        best = (newest, slab)
                    break
        return best

    def _slab_newest_access(self, slab: int) -> int | None:
        """The most recent access of the slab's blocks; None if any is pinned or being written."""
        blocks = self._blocks
        members = self._slots.blocks_in(slab)
        if not all(blocks.flags[b] == COMPLETE and not blocks.pins[b] for b in members):
            return None
        return max(blocks.last_access[b] for b in members)

    def _evict(self, block: int) -> None:
        key = self._keys.key_of(block) if self._on_evict is not None else None
        self._unlink(block)
        self._free(block)
        self._counters.add("dram_evictions")
        if key is not None and self._on_evict is not None:
            self._on_evict(key)

    def _unlink(self, block: int) -> None:
        blocks = self._blocks
        flags = blocks.flags[block]
        if flags & UNLINKED:
            return
        self._keys.unmap(block)
        if self._published is not None:
            self._published.withdraw(block)
        policy = self._policies.get(blocks.slot_size[block])
        if policy is not None:
            policy.remove(block)
        if blocks.pins[block] and flags & COMPLETE and self.generations is not None:
            # Freed only when its last reader leaves; a same-node client holding its
            # location must see it gone now (an unpinned block is freed, and bumped, at once).
            self.generations.bump(blocks.offset[block])
        blocks.flags[block] = flags | UNLINKED

    def _release_pin(self, block: int) -> None:
        blocks = self._blocks
        blocks.pins[block] -= 1
        if not blocks.pins[block]:
            self._handles.pop(block, None)
            if blocks.flags[block] & UNLINKED:
                self._free(block)

    def _free(self, block: int) -> None:
        blocks = self._blocks
        offset, namespace = blocks.offset[block], self._keys.namespace_of(block)
        self._slots.clear(offset)
        self._ns_bytes[namespace] -= blocks.slot_size[block]
        if not self._ns_bytes[namespace]:
            del self._ns_bytes[namespace]
        if self.generations is not None:  # before the slot can be handed out again
            self.generations.bump(offset)
        self._alloc.free(offset)
        self._keys.release(block)
