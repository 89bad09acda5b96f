"""The interface every eviction policy implements; all operations are O(1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np


class EvictionPolicy(Protocol):
    """Orders the evictable blocks of one size class, named by their index ids.

    The tier calls ``insert`` when a block becomes readable (with the block's depth
    in its prefix chain, 0 for a head or when unknown), ``touch`` on every hit,
    ``remove`` when it goes away for any reason. ``candidates`` yields ids in the
    order they should be evicted, lazily; the tier skips the ones it cannot evict
    (pinned) and must stop iterating before it removes any.
    """

    def insert(self, block: int, depth: int = 0) -> None: ...

    def extend(self, blocks: np.ndarray) -> None:
        """Insert ``blocks`` at depth 0 in order, as many ``insert`` calls would, faster where it can."""
        ...

    def touch(self, block: int) -> None: ...

    def remove(self, block: int) -> None: ...

    def candidates(self) -> Iterator[int]: ...

    def __len__(self) -> int: ...
