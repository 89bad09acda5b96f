"""Least-recently-used order on an ordered dict (a C doubly linked list: O(1) moves)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator


class LRUPolicy:
    """Evicts the block whose last insert or hit is the oldest."""

    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order: OrderedDict[Hashable, None] = OrderedDict()

    def insert(self, key: Hashable, depth: int = 0) -> None:  # depth plays no part in LRU
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: Hashable) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def remove(self, key: Hashable) -> None:
        self._order.pop(key, None)

    def candidates(self) -> Iterator[Hashable]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)
