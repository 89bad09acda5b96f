"""One index record per stored block, and its life cycle.

A block is ``WRITING`` from reservation until every byte has arrived and its
checksum is taken; only then ``COMPLETE`` and readable. A reader pins it; a
pinned block is never freed: eviction skips it and a delete only unlinks it, and
the last reader to release it returns its memory.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

StoreKey = tuple[str, bytes]
"""(namespace, block hash): how a daemon names a block."""


class BlockStatus(enum.Enum):
    WRITING = "writing"
    COMPLETE = "complete"


@dataclass(slots=True, eq=False)
class BlockEntry:
    key: StoreKey
    offset: int
    length: int
    slot_size: int
    status: BlockStatus = BlockStatus.WRITING
    checksum: int = 0
    pins: int = 0
    unlinked: bool = False  # gone from the index; memory freed on the last release
    last_access: int = 0  # tier-wide tick, compares recency across size classes
    depth: int = 0  # position in its prefix chain, if the writer said (0: head or unknown)
    read_ahead: bool = False  # read ahead from SSD and not yet read by a client

    @property
    def readable(self) -> bool:
        return self.status is BlockStatus.COMPLETE and not self.unlinked
