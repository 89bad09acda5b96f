"""The records of one log segment in log order: start offsets and block ids in two arrays.

The SSD tier walks records that lie back to back (read-ahead follows a reader
through the log, in both directions) and compaction copies a segment's live
records in log order. Records only ever join a segment at its end, so a sorted
array of start offsets is the whole map: 12 bytes a record, found by bisection.
A record that dies keeps its start with id -1, so walks stop at it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

import numpy as np

_DEAD = -1


class SegmentRecords:
    """The records ever indexed in one segment, oldest first."""

    __slots__ = ("_starts", "_ids")

    def __init__(self) -> None:
        self._starts = array("Q")
        self._ids = array("i")

    def append(self, offset: int, block: int) -> None:
        """Index a record at ``offset``, past every record here so far.

        Raises:
            ValueError: ``offset`` is not past the last record's start.
        """
        if self._starts and offset <= self._starts[-1]:
            raise ValueError(f"record at {offset} is not past the last one at {self._starts[-1]}")
        self._starts.append(offset)
        self._ids.append(block)

    @classmethod
    def of(cls, starts: np.ndarray, blocks: np.ndarray) -> SegmentRecords:
        """Records at ``starts`` (ascending) holding ``blocks`` (a rebuild at start)."""
        run = cls()
        run._starts = array("Q", starts.astype(np.uint64).tobytes())
        run._ids = array("i", blocks.astype(np.int32).tobytes())
        return run

    def kill(self, offset: int) -> None:
        """The record at ``offset`` is no longer live."""
        position = self._position(offset)
        if position >= 0:
            self._ids[position] = _DEAD

    def at(self, offset: int) -> tuple[int, int]:
        """(position, live block id) of the record starting at ``offset``; the id is -1 when none is live there."""
        position = self._position(offset)
        return position, self._ids[position] if position >= 0 else _DEAD

    def before(self, offset: int) -> tuple[int, int]:
        """(position, block id) of the last record starting below ``offset``; (-1, -1) when none."""
        position = bisect_left(self._starts, offset) - 1
        return position, self._ids[position] if position >= 0 else _DEAD

    def entry(self, position: int) -> tuple[int, int]:
        """(start, block id) at ``position``, or (-1, -1) past either end."""
        if 0 <= position < len(self._starts):
            return self._starts[position], self._ids[position]
        return _DEAD, _DEAD

    def live(self) -> list[int]:
        """Ids of the live records, in log order."""
        return [block for block in self._ids if block != _DEAD]

    def nbytes(self) -> int:
        return self._starts.itemsize * len(self._starts) + self._ids.itemsize * len(self._ids)

    def _position(self, offset: int) -> int:
        position = bisect_left(self._starts, offset)
        return position if position < len(self._starts) and self._starts[position] == offset else -1
