"""Prefix-aware eviction: among blocks of about the same age, a chain's tail goes first.

A block at depth ``d`` of a prefix chain is useful only while the ``d`` blocks
before it are stored too; its head is useful on its own. Plain LRU gets this
wrong after every turn of a conversation: the new tail was written last, so LRU
keeps it and evicts the older head, leaving a tail nobody can reach.

Recency is kept coarse, in epochs: an epoch closes after a number of inserts and
hits proportional to the blocks held (``epoch_share``), so blocks used in the
same stretch of traffic count as equally recent. Eviction takes the oldest epoch
first and, within it, the deepest blocks first, oldest first among equal depths.
A head touched long ago still leaves before a fresh tail: age decides across
epochs, depth within one.

Blocks are ids threaded through one set of intrusive lists, one list per
(epoch, depth): 12 bytes a block. ``insert``, ``touch`` and ``remove`` are O(1).
``candidates`` is O(1) per block yielded, after sorting an epoch's distinct depths
when a new one appeared in it (a chain's length bounds them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count

import numpy as np

from kvpool_server.index.lists import LinkedLists

_MIN_EPOCH_OPS = 16


@dataclass(slots=True)
class _Epoch:
    lists: dict[int, int] = field(default_factory=dict)  # depth -> list of its blocks, oldest first
    size: int = 0
    deepest_first: list[int] | None = None  # sorted depths; None when a depth was added

    def order(self) -> list[int]:
        if self.deepest_first is None:
            self.deepest_first = sorted(self.lists, reverse=True)
        return self.deepest_first


class PrefixAwarePolicy:
    """Evicts the deepest blocks of the oldest epoch first.

    Args:
        epoch_share: an epoch closes after this fraction of the held blocks'
            count in inserts and touches (at least 16).
    """

    __slots__ = ("_epochs", "_lists", "_buckets", "_list_ids", "_current", "_next_epoch", "_ops", "_share", "_size")

    def __init__(self, epoch_share: float = 0.125) -> None:
        if not 0 < epoch_share <= 1:
            raise ValueError("epoch_share must be in (0, 1]")
        self._share = epoch_share
        self._epochs: OrderedDict[int, _Epoch] = OrderedDict()  # oldest first
        self._lists = LinkedLists()  # one list per (epoch, depth) holding blocks
        self._buckets: dict[int, tuple[int, int]] = {}  # list -> (epoch id, depth)
        self._list_ids = count()
        self._next_epoch = count()
        self._current = self._open_epoch()
        self._ops = 0
        self._size = 0

    def insert(self, block: int, depth: int = 0) -> None:
        self.remove(block)
        self._place(block, depth)
        self._size += 1

    def extend(self, blocks: np.ndarray) -> None:
        """Insert ``blocks`` at depth 0, in order (a rebuild at start), one by one: epochs close as they go."""
        for block in blocks.tolist():
            self.insert(block)

    def touch(self, block: int) -> None:
        lst = self._lists.list_of(block)
        if lst < 0:
            return
        epoch_id, depth = self._buckets[lst]
        if epoch_id != self._current:
            self._take(block)
            self._place(block, depth)
        else:
            self._lists.move_to_tail(block)
            self._tick()

    def remove(self, block: int) -> None:
        if self._lists.list_of(block) >= 0:
            self._take(block)
            self._size -= 1

    def candidates(self) -> Iterator[int]:
        for epoch in self._epochs.values():
            for depth in epoch.order():
                yield from self._lists.nodes(epoch.lists[depth])

    def __len__(self) -> int:
        return self._size

    # -- internals ------------------------------------------------------------

    def _place(self, block: int, depth: int) -> None:
        epoch = self._epochs[self._current]
        lst = epoch.lists.get(depth)
        if lst is None:
            lst = epoch.lists[depth] = next(self._list_ids)
            self._buckets[lst] = (self._current, depth)
            epoch.deepest_first = None
        self._lists.append(lst, block)
        epoch.size += 1
        self._tick()

    def _take(self, block: int) -> None:
        lst = self._lists.remove(block)
        epoch_id, depth = self._buckets[lst]
        epoch = self._epochs[epoch_id]
        if not self._lists.size(lst):
            del epoch.lists[depth], self._buckets[lst]
            epoch.deepest_first = None
        epoch.size -= 1
        if not epoch.size and epoch_id != self._current:
            del self._epochs[epoch_id]

    def _tick(self) -> None:
        self._ops += 1
        if self._ops >= max(_MIN_EPOCH_OPS, int(self._share * self._size)):
            self._current = self._open_epoch()

    def _open_epoch(self) -> int:
        epoch_id = next(self._next_epoch)
        self._epochs[epoch_id] = _Epoch()
        self._ops = 0
        return epoch_id
