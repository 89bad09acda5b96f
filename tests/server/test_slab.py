"""The slab allocator at tiny capacity: exact offsets, slab recycling, misuse, and a stateful model.

Sizes are in KiB so offsets read like the layout they describe: 4 slabs of 16 KiB,
slot 0 of slab 0 at offset 0, slot 1 at 4 KiB, ... slab 1 starting at 16 KiB.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpool_server.alloc.slab import ALIGNMENT, Allocation, SlabAllocator

KiB = 1024
SLAB = 16 * KiB
SLABS = 4


@pytest.fixture
def alloc() -> SlabAllocator:
    return SlabAllocator(SLABS * SLAB, SLAB)


def assert_no_leak(alloc: SlabAllocator, live: list[Allocation]) -> None:
    """Free what the test still holds; then every byte and every slab must be back."""
    for allocation in live:
        alloc.free(allocation.offset)
    slabs = alloc.capacity // alloc.slab_size
    assert alloc.used_bytes == 0, f"leak: {alloc.used_bytes} bytes still used"
    assert alloc.free_slab_count == slabs, f"leak: {alloc.free_slab_count} of {slabs} slabs free"
    assert all(alloc.slab_slot_size(i) == 0 for i in range(slabs)), [alloc.slab_slot_size(i) for i in range(slabs)]


def offsets(allocations: list[Allocation | None]) -> list[int | None]:
    return [a.offset if a is not None else None for a in allocations]


# -- construction and sizes ---------------------------------------------------------


def test_capacity_is_whole_slabs_and_the_tail_is_unused() -> None:
    alloc = SlabAllocator(4 * SLAB + 12 * KiB, SLAB)
    assert (alloc.capacity, alloc.free_slab_count, alloc.used_bytes) == (4 * SLAB, 4, 0)
    assert_no_leak(alloc, [])


@pytest.mark.parametrize(
    ("capacity", "slab_size"),
    [(64 * KiB, 0), (64 * KiB, -4096), (64 * KiB, 6 * KiB), (64 * KiB, 4097), (8 * KiB, 16 * KiB)],
)
def test_constructor_rejects_bad_geometry(capacity: int, slab_size: int) -> None:
    with pytest.raises(ValueError):
        SlabAllocator(capacity, slab_size)


@pytest.mark.parametrize(
    ("length", "slot"),
    [
        (1, 4 * KiB),
        (4 * KiB - 1, 4 * KiB),
        (4 * KiB, 4 * KiB),
        (4 * KiB + 1, 8 * KiB),
        (12 * KiB, 12 * KiB),
        (SLAB, SLAB),
    ],
)
def test_slot_size_rounds_up_to_the_alignment(alloc: SlabAllocator, length: int, slot: int) -> None:
    assert alloc.slot_size_for(length) == slot, alloc.slot_size_for(length)
    assert ALIGNMENT == 4096


@pytest.mark.parametrize("length", [0, -1, SLAB + 1, 10 * SLAB])
def test_slot_size_rejects_lengths_outside_one_slab(alloc: SlabAllocator, length: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        alloc.slot_size_for(length)
    with pytest.raises(ValueError):
        alloc.allocate(length)
    assert (alloc.used_bytes, alloc.free_slab_count) == (0, SLABS)


# -- exact layout -------------------------------------------------------------------


def test_exact_offsets_for_two_size_classes(alloc: SlabAllocator) -> None:
    small = [alloc.allocate(4 * KiB) for _ in range(5)]
    # Slab 0 is carved first, slot 0 first; the fifth 4 KiB block opens slab 1.
    assert offsets(small) == [0, 4 * KiB, 8 * KiB, 12 * KiB, 16 * KiB], offsets(small)
    assert all(a is not None and a.slot_size == 4 * KiB for a in small), small
    large = [alloc.allocate(8 * KiB) for _ in range(3)]
    # 8 KiB blocks get their own slabs (2 and 3), two slots each.
    assert offsets(large) == [32 * KiB, 40 * KiB, 48 * KiB], offsets(large)
    # A 4 KiB block goes back to the partial slab 1, not to slab 3 which has room for 8 KiB only.
    more = alloc.allocate(1)
    assert more == Allocation(20 * KiB, 4 * KiB), more
    assert [alloc.slab_slot_size(i) for i in range(SLABS)] == [4 * KiB, 4 * KiB, 8 * KiB, 8 * KiB]
    assert alloc.used_bytes == 6 * 4 * KiB + 3 * 8 * KiB, alloc.used_bytes
    assert alloc.free_slab_count == 0
    assert_no_leak(alloc, [a for a in [*small, *large, more] if a is not None])


def test_a_freed_slot_is_reused_first(alloc: SlabAllocator) -> None:
    held = [alloc.allocate(4 * KiB) for _ in range(3)]
    alloc.free(4 * KiB)
    again = alloc.allocate(4 * KiB)
    assert again == Allocation(4 * KiB, 4 * KiB), again
    assert alloc.used_bytes == 12 * KiB
    assert_no_leak(alloc, [a for a in held if a is not None])


def test_the_earliest_partial_slab_is_filled_first(alloc: SlabAllocator) -> None:
    held = [alloc.allocate(4 * KiB) for _ in range(5)]  # slab 0 full, slab 1 partial with one
    alloc.free(8 * KiB)  # slab 0 gets a hole; slab 1 became partial before it
    after = [alloc.allocate(4 * KiB) for _ in range(4)]
    # Slab 1's free slots come first (in slot order), then the hole in slab 0.
    assert offsets(after) == [20 * KiB, 24 * KiB, 28 * KiB, 8 * KiB], offsets(after)
    live = [a for a in held if a is not None and a.offset != 8 * KiB] + [a for a in after if a is not None]
    assert_no_leak(alloc, live)


def test_allocate_returns_none_when_full(alloc: SlabAllocator) -> None:
    held = [alloc.allocate(SLAB) for _ in range(SLABS)]
    assert offsets(held) == [0, 16 * KiB, 32 * KiB, 48 * KiB], offsets(held)
    assert alloc.allocate(SLAB) is None
    assert alloc.allocate(1) is None
    assert not alloc.has_room(1) and not alloc.has_room(SLAB)
    assert (alloc.used_bytes, alloc.free_slab_count) == (SLABS * SLAB, 0)
    assert_no_leak(alloc, [a for a in held if a is not None])


def test_has_room_reflects_partial_slabs_of_the_same_class_only(alloc: SlabAllocator) -> None:
    held = [alloc.allocate(4 * KiB) for _ in range(13)]  # slabs 0-2 full, slab 3 one of four used
    assert alloc.free_slab_count == 0
    assert alloc.has_room(4 * KiB)
    assert not alloc.has_room(8 * KiB), "slab 3 is a 4 KiB slab; an 8 KiB block needs a free slab"
    assert alloc.allocate(8 * KiB) is None
    assert_no_leak(alloc, [a for a in held if a is not None])


# -- slab recycling -----------------------------------------------------------------


def test_an_empty_slab_returns_to_the_pool_and_serves_another_size_class(alloc: SlabAllocator) -> None:
    small = [alloc.allocate(4 * KiB) for _ in range(4)]
    assert alloc.free_slab_count == SLABS - 1
    for a in small[:3]:
        alloc.free(a.offset)  # type: ignore[union-attr]
    assert alloc.free_slab_count == SLABS - 1, "a slab with one used slot must stay assigned"
    assert alloc.slab_slot_size(0) == 4 * KiB
    alloc.free(small[3].offset)  # type: ignore[union-attr]
    assert alloc.free_slab_count == SLABS, alloc.free_slab_count
    assert alloc.slab_slot_size(0) == 0
    # The freed slab is handed out next and now holds 8 KiB slots.
    big = [alloc.allocate(8 * KiB), alloc.allocate(8 * KiB)]
    assert offsets(big) == [0, 8 * KiB], offsets(big)
    assert alloc.slab_slot_size(0) == 8 * KiB
    assert_no_leak(alloc, [a for a in big if a is not None])


def test_a_full_arena_recovers_a_slab_for_another_class_once_one_empties(alloc: SlabAllocator) -> None:
    held = [alloc.allocate(4 * KiB) for _ in range(16)]
    assert alloc.allocate(12 * KiB) is None
    for a in held[4:8]:  # empty slab 1
        alloc.free(a.offset)  # type: ignore[union-attr]
    big = alloc.allocate(12 * KiB)
    assert big == Allocation(16 * KiB, 12 * KiB), big
    # A 12 KiB class fits one slot per 16 KiB slab: the slab is full already.
    assert alloc.allocate(12 * KiB) is None
    assert_no_leak(alloc, [a for a in held[:4] + held[8:] if a is not None] + [big])  # type: ignore[list-item]


# -- misuse -------------------------------------------------------------------------


def test_double_free_raises_and_changes_nothing(alloc: SlabAllocator) -> None:
    a, b = alloc.allocate(4 * KiB), alloc.allocate(4 * KiB)
    alloc.free(a.offset)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="not an allocated slot"):
        alloc.free(a.offset)  # type: ignore[union-attr]
    assert (alloc.used_bytes, alloc.free_slab_count) == (4 * KiB, SLABS - 1)
    alloc.free(b.offset)  # type: ignore[union-attr]
    # Now the whole slab is back in the pool: a second free of it is foreign too.
    with pytest.raises(ValueError):
        alloc.free(b.offset)  # type: ignore[union-attr]
    assert_no_leak(alloc, [])


@pytest.mark.parametrize(
    "offset",
    [
        16 * KiB,  # slab 1 is in the free pool
        4 * KiB,  # slab 0's slot 1 was never handed out
        2 * KiB,  # not on a slot boundary
        8 * KiB + 1,
        SLABS * SLAB,  # just past the arena
        100 * SLAB,
        -4 * KiB,
    ],
)
def test_foreign_offsets_raise(alloc: SlabAllocator, offset: int) -> None:
    held = alloc.allocate(4 * KiB)
    assert held == Allocation(0, 4 * KiB)
    with pytest.raises(ValueError):
        alloc.free(offset)
    assert (alloc.used_bytes, alloc.free_slab_count) == (4 * KiB, SLABS - 1), "a rejected free changed the state"
    assert_no_leak(alloc, [held])


def test_misaligned_offset_in_an_8k_slab_raises(alloc: SlabAllocator) -> None:
    held = alloc.allocate(8 * KiB)
    with pytest.raises(ValueError):
        alloc.free(4 * KiB)  # 4 KiB aligned, but not an 8 KiB slot boundary
    assert_no_leak(alloc, [held])  # type: ignore[list-item]


def test_offset_in_the_unused_tail_of_a_slab_raises(alloc: SlabAllocator) -> None:
    held = alloc.allocate(12 * KiB)  # one 12 KiB slot at 0; bytes 12..16 KiB of slab 0 are no slot
    assert held == Allocation(0, 12 * KiB)
    with pytest.raises(ValueError):
        alloc.free(12 * KiB)
    assert (alloc.used_bytes, alloc.slab_slot_size(0)) == (12 * KiB, 12 * KiB), (
        f"used_bytes={alloc.used_bytes}, slab 0 slot size={alloc.slab_slot_size(0)} with a live 12 KiB block in it"
    )


# -- stateful model -----------------------------------------------------------------

# 20 KiB slabs so that 8 KiB and 12 KiB slots leave an unused tail, plus a tail of arena.
M_SLAB = 20 * KiB
M_SLABS = 4
M_CAPACITY = M_SLABS * M_SLAB + 8 * KiB
M_LENGTHS = [1, 100, 4 * KiB, 4 * KiB + 1, 8 * KiB, 12 * KiB, 20 * KiB]


class SlabMachine(RuleBasedStateMachine):
    """Random allocate/free against a set of live allocations; the layout must stay sane."""

    def __init__(self) -> None:
        super().__init__()
        self.alloc = SlabAllocator(M_CAPACITY, M_SLAB)
        self.live: dict[int, int] = {}  # offset -> slot size

    @initialize()
    def starts_empty(self) -> None:
        state = (self.alloc.used_bytes, self.alloc.free_slab_count, self.alloc.capacity)
        assert state == (0, M_SLABS, M_SLABS * M_SLAB), state

    @rule(length=st.sampled_from(M_LENGTHS))
    def allocate(self, length: int) -> None:
        size = self.alloc.slot_size_for(length)
        predicted = self.alloc.has_room(length)
        got = self.alloc.allocate(length)
        assert (got is not None) == predicted, f"has_room said {predicted}, allocate gave {got}"
        event(f"allocate: {'full' if got is None else 'ok'}")
        if got is None:
            # Full for this class: no free slab and every slab of this size has all its slots used.
            assert self.alloc.free_slab_count == 0
            for slab in range(M_SLABS):
                if self.alloc.slab_slot_size(slab) == size:
                    used = sum(1 for o in self.live if o // M_SLAB == slab)
                    assert used == M_SLAB // size, f"slab {slab} has {used} of {M_SLAB // size} slots used, yet no room"
            return
        assert got.slot_size == size, got
        assert got.offset not in self.live, f"offset {got.offset} handed out twice"
        self.live[got.offset] = got.slot_size

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(sorted(self.live)))
        self.alloc.free(offset)
        del self.live[offset]

    @rule(offset=st.integers(0, M_CAPACITY // 1024 + 8).map(lambda k: k * 1024))
    def free_foreign(self, offset: int) -> None:
        if offset in self.live:
            return
        slab = offset // M_SLAB
        size = self.alloc.slab_slot_size(slab) if slab < M_SLABS else 0
        within = offset % M_SLAB
        if size and within % size == 0 and within // size >= M_SLAB // size:
            return  # the unused tail of a slab: a known bug, see test_offset_in_the_unused_tail_of_a_slab_raises
        before = (self.alloc.used_bytes, self.alloc.free_slab_count)
        try:
            self.alloc.free(offset)
        except ValueError:
            pass
        else:
            raise AssertionError(f"free({offset}) of a slot that is not live was accepted; live={sorted(self.live)}")
        assert (self.alloc.used_bytes, self.alloc.free_slab_count) == before

    @invariant()
    def layout_is_sane(self) -> None:
        spans = sorted((o, o + s) for o, s in self.live.items())
        for (a_start, a_end), (b_start, _) in itertools.pairwise(spans):
            assert a_end <= b_start, f"[{a_start}, {a_end}) overlaps an allocation at {b_start}"
        for start, end in spans:
            size = end - start
            assert start % ALIGNMENT == 0 and end <= self.alloc.capacity, (start, end)
            slab = start // M_SLAB
            assert (end - 1) // M_SLAB == slab, f"[{start}, {end}) straddles slabs"
            assert self.alloc.slab_slot_size(slab) == size, (slab, self.alloc.slab_slot_size(slab), size)
            assert (start - slab * M_SLAB) % size == 0, f"{start} is not on a {size}-byte slot boundary"

    @invariant()
    def accounting_matches(self) -> None:
        assert self.alloc.used_bytes == sum(self.live.values()), (self.alloc.used_bytes, self.live)
        occupied = {o // M_SLAB for o in self.live}
        assert self.alloc.free_slab_count == M_SLABS - len(occupied), (self.alloc.free_slab_count, sorted(occupied))
        for slab in range(M_SLABS):
            assert (self.alloc.slab_slot_size(slab) != 0) == (slab in occupied), slab

    def teardown(self) -> None:
        for offset in list(self.live):
            self.alloc.free(offset)
        assert (self.alloc.used_bytes, self.alloc.free_slab_count) == (0, M_SLABS), "freeing everything leaked"


SlabMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
test_slab_machine = SlabMachine.TestCase
