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

``insert``, ``touch`` and ``remove`` are O(1). ``candidates`` is O(1) per key
yielded, after sorting an epoch's distinct depths when a new one appeared in it
(a chain's length bounds them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

_MIN_EPOCH_OPS = 16


@dataclass(slots=True)
class _Epoch:
    by_depth: dict[int, OrderedDict[Hashable, None]] = field(default_factory=dict)
    size: int = 0
    deepest_first: list[int] | None = None  # sorted depths; None when a depth was added

    def order(self) -> list[int]:
        if self.deepest_first is None:
            self.deepest_first = sorted(self.by_depth, reverse=True)
        return self.deepest_first


class PrefixAwarePolicy:
    """Evicts the deepest blocks of the oldest epoch first.

    Args:
        epoch_share: an epoch closes after this fraction of the held blocks'
            count in inserts and touches (at least 16).
    """

    __slots__ = ("_epochs", "_where", "_current", "_next_id", "_ops", "_share", "_size")

    def __init__(self, epoch_share: float = 0.125) -> None:
        if not 0 < epoch_share <= 1:
            raise ValueError("epoch_share must be in (0, 1]")
        self._share = epoch_share
        self._epochs: OrderedDict[int, _Epoch] = OrderedDict()  # oldest first
        self._where: dict[Hashable, tuple[int, int]] = {}  # key -> (epoch id, depth)
        self._next_id = 0
        self._current = self._open_epoch()
        self._ops = 0
        self._size = 0

    def insert(self, key: Hashable, depth: int = 0) -> None:
        self.remove(key)
        self._place(key, depth)
        self._size += 1

    def touch(self, key: Hashable) -> None:
        where = self._where.get(key)
        if where is None:
            return
        epoch_id, depth = where
        if epoch_id != self._current:
            self._take(key, epoch_id, depth)
            self._place(key, depth)
        else:
            self._epochs[epoch_id].by_depth[depth].move_to_end(key)
            self._tick()

    def remove(self, key: Hashable) -> None:
        where = self._where.pop(key, None)
        if where is not None:
            self._take(key, *where)
            self._size -= 1

    def candidates(self) -> Iterator[Hashable]:
        for epoch in self._epochs.values():
            for depth in epoch.order():
                yield from epoch.by_depth[depth]

    def __len__(self) -> int:
        return self._size

    # -- internals ------------------------------------------------------------

    def _place(self, key: Hashable, depth: int) -> None:
        epoch = self._epochs[self._current]
        keys = epoch.by_depth.get(depth)
        if keys is None:
            keys = epoch.by_depth[depth] = OrderedDict()
            epoch.deepest_first = None
        keys[key] = None
        epoch.size += 1
        self._where[key] = (self._current, depth)
        self._tick()

    def _take(self, key: Hashable, epoch_id: int, depth: int) -> None:
        epoch = self._epochs[epoch_id]
        keys = epoch.by_depth[depth]
        del keys[key]
        if not keys:
            del epoch.by_depth[depth]
            epoch.deepest_first = None
        epoch.size -= 1
        if not epoch.size and epoch_id != self._current:
            del self._epochs[epoch_id]

    def _tick(self) -> None:
        self._ops += 1
        if self._ops >= max(_MIN_EPOCH_OPS, int(self._share * self._size)):
            self._current = self._open_epoch()

    def _open_epoch(self) -> int:
        epoch_id = self._next_id
        self._next_id += 1
        self._epochs[epoch_id] = _Epoch()
        self._ops = 0
        return epoch_id
