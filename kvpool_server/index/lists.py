"""Doubly linked lists threaded through integer nodes, in flat arrays.

Eviction orders hold every block of a tier, so a Python object per block (an
ordered dict's node, a dataclass) costs more than the block's whole index entry
may. Here a node is an id from :class:`~kvpool_server.index.keys.KeyTable` and
costs three 32-bit words; append, move and remove are O(1). A node is in at most
one list at a time; lists are named by small integers.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np

_NONE = -1


class LinkedLists:
    """Any number of lists over one id space; a node belongs to at most one of them."""

    __slots__ = ("_prev", "_next", "_owner", "_heads", "_tails", "_sizes")

    def __init__(self) -> None:
        self._prev = array("i")
        self._next = array("i")
        self._owner = array("i")  # list of each node, -1 when in none
        self._heads: dict[int, int] = {}
        self._tails: dict[int, int] = {}
        self._sizes: dict[int, int] = {}

    def list_of(self, node: int) -> int:
        """The list holding ``node``, or -1."""
        return self._owner[node] if node < len(self._owner) else _NONE

    def size(self, lst: int) -> int:
        return self._sizes.get(lst, 0)

    def append(self, lst: int, node: int) -> None:
        """Put ``node`` at the tail of ``lst``, taking it out of any list it was in."""
        if node >= len(self._owner):
            self._grow(node)
        elif self._owner[node] != _NONE:
            self.remove(node)
        tail = self._tails.get(lst, _NONE)
        self._prev[node], self._next[node], self._owner[node] = tail, _NONE, lst
        if tail == _NONE:
            self._heads[lst] = node
        else:
            self._next[tail] = node
        self._tails[lst] = node
        self._sizes[lst] = self._sizes.get(lst, 0) + 1

    def move_to_tail(self, node: int) -> bool:
        """Move ``node`` to the tail of the list it is in (a hit); False when it is in none."""
        lst = self._owner[node] if node < len(self._owner) else _NONE
        if lst == _NONE:
            return False
        tail = self._tails[lst]
        if tail == node:
            return True
        prev, nxt = self._prev[node], self._next[node]  # nxt is a node: this one is not the tail
        if prev == _NONE:
            self._heads[lst] = nxt
        else:
            self._next[prev] = nxt
        self._prev[nxt] = prev
        self._next[tail], self._prev[node], self._next[node] = node, tail, _NONE
        self._tails[lst] = node
        return True

    def remove(self, node: int) -> int:
        """Take ``node`` out of its list; returns that list (-1: it was in none)."""
        lst = self.list_of(node)
        if lst == _NONE:
            return _NONE
        prev, nxt = self._prev[node], self._next[node]
        if prev == _NONE:
            self._heads[lst] = nxt
        else:
            self._next[prev] = nxt
        if nxt == _NONE:
            self._tails[lst] = prev
        else:
            self._prev[nxt] = prev
        self._owner[node] = _NONE
        self._sizes[lst] -= 1
        if not self._sizes[lst]:
            del self._heads[lst], self._tails[lst], self._sizes[lst]
        return lst

    def extend(self, lst: int, nodes: np.ndarray) -> None:
        """Append ``nodes``, in order, to the tail of ``lst``; none of them may be in a list.

        Raises:
            ValueError: a node is in a list already.
        """
        if not len(nodes):
            return
        nodes = nodes.astype(np.int32)
        if int(nodes.max()) >= len(self._owner):
            self._grow(int(nodes.max()))
        owner = np.frombuffer(self._owner, dtype=np.int32)
        if (owner[nodes] != _NONE).any():
            raise ValueError("extend() takes nodes in no list")
        tail = self._tails.get(lst, _NONE)
        np.frombuffer(self._prev, dtype=np.int32)[nodes] = np.concatenate(([tail], nodes[:-1]))
        np.frombuffer(self._next, dtype=np.int32)[nodes] = np.concatenate((nodes[1:], [_NONE]))
        owner[nodes] = lst
        del owner  # the arrays may grow again: no view may outlive this call
        if tail == _NONE:
            self._heads[lst] = int(nodes[0])
        else:
            self._next[tail] = int(nodes[0])
        self._tails[lst] = int(nodes[-1])
        self._sizes[lst] = self._sizes.get(lst, 0) + len(nodes)

    def nodes(self, lst: int) -> Iterator[int]:
        """``lst`` from head to tail; the list must not change while this is consumed."""
        node = self._heads.get(lst, _NONE)
        nxt = self._next
        while node != _NONE:
            yield node
            node = nxt[node]

    def nbytes(self) -> int:
        return sum(a.itemsize * len(a) for a in (self._prev, self._next, self._owner))

    def _grow(self, node: int) -> None:
        more = max(node + 1 - len(self._owner), len(self._owner) // 2, 64)
        filler = array("i", [_NONE]) * more
        for column in (self._prev, self._next, self._owner):
            column.extend(filler)
