"""Slab allocator: offsets in a fixed arena, with one size class per block size.

An engine writes blocks of very few sizes (one per model and layout), so each
slab is dedicated to one slot size and holds as many slots as fit. Allocation and
free are O(1). A slab whose slots are all free goes back to the free pool, so a
size class that stops being used gives its memory back. This is pure bookkeeping:
no bytes are touched, which keeps it cheap to test exhaustively.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALIGNMENT = 4096


@dataclass(frozen=True, slots=True)
class Allocation:
    offset: int
    slot_size: int


@dataclass(slots=True)
class _Slab:
    slot_size: int = 0  # 0: in the free pool
    free_slots: list[int] = field(default_factory=list)  # slot indices
    used: int = 0


class SlabAllocator:
    """Carves ``capacity`` bytes into slabs of ``slab_size``, each split into equal slots.

    Args:
        capacity: arena size in bytes; the tail smaller than one slab is unused.
        slab_size: bytes per slab, a multiple of ``ALIGNMENT``; also the largest block.
    """

    def __init__(self, capacity: int, slab_size: int) -> None:
        if slab_size <= 0 or slab_size % ALIGNMENT:
            raise ValueError(f"slab_size must be a positive multiple of {ALIGNMENT}, got {slab_size}")
        if capacity < slab_size:
            raise ValueError(f"capacity {capacity} is smaller than one slab of {slab_size}")
        self.slab_size = slab_size
        self._slabs = [_Slab() for _ in range(capacity // slab_size)]
        self._free_slabs = list(range(len(self._slabs) - 1, -1, -1))  # pop() yields slab 0 first
        self._partial: dict[int, dict[int, None]] = {}  # slot size -> slabs with a free slot (ordered set)
        self.used_bytes = 0

    @property
    def capacity(self) -> int:
        return len(self._slabs) * self.slab_size

    @property
    def free_slab_count(self) -> int:
        return len(self._free_slabs)

    def slot_size_for(self, length: int) -> int:
        """The slot size a block of ``length`` bytes occupies.

        Raises:
            ValueError: ``length`` is not positive or exceeds one slab.
        """
        if not 0 < length <= self.slab_size:
            raise ValueError(f"block length {length} outside 1..{self.slab_size}")
        return -(-length // ALIGNMENT) * ALIGNMENT

    def allocate(self, length: int) -> Allocation | None:
        """Reserve a slot for ``length`` bytes; ``None`` when the arena has no room for it."""
        size = self.slot_size_for(length)
        partial = self._partial.setdefault(size, {})
        if partial:
            index = next(iter(partial))
        elif self._free_slabs:
            index = self._free_slabs.pop()
            self._assign(index, size)
            partial[index] = None
        else:
            return None
        slab = self._slabs[index]
        slot = slab.free_slots.pop()
        slab.used += 1
        if not slab.free_slots:
            del partial[index]
        self.used_bytes += size
        return Allocation(index * self.slab_size + slot * size, size)

    def free(self, offset: int) -> None:
        """Return the slot at ``offset``; its slab goes back to the pool once empty.

        Raises:
            ValueError: ``offset`` is not an allocated slot.
        """
        index, within = divmod(offset, self.slab_size)
        slab = self._slab_at(index)
        slot, misaligned = divmod(within, slab.slot_size or 1)
        in_tail = slab.slot_size and slot >= self.slab_size // slab.slot_size
        if not slab.slot_size or misaligned or in_tail or slot in slab.free_slots:
            raise ValueError(f"offset {offset} is not an allocated slot")
        slab.free_slots.append(slot)
        slab.used -= 1
        self.used_bytes -= slab.slot_size
        partial = self._partial[slab.slot_size]
        if slab.used:
            partial[index] = None
        else:
            partial.pop(index, None)
            slab.slot_size, slab.free_slots = 0, []
            self._free_slabs.append(index)

    def slab_of(self, offset: int) -> int:
        return offset // self.slab_size

    def slab_slot_size(self, index: int) -> int:
        """Slot size of slab ``index``, 0 when the slab is free."""
        return self._slab_at(index).slot_size

    def has_room(self, length: int) -> bool:
        """Whether :meth:`allocate` would succeed without eviction."""
        return bool(self._partial.get(self.slot_size_for(length))) or bool(self._free_slabs)

    def _assign(self, index: int, size: int) -> None:
        slab = self._slabs[index]
        slab.slot_size = size
        slab.free_slots = list(range(self.slab_size // size - 1, -1, -1))

    def _slab_at(self, index: int) -> _Slab:
        if not 0 <= index < len(self._slabs):
            raise ValueError(f"slab {index} outside the arena")
        return self._slabs[index]
