"""One index record per stored block, and its life cycle.

A block is ``WRITING`` from reservation until every byte has arrived and its
checksum is taken; only then ``COMPLETE`` and readable. A reader pins it; a
pinned block is never freed: eviction skips it and a delete only unlinks it, and
the last reader to release it returns its memory.

Records are columns indexed by the block's id (:class:`BlockRecords`), a few dozen
bytes a block; a :class:`BlockEntry` is a handle on one of them, handed to whoever
holds a pin and valid only while that pin is held.
"""

from __future__ import annotations

import enum
from array import array

StoreKey = tuple[str, bytes]
"""(namespace, block hash): how a daemon names a block."""


class BlockStatus(enum.Enum):
    WRITING = "writing"
    COMPLETE = "complete"


COMPLETE = 1  # every byte arrived and the checksum is taken
UNLINKED = 2  # gone from the index; memory freed on the last release


class BlockRecords:
    """What a DRAM tier knows about each block, one array per field, indexed by block id."""

    __slots__ = (
        "offset",
        "length",
        "slot_size",
        "checksum",
        "pins",
        "last_access",
        "depth",
        "flags",
        "read_ahead",
        "_columns",
    )

    def __init__(self) -> None:
        self.offset = array("Q")
        self.length = array("I")
        self.slot_size = array("I")
        self.checksum = array("Q")
        self.pins = array("I")
        self.last_access = array("Q")  # tier-wide tick, compares recency across size classes
        self.depth = array("I")  # position in its prefix chain, if the writer said (0: head or unknown)
        self.flags = array("B")  # COMPLETE, UNLINKED; changed under the tier's lock only
        self.read_ahead = array("B")  # read ahead from SSD and not yet read by a client (its own
        # column: the store sets it without the tier's lock, so it must not share a word with flags)
        self._columns = (
            self.offset,
            self.length,
            self.slot_size,
            self.checksum,
            self.pins,
            self.last_access,
            self.depth,
            self.flags,
            self.read_ahead,
        )

    def ensure(self, ident: int) -> None:
        """Make room for ``ident`` (ids come densely from a KeyTable, so this appends at most one)."""
        while len(self.flags) <= ident:
            for column in self._columns:
                column.append(0)

    def nbytes(self) -> int:
        return sum(column.itemsize * len(column) for column in self._columns)


class BlockEntry:
    """A pinned block: its id, its key, and its record's fields read live.

    Args:
        ident: the block's id in the tier's index.
        key: its key.
        records: the tier's columns.
    """

    __slots__ = ("ident", "key", "_records")

    def __init__(self, ident: int, key: StoreKey, records: BlockRecords) -> None:
        self.ident = ident
        self.key = key
        self._records = records

    @property
    def offset(self) -> int:
        return self._records.offset[self.ident]

    @property
    def length(self) -> int:
        return self._records.length[self.ident]

    @property
    def slot_size(self) -> int:
        return self._records.slot_size[self.ident]

    @property
    def checksum(self) -> int:
        return self._records.checksum[self.ident]

    @property
    def pins(self) -> int:
        return self._records.pins[self.ident]

    @property
    def depth(self) -> int:
        return self._records.depth[self.ident]

    @property
    def last_access(self) -> int:
        return self._records.last_access[self.ident]

    @property
    def status(self) -> BlockStatus:
        return BlockStatus.COMPLETE if self._records.flags[self.ident] & COMPLETE else BlockStatus.WRITING

    @property
    def unlinked(self) -> bool:
        return bool(self._records.flags[self.ident] & UNLINKED)

    @property
    def readable(self) -> bool:
        return self._records.flags[self.ident] & (COMPLETE | UNLINKED) == COMPLETE

    @property
    def read_ahead(self) -> bool:
        return bool(self._records.read_ahead[self.ident])

    @read_ahead.setter
    def read_ahead(self, value: bool) -> None:
        self._records.read_ahead[self.ident] = value

    def __repr__(self) -> str:
        return f"BlockEntry({self.ident}, {self.key!r}, {self.status.name}, pins={self.pins})"
