"""Least-recently-used order: one intrusive list over block ids (O(1) moves, 12 bytes a block)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from kvpool_server.index.lists import LinkedLists

_ORDER = 0


class LRUPolicy:
    """Evicts the block whose last insert or hit is the oldest."""

    __slots__ = ("_lists",)

    def __init__(self) -> None:
        self._lists = LinkedLists()

    def insert(self, block: int, depth: int = 0) -> None:  # depth plays no part in LRU
        self._lists.append(_ORDER, block)

    def extend(self, blocks: np.ndarray) -> None:
        """Insert ``blocks`` in order, as many :meth:`insert` calls would (a rebuild at start)."""
        self._lists.extend(_ORDER, blocks)

    def touch(self, block: int) -> None:
        self._lists.move_to_tail(block)

    def remove(self, block: int) -> None:
        self._lists.remove(block)

    def candidates(self) -> Iterator[int]:
        return self._lists.nodes(_ORDER)

    def __len__(self) -> int:
        return self._lists.size(_ORDER)
