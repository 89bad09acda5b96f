"""Which block id sits in each slot of each slab: 4 bytes a slot, for slab-wide eviction."""

from __future__ import annotations

from array import array

_NONE = -1


class SlabSlots:
    """Slot-to-block map over a slab allocator's arena.

    Args:
        slab_size: bytes per slab.
    """

    __slots__ = ("_slab_size", "_slabs")

    def __init__(self, slab_size: int) -> None:
        self._slab_size = slab_size
        self._slabs: dict[int, tuple[int, array[int]]] = {}  # slab -> (slot size, block id per slot)

    def set(self, offset: int, slot_size: int, block: int) -> None:
        slab, within = divmod(offset, self._slab_size)
        sized = self._slabs.get(slab)
        if sized is None or sized[0] != slot_size:  # a slab freed and given to another size class
            sized = self._slabs[slab] = (slot_size, array("i", [_NONE]) * (self._slab_size // slot_size))
        sized[1][within // slot_size] = block

    def clear(self, offset: int) -> None:
        slab, within = divmod(offset, self._slab_size)
        slot_size, blocks = self._slabs[slab]
        blocks[within // slot_size] = _NONE

    def blocks_in(self, slab: int) -> list[int]:
        """Ids of the blocks in ``slab``'s slots, in slot order."""
        sized = self._slabs.get(slab)
        return [] if sized is None else [block for block in sized[1] if block != _NONE]

    def nbytes(self) -> int:
        return sum(blocks.itemsize * len(blocks) for _, blocks in self._slabs.values())
