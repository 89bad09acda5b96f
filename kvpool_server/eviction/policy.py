"""The interface every eviction policy implements; all operations are O(1)."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Protocol


class EvictionPolicy(Protocol):
    """Orders the evictable blocks of one size class.

    The tier calls ``insert`` when a block becomes readable (with the block's depth
    in its prefix chain, 0 for a head or when unknown), ``touch`` on every hit,
    ``remove`` when it goes away for any reason. ``candidates`` yields keys in the
    order they should be evicted, lazily; the tier skips the ones it cannot evict
    (pinned) and must stop iterating before it removes any.
    """

    def insert(self, key: Hashable, depth: int = 0) -> None: ...

    def touch(self, key: Hashable) -> None: ...

    def remove(self, key: Hashable) -> None: ...

    def candidates(self) -> Iterator[Hashable]: ...

    def __len__(self) -> int: ...
