"""Layout of a daemon's slot generations, shared by the daemon and same-node readers.

The daemon keeps one u64 per arena granule (:data:`GRANULE` bytes; every slot
starts on one) in its arena file, right after the blocks. It bumps the
counter of a slot's first granule whenever that slot is freed, before the memory
can be handed out again, and when a block is deleted or evicted while a reader
pins it (its free then waits). A reader that learned a block's generation, copied
the block, and then reads the same generation knows the block was neither removed
nor its slot reused since it learned it: reusing any byte of the slot needs the
slot freed first. Blocks never change once written, so a location learned once
stays good for as long as that generation holds.

Layout (little endian), at the offset server info announces::

    magic "KVPGEN01" | arena_id u64 | granule u64 | count u64 | zero padding to 64 bytes
    count * u64 generations (generation of the slot starting at granule i)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"KVPGEN01"
GRANULE = 4096  # the slab allocator's alignment: every slot offset is a multiple of it
HEADER_BYTES = 64  # keeps the counters 8-byte aligned (each load and store is atomic)
_HEADER = struct.Struct("<8sQQQ")


@dataclass(frozen=True, slots=True)
class GenerationsHeader:
    arena_id: int  # random per daemon start; LOCATE answers carry it too
    granule: int
    count: int

    @property
    def nbytes(self) -> int:
        """Bytes of the header and counters."""
        return HEADER_BYTES + 8 * self.count

    def index(self, offset: int) -> int:
        """The counter of the slot starting at ``offset``.

        Raises:
            ValueError: ``offset`` is not a granule boundary inside the arena.
        """
        index, rest = divmod(offset, self.granule)
        if rest or not 0 <= index < self.count:
            raise ValueError(f"offset {offset} is not a slot boundary of the arena")
        return index


def encode_header(header: GenerationsHeader) -> bytes:
    return _HEADER.pack(MAGIC, header.arena_id, header.granule, header.count).ljust(HEADER_BYTES, b"\0")


def decode_header(data: bytes | memoryview) -> GenerationsHeader:
    """Raises ValueError: not a generations header of this version."""
    if len(data) < HEADER_BYTES:
        raise ValueError(f"generations header is {len(data)} bytes, expected {HEADER_BYTES}")
    magic, arena_id, granule, count = _HEADER.unpack(bytes(data[: _HEADER.size]))
    if magic != MAGIC or granule <= 0:
        raise ValueError(f"not kvpool slot generations (magic {magic!r}, granule {granule})")
    return GenerationsHeader(arena_id, granule, count)
