"""The DRAM tier over a real shared arena at tiny capacity.

64 KiB of arena in 16 KiB slabs: sixteen 4 KiB slots, so every offset and every
eviction can be asserted exactly. Each test ends with a leak check: once every pin
is released and every key deleted, the allocator must be back to empty.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence

import pytest
import xxhash
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpool_client.core.errors import ErrorCode
from kvpool_server.alloc.arena import SharedArena
from kvpool_server.alloc.slab import SlabAllocator
from kvpool_server.index import BlockEntry, BlockStatus, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import DramTier, checksum
from kvpool_server.tiers.usage import TierUsage

KiB = 1024
CAPACITY = 64 * KiB
SLAB = 16 * KiB
SLABS = CAPACITY // SLAB
NS = "model@fp16@L2@tp0of1"


def k(i: int, ns: str = NS) -> StoreKey:
    return (ns, b"key-%03d" % i)


def data_for(i: int, length: int = 4 * KiB) -> bytes:
    return random.Random(i).randbytes(length)


class Harness:
    """A tier plus the bookkeeping a test needs to drive it and to check for leaks."""

    def __init__(self, directory: str, name: str, capacity: int = CAPACITY, slab: int = SLAB, quota: int = 0) -> None:
        self.arena = SharedArena(directory, name, capacity, prefault=False)
        self.alloc = SlabAllocator(capacity, slab)
        self.counters = Counters()
        self.tier = DramTier(self.arena, self.alloc, self.counters, namespace_quota=quota)
        self.keys: set[StoreKey] = set()

    def write(self, entry: BlockEntry, data: bytes) -> None:
        with self.tier.view(entry) as view:
            view[:] = data

    def read(self, entry: BlockEntry) -> bytes:
        with self.tier.view(entry) as view:
            return bytes(view)

    def put(self, key: StoreKey, data: bytes) -> BlockEntry:
        """Reserve, write and commit; the test fails unless the reserve succeeds."""
        entry = self.reserve(key, len(data))
        self.write(entry, data)
        self.tier.commit(entry)
        return entry

    def reserve(self, key: StoreKey, length: int) -> BlockEntry:
        entry = self.tier.reserve(key, length)
        assert isinstance(entry, BlockEntry), f"reserve({key}, {length}) gave {entry!r}"
        self.keys.add(key)
        return entry

    def get(self, key: StoreKey) -> bytes | None:
        entry = self.tier.acquire(key)
        if entry is None:
            return None
        try:
            return self.read(entry)
        finally:
            self.tier.release(entry)

    def present(self, candidates: list[StoreKey]) -> list[StoreKey]:
        return [key for key in candidates if self.tier.contains(key)]

    def offset_of(self, key: StoreKey) -> int:
        entry = self.tier.acquire(key)
        assert entry is not None, f"{key} is not stored"
        self.tier.release(entry)
        return entry.offset

    def assert_no_leak(self, pinned: Sequence[BlockEntry] = ()) -> None:
        """Release ``pinned``, delete every key ever reserved; then nothing may stay allocated."""
        for entry in pinned:
            self.tier.release(entry)
        for key in self.keys:
            self.tier.delete(key)
        usage = self.tier.usage()
        assert usage == TierUsage(self.alloc.capacity, 0, 0), f"leak: {usage}"
        assert self.alloc.used_bytes == 0, f"leak: {self.alloc.used_bytes} bytes still allocated"
        slabs = self.alloc.capacity // self.alloc.slab_size
        assert self.alloc.free_slab_count == slabs, f"leak: {self.alloc.free_slab_count} of {slabs} slabs free"


@pytest.fixture
def make(tmp_path) -> Iterator:
    made: list[Harness] = []

    def factory(capacity: int = CAPACITY, slab: int = SLAB, quota: int = 0) -> Harness:
        harness = Harness(str(tmp_path), f"arena-{len(made)}", capacity, slab, quota)
        made.append(harness)
        return harness

    yield factory
    for harness in made:
        harness.arena.close()


@pytest.fixture
def h(make) -> Harness:
    return make()


def fill(h: Harness, count: int = 16, start: int = 0) -> None:
    for i in range(start, start + count):
        h.put(k(i), data_for(i))


# -- writes and reads ---------------------------------------------------------------


def test_put_get_roundtrip_at_exact_offsets(h: Harness) -> None:
    fill(h, 5)
    assert [h.offset_of(k(i)) for i in range(5)] == [0, 4 * KiB, 8 * KiB, 12 * KiB, 16 * KiB]
    for i in range(5):
        assert h.get(k(i)) == data_for(i), f"block {i} came back with other bytes"
    assert h.tier.usage() == TierUsage(CAPACITY, 5 * 4 * KiB, 5), h.tier.usage()
    h.assert_no_leak()


def test_view_covers_exactly_the_block_length(h: Harness) -> None:
    entry = h.reserve(k(0), 3000)
    assert (entry.length, entry.slot_size, entry.status, entry.pins) == (3000, 4 * KiB, BlockStatus.WRITING, 1)
    with h.tier.view(entry) as view:
        assert (len(view), view.readonly) == (3000, False), (len(view), view.readonly)
    h.write(entry, data_for(0, 3000))
    h.tier.commit(entry)
    assert (entry.status, entry.pins) == (BlockStatus.COMPLETE, 0), (entry.status, entry.pins)
    assert h.get(k(0)) == data_for(0, 3000)
    assert h.tier.usage().used_bytes == 4 * KiB, "a 3000-byte block occupies one 4 KiB slot"
    h.assert_no_leak()


def test_checksum_set_at_commit_is_xxh3_of_the_bytes(h: Harness) -> None:
    payload = data_for(7, 5000)
    entry = h.put(k(7), payload)
    expected = xxhash.xxh3_64_intdigest(payload)
    assert entry.checksum == expected == checksum(payload), (entry.checksum, expected)
    h.assert_no_leak()


def test_block_larger_than_a_slab_is_refused(h: Harness) -> None:
    assert h.tier.reserve(k(0), SLAB + 1) is ErrorCode.BLOCK_TOO_LARGE
    assert h.tier.usage() == TierUsage(CAPACITY, 0, 0), h.tier.usage()
    whole = h.put(k(0), data_for(0, SLAB))  # exactly one slab is the largest block
    assert whole.offset == 0 and h.alloc.slab_slot_size(0) == SLAB, whole
    assert h.get(k(0)) == data_for(0, SLAB)
    h.assert_no_leak()


# -- the write life cycle -----------------------------------------------------------


def test_a_block_being_written_is_invisible_and_busy(h: Harness) -> None:
    fill(h, 1)
    entry = h.reserve(k(1), 4 * KiB)
    h.write(entry, data_for(1))
    assert h.tier.acquire(k(1)) is None, "a WRITING block must not be readable"
    assert not h.tier.contains(k(1))
    assert h.tier.prefix_hits([k(0), k(1)]) == 1
    assert h.tier.reserve(k(1), 4 * KiB) is ErrorCode.BUSY
    assert h.tier.delete(k(1)) is False, "a delete must not remove a block being written"
    h.tier.commit(entry)
    assert h.tier.contains(k(1))
    assert h.tier.reserve(k(1), 4 * KiB) is ErrorCode.ALREADY_EXISTS
    assert h.get(k(1)) == data_for(1)
    assert h.counters.get("dram_misses") == 1 and h.counters.get("dram_hits") == 1, h.counters.snapshot()
    h.assert_no_leak()


def test_abort_frees_the_slot_and_the_key(h: Harness) -> None:
    entry = h.reserve(k(0), 4 * KiB)
    h.write(entry, data_for(0))
    assert h.tier.usage() == TierUsage(CAPACITY, 4 * KiB, 1), h.tier.usage()
    h.tier.abort(entry)
    assert h.tier.usage() == TierUsage(CAPACITY, 0, 0), h.tier.usage()
    assert not h.tier.contains(k(0)) and h.tier.acquire(k(0)) is None
    again = h.put(k(0), data_for(100))  # the key is free again, not BUSY
    assert again.offset == 0 and h.get(k(0)) == data_for(100), again
    assert h.counters.get("dram_blocks_written") == 1, h.counters.snapshot()
    h.assert_no_leak()


def test_blocks_being_written_are_never_evicted(h: Harness) -> None:
    writing = [h.reserve(k(i), 4 * KiB) for i in range(16)]
    assert h.tier.reserve(k(99), 4 * KiB) is ErrorCode.OUT_OF_SPACE
    assert h.tier.reserve(k(99), 8 * KiB) is ErrorCode.OUT_OF_SPACE
    assert h.counters.get("dram_evictions") == 0
    for entry in writing:
        h.tier.abort(entry)
    h.assert_no_leak()


# -- LRU eviction -------------------------------------------------------------------


def test_lru_eviction_order_is_exact(h: Harness) -> None:
    fill(h, 16)
    assert h.alloc.free_slab_count == 0 and h.tier.usage().used_bytes == CAPACITY
    for i in (0, 1):  # k0 and k1 become the most recently used
        assert h.get(k(i)) == data_for(i)
    h.put(k(16), data_for(16))
    h.put(k(17), data_for(17))
    everything = [k(i) for i in range(18)]
    gone = sorted(set(everything) - set(h.present(everything)))
    assert gone == [k(2), k(3)], f"evicted {gone}, expected the two least recently used"
    # The newcomers take the evicted blocks' slots.
    assert (h.offset_of(k(16)), h.offset_of(k(17))) == (8 * KiB, 12 * KiB)
    h.put(k(18), data_for(18))
    assert not h.tier.contains(k(4)), "k4 is now the least recently used"
    for key in h.present([*everything, k(18)]):
        assert h.get(key) == data_for(int(key[1][4:])), f"{key} holds other bytes after evictions"
    assert h.counters.get("dram_evictions") == 3, h.counters.snapshot()
    h.assert_no_leak()


def test_touching_in_a_different_order_changes_the_victims(h: Harness) -> None:
    fill(h, 16)
    for i in [5, 3, 0, 9, *range(10, 16), 1, 2, 4, 6, 7, 8]:
        h.get(k(i))
    fill(h, 4, start=16)
    gone = [i for i in range(16) if not h.tier.contains(k(i))]
    assert gone == [0, 3, 5, 9], f"evicted {gone}; LRU order was 5, 3, 0, 9, ..."
    h.assert_no_leak()


def test_pinned_blocks_are_skipped_by_eviction(h: Harness) -> None:
    fill(h, 16)
    pinned = [h.tier.acquire(k(0)), h.tier.acquire(k(2))]
    assert all(p is not None for p in pinned)
    fill(h, 3, start=16)
    gone = [i for i in range(16) if not h.tier.contains(k(i))]
    assert gone == [1, 3, 4], f"evicted {gone}; k0 and k2 are pinned (and were just touched)"
    # The pins hold even when they are the oldest.
    fill(h, 13, start=19)
    survivors = [i for i in range(32) if h.tier.contains(k(i))]
    assert survivors[:2] == [0, 2] and len(survivors) == 16, survivors
    assert [h.read(p) for p in pinned] == [data_for(0), data_for(2)]  # type: ignore[arg-type]
    h.assert_no_leak(pinned)  # type: ignore[arg-type]


def test_out_of_space_when_everything_is_pinned(h: Harness) -> None:
    fill(h, 16)
    pinned = [h.tier.acquire(k(i)) for i in range(16)]
    before = (h.tier.usage(), h.counters.get("dram_evictions"))
    assert h.tier.reserve(k(16), 4 * KiB) is ErrorCode.OUT_OF_SPACE
    assert h.tier.reserve(k(16), 8 * KiB) is ErrorCode.OUT_OF_SPACE
    assert (h.tier.usage(), h.counters.get("dram_evictions")) == before
    h.tier.release(pinned[5])  # one reader done: k5 is evictable again
    h.put(k(16), data_for(16))
    assert not h.tier.contains(k(5)) and h.offset_of(k(16)) == 5 * 4 * KiB
    h.assert_no_leak([p for i, p in enumerate(pinned) if i != 5])  # type: ignore[misc]


def test_a_block_pinned_twice_needs_two_releases(h: Harness) -> None:
    fill(h, 16)
    first, second = h.tier.acquire(k(0)), h.tier.acquire(k(0))
    assert first is second and first is not None and first.pins == 2
    h.tier.release(first)
    fill(h, 15, start=16)  # evicts k1..k15; k0 is still pinned once
    assert h.tier.contains(k(0))
    h.tier.release(second)  # type: ignore[arg-type]
    h.put(k(31), data_for(31))
    assert not h.tier.contains(k(0)), "k0 was the least recently used and unpinned"
    h.assert_no_leak()


# -- delete -------------------------------------------------------------------------


def test_delete_frees_an_unpinned_block(h: Harness) -> None:
    fill(h, 2)
    assert h.tier.delete(k(0)) is True
    assert h.tier.delete(k(0)) is False, "second delete"
    assert h.tier.delete(k(50)) is False, "unknown key"
    assert h.tier.usage() == TierUsage(CAPACITY, 4 * KiB, 1), h.tier.usage()
    h.put(k(2), data_for(2))
    assert h.offset_of(k(2)) == 0, "the deleted slot is reused"
    assert h.counters.get("dram_deletes") == 1, h.counters.snapshot()
    h.assert_no_leak()


def test_delete_of_a_pinned_block_unlinks_now_and_frees_on_release(h: Harness) -> None:
    fill(h, 16)
    reader = h.tier.acquire(k(3))
    assert reader is not None
    assert h.tier.delete(k(3)) is True
    assert not h.tier.contains(k(3)) and h.tier.acquire(k(3)) is None
    assert h.tier.usage() == TierUsage(CAPACITY, CAPACITY, 15), "the slot stays used while read"
    # Pressure does not touch the reader's slot: sixteen more puts cycle through the other 15.
    fill(h, 16, start=16)
    assert h.read(reader) == data_for(3), "bytes under a reader changed after delete"
    # The key can be stored anew, elsewhere, while the old copy is still being read.
    h.tier.delete(k(16 + 15))
    h.put(k(3), data_for(300))
    assert h.offset_of(k(3)) != reader.offset
    assert h.read(reader) == data_for(3) and h.get(k(3)) == data_for(300)
    used = h.alloc.used_bytes
    h.tier.release(reader)
    assert h.alloc.used_bytes == used - 4 * KiB, "the last release frees the unlinked slot"
    h.assert_no_leak()


# -- corruption ---------------------------------------------------------------------


def test_discard_corrupt_unlinks_and_the_reader_frees(h: Harness) -> None:
    fill(h, 2)
    entry = h.tier.acquire(k(1))
    assert entry is not None
    with h.tier.view(entry) as view:
        view[0] ^= 0xFF  # a bit flip in DRAM
    assert checksum(h.read(entry)) != entry.checksum
    h.tier.discard_corrupt(entry)
    h.tier.discard_corrupt(entry)  # a second reader finding it too counts once
    assert not h.tier.contains(k(1)) and h.tier.acquire(k(1)) is None
    assert h.counters.get("dram_corrupt_blocks") == 1, h.counters.snapshot()
    assert h.alloc.used_bytes == 8 * KiB, "still pinned: not freed yet"
    h.tier.release(entry)
    assert h.alloc.used_bytes == 4 * KiB, h.alloc.used_bytes
    h.put(k(1), data_for(1))  # stored again cleanly
    assert h.get(k(1)) == data_for(1)
    h.assert_no_leak()


def test_discard_corrupt_of_an_unpinned_block_frees_it(h: Harness) -> None:
    fill(h, 1)
    entry = h.tier.acquire(k(0))
    assert entry is not None
    h.tier.release(entry)  # e.g. a scrubber that found the mismatch after the read finished
    h.tier.discard_corrupt(entry)
    assert not h.tier.contains(k(0))
    assert h.alloc.used_bytes == 0, f"{h.alloc.used_bytes} bytes still allocated for a discarded, unpinned block"


# -- across size classes ------------------------------------------------------------


def test_new_size_class_reclaims_the_oldest_whole_slab(h: Harness) -> None:
    fill(h, 16)  # four 4 KiB slabs
    big = h.put(k(100), data_for(100, 8 * KiB))
    assert big.offset == 0, f"the 8 KiB block landed at {big.offset}, expected the reclaimed slab 0"
    gone = [i for i in range(16) if not h.tier.contains(k(i))]
    assert gone == [0, 1, 2, 3], f"evicted {gone}: slab 0 holds the oldest block"
    assert h.alloc.slab_slot_size(0) == 8 * KiB
    assert h.counters.get("dram_evictions") == 4, h.counters.snapshot()
    second = h.put(k(101), data_for(101, 8 * KiB))
    assert second.offset == 8 * KiB, "the second 8 KiB block shares the slab"
    assert h.get(k(100)) == data_for(100, 8 * KiB) and h.get(k(101)) == data_for(101, 8 * KiB)
    h.assert_no_leak()


def test_a_slab_with_a_pinned_block_is_not_reclaimed(h: Harness) -> None:
    fill(h, 16)
    pinned = h.tier.acquire(k(2))  # slab 0 is no longer whole-evictable
    assert pinned is not None
    big = h.put(k(100), data_for(100, 8 * KiB))
    assert big.offset == 16 * KiB, f"expected slab 1, got offset {big.offset}"
    gone = [i for i in range(16) if not h.tier.contains(k(i))]
    assert gone == [4, 5, 6, 7], gone
    h.assert_no_leak([pinned])


def test_a_slab_with_a_block_being_written_is_not_reclaimed(h: Harness) -> None:
    fill(h, 15)
    writing = h.reserve(k(15), 4 * KiB)  # slot 3 of slab 3
    for i in range(12):  # make slabs 0-2 recently used; slab 3 holds the oldest readable blocks
        h.get(k(i))
    big = h.put(k(100), data_for(100, 8 * KiB))
    assert big.offset == 0, f"slab 3 holds a WRITING block; expected slab 0, got offset {big.offset}"
    assert [i for i in range(15) if not h.tier.contains(k(i))] == [0, 1, 2, 3]
    h.tier.abort(writing)
    h.assert_no_leak()


def test_a_class_whose_own_oldest_is_older_evicts_within_itself(h: Harness) -> None:
    fill(h, 12)  # slabs 0-2 are 4 KiB
    a = h.put(k(100), data_for(100, 8 * KiB))  # free slab 3
    b = h.put(k(101), data_for(101, 8 * KiB))
    assert (a.offset, b.offset) == (48 * KiB, 56 * KiB)
    for i in range(12):  # every 4 KiB block is now more recent than k(100)
        h.get(k(i))
    c = h.put(k(102), data_for(102, 8 * KiB))
    assert c.offset == 48 * KiB and not h.tier.contains(k(100)), c
    assert all(h.tier.contains(k(i)) for i in range(12))
    h.assert_no_leak()


def test_a_class_takes_a_slab_whose_blocks_are_older_than_its_own(h: Harness) -> None:
    fill(h, 12)  # slabs 0-2 are 4 KiB, all older than the 8 KiB blocks below
    h.put(k(100), data_for(100, 8 * KiB))  # free slab 3
    h.put(k(101), data_for(101, 8 * KiB))
    c = h.put(k(102), data_for(102, 8 * KiB))
    # Slab 0's blocks are the oldest in the tier: the slab changes class.
    assert c.offset == 0, c
    gone = [i for i in range(12) if not h.tier.contains(k(i))]
    assert gone == [0, 1, 2, 3], gone
    assert h.tier.contains(k(100)) and h.tier.contains(k(101))
    h.assert_no_leak()


def test_no_room_for_a_new_class_when_every_slab_holds_a_pin(h: Harness) -> None:
    fill(h, 16)
    pins = [h.tier.acquire(k(i)) for i in (0, 4, 8, 12)]
    assert h.tier.reserve(k(100), 8 * KiB) is ErrorCode.OUT_OF_SPACE
    assert all(h.tier.contains(k(i)) for i in range(16)), "a failed reclaim must not evict anything"
    # The 4 KiB class still evicts its unpinned blocks.
    h.put(k(16), data_for(16))
    assert not h.tier.contains(k(1))
    h.assert_no_leak(pins)  # type: ignore[arg-type]


@pytest.mark.parametrize("length", [8 * KiB, 12 * KiB], ids=["own-block-pinned", "larger-than-the-quota"])
def test_a_reserve_refused_for_the_quota_evicts_nothing(make, length: int) -> None:
    h = make(quota=8 * KiB)
    h.put(k(0), data_for(0))
    h.put(k(1), data_for(1))
    pinned = h.tier.acquire(k(1))  # 8 KiB more needs both gone; 12 KiB never fits the quota
    assert h.tier.reserve(k(100), length) is ErrorCode.QUOTA_EXCEEDED
    assert h.present([k(0), k(1)]) == [k(0), k(1)], "a refused reserve must not evict its namespace's blocks"
    assert h.counters.get("dram_quota_evictions") == 0 and h.counters.get("dram_evictions") == 0
    h.assert_no_leak([pinned])  # type: ignore[list-item]


def test_quota_victims_stay_when_no_slot_can_be_had_for_the_new_block(make) -> None:
    h = make(quota=8 * KiB)
    h.put(k(0), data_for(0))  # slab 0 holds both of the namespace's blocks, beside two pinned ones
    h.put(k(1), data_for(1))
    others = [k(i, f"other-{i}") for i in range(2, 16)]  # one block per namespace: each within its quota
    for i, key in enumerate(others, start=2):
        h.put(key, data_for(i))
    pins = [h.tier.acquire(key) for key in others]  # no slab can change class
    assert h.tier.reserve(k(100), 8 * KiB) is ErrorCode.OUT_OF_SPACE
    assert h.present([k(0), k(1)]) == [k(0), k(1)], "evicted for a reserve that failed anyway"
    assert h.counters.get("dram_quota_evictions") == 0
    h.keys.update(others)
    h.assert_no_leak(pins)  # type: ignore[arg-type]


# -- lookups and counters -----------------------------------------------------------


def test_prefix_hits_counts_leading_readable_keys(h: Harness) -> None:
    fill(h, 4)
    h.tier.delete(k(2))
    assert h.tier.prefix_hits([k(0), k(1), k(2), k(3)]) == 2
    assert h.tier.prefix_hits([k(3), k(0)]) == 2
    assert h.tier.prefix_hits([]) == 0
    assert h.tier.prefix_hits([k(0, ns="other@ns"), k(0)]) == 0, "namespaces are part of the key"
    assert h.tier.prefix_hits(iter([k(0), k(1)])) == 2
    h.assert_no_leak()


def test_namespaces_keep_equal_hashes_apart(h: Harness) -> None:
    h.put(k(0), data_for(0))
    h.put(k(0, ns="other@ns"), data_for(1))
    assert h.get(k(0)) == data_for(0) and h.get(k(0, ns="other@ns")) == data_for(1)
    h.assert_no_leak()


def test_counters_and_usage(h: Harness) -> None:
    fill(h, 16)
    assert h.tier.usage() == TierUsage(CAPACITY, CAPACITY, 16)
    h.get(k(0))
    h.get(k(0))
    h.get(k(99))
    h.put(k(16), data_for(16))  # evicts k1
    h.get(k(1))
    h.tier.delete(k(2))
    snapshot = h.counters.snapshot()
    expected = {"dram_blocks_written": 17, "dram_hits": 2, "dram_misses": 2, "dram_evictions": 1, "dram_deletes": 1}
    assert snapshot == expected, snapshot
    assert h.tier.usage() == TierUsage(CAPACITY, CAPACITY - 4 * KiB, 15), h.tier.usage()
    h.assert_no_leak()


# -- stateful model -----------------------------------------------------------------

M_KEYS = [k(i) for i in range(16)] + [k(i, ns="b@ns") for i in range(4)]
# Weighted towards large blocks so that eviction, slab reclaim and OUT_OF_SPACE all happen.
M_LENGTHS = [100, 4 * KiB, 6 * KiB, 8 * KiB, 12 * KiB, 16 * KiB, 16 * KiB]


class TierMachine(RuleBasedStateMachine):
    """The tier against a dict: it may forget (evict) a block but never return wrong bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="kvpool-tier-")
        self.h = Harness(self.directory, "arena")
        self.model: dict[StoreKey, bytes] = {}  # last committed bytes of each key not deleted
        self.pins: list[tuple[BlockEntry, bytes]] = []
        self.writing: dict[StoreKey, tuple[BlockEntry, bytes]] = {}

    @property
    def tier(self) -> DramTier:
        return self.h.tier

    def _reserve(self, key: StoreKey, length: int) -> BlockEntry | None:
        evictions = self.h.counters.get("dram_evictions")
        result = self.tier.reserve(key, length)
        if self.h.counters.get("dram_evictions") - evictions > 1:
            event("reserve: reclaimed a whole slab of another size class")
        event(f"reserve: {'entry' if isinstance(result, BlockEntry) else result.name}")
        if isinstance(result, BlockEntry):
            assert key not in self.writing and not self.tier.contains(key), f"reserve of {key} should have failed"
            self.h.keys.add(key)
            return result
        if key in self.writing:
            assert result is ErrorCode.BUSY, result
        elif self.tier.contains(key):
            assert result is ErrorCode.ALREADY_EXISTS, result
        else:
            assert result is ErrorCode.OUT_OF_SPACE, result
            # Only pins and writes in progress can make everything unevictable.
            assert self.pins or self.writing, "OUT_OF_SPACE with nothing pinned and nothing being written"
        return None

    @initialize(lengths=st.lists(st.sampled_from(M_LENGTHS), min_size=4, max_size=len(M_KEYS)))
    def fill(self, lengths: list[int]) -> None:
        """Start near or past full, so that most steps run under eviction pressure."""
        for i, length in enumerate(lengths):
            self.put(M_KEYS[i], length, seed=i)

    @rule(key=st.sampled_from(M_KEYS), length=st.sampled_from(M_LENGTHS), seed=st.integers(0, 1 << 30))
    def put(self, key: StoreKey, length: int, seed: int) -> None:
        data = random.Random(seed).randbytes(length)
        entry = self._reserve(key, length)
        if entry is not None:
            self.h.write(entry, data)
            self.tier.commit(entry)
            self.model[key] = data

    @precondition(lambda self: len(self.writing) < 3)
    @rule(key=st.sampled_from(M_KEYS), length=st.sampled_from(M_LENGTHS), seed=st.integers(0, 1 << 30))
    def begin_write(self, key: StoreKey, length: int, seed: int) -> None:
        data = random.Random(seed).randbytes(length)
        entry = self._reserve(key, length)
        if entry is not None:
            self.h.write(entry, data)
            self.writing[key] = (entry, data)

    @precondition(lambda self: self.writing)
    @rule(data=st.data(), commit=st.booleans())
    def finish_write(self, data: st.DataObject, commit: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.writing)))
        entry, payload = self.writing.pop(key)
        if commit:
            self.tier.commit(entry)
            self.model[key] = payload
        else:
            self.tier.abort(entry)

    @rule(key=st.sampled_from(M_KEYS))
    def get(self, key: StoreKey) -> None:
        got = self.h.get(key)
        if got is None and key in self.model and key not in self.writing:
            event("get: evicted block is a miss")
        if got is not None:
            assert key in self.model, f"{key} readable but never committed (or deleted)"
            assert got == self.model[key], f"{key} returned other bytes than were committed"

    @precondition(lambda self: len(self.pins) < 6)
    @rule(key=st.sampled_from(M_KEYS))
    def pin(self, key: StoreKey) -> None:
        entry = self.tier.acquire(key)
        if entry is not None:
            self.pins.append((entry, self.model[key]))

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.pins) - 1))
        entry, expected = self.pins.pop(index)
        assert self.h.read(entry) == expected, "a pinned block's bytes changed"
        self.tier.release(entry)

    @rule(key=st.sampled_from(M_KEYS))
    def delete(self, key: StoreKey) -> None:
        was = self.tier.contains(key)
        assert self.tier.delete(key) is was, f"delete({key}) disagrees with contains={was}"
        assert not self.tier.contains(key)
        self.model.pop(key, None)

    @rule(order=st.permutations(M_KEYS))
    def read_everything(self, order: list[StoreKey]) -> None:
        for key in order:
            self.get(key)

    @invariant()
    def contained_keys_are_in_the_model(self) -> None:
        for key in M_KEYS:
            if self.tier.contains(key):
                assert key in self.model and key not in self.writing, key
        for entry, expected in self.pins:
            assert self.h.read(entry) == expected, f"pinned {entry.key} changed under its reader"

    @invariant()
    def usage_is_consistent(self) -> None:
        usage = self.tier.usage()
        stored = sum(self.tier.contains(key) for key in M_KEYS)
        assert usage.blocks == stored + len(self.writing), (usage, stored, len(self.writing))
        assert usage.used_bytes == self.h.alloc.used_bytes <= CAPACITY, usage
        assert usage.capacity_bytes == CAPACITY

    def teardown(self) -> None:
        try:
            for entry, _ in self.writing.values():
                self.tier.abort(entry)
            self.h.assert_no_leak([entry for entry, _ in self.pins])
        finally:
            try:
                self.h.arena.close()
            finally:
                shutil.rmtree(self.directory, ignore_errors=True)


TierMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_tier_machine = TierMachine.TestCase


def test_one_cold_block_does_not_doom_a_slab_of_hot_ones(h: Harness) -> None:
    fill(h, 12)  # slabs 0-2 hold 4 KiB blocks; k(0) is the coldest block of all
    h.put(k(100), data_for(100, 8 * KiB))  # free slab 3
    h.put(k(101), data_for(101, 8 * KiB))
    for i in (1, 2, 3):  # slab 0 is hot again, but for k(0)
        h.get(k(i))
    c = h.put(k(102), data_for(102, 8 * KiB))
    # Slab 0's newest block is more recent than k(100): the 8 KiB class evicts its own.
    assert c.offset == 48 * KiB and not h.tier.contains(k(100)), c
    assert all(h.tier.contains(k(i)) for i in range(12))
    h.assert_no_leak()
