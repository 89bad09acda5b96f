"""Where each SSD block's record lies, one array per field, indexed by block id."""

from __future__ import annotations

from array import array

import numpy as np

from kvpool_server.tiers.spans import RecordAddress


class RecordLocations:
    """Per block id: where its record is in the log, its payload length and checksum (32 bytes a block)."""

    __slots__ = ("segment", "offset", "size", "length", "checksum")

    def __init__(self) -> None:
        self.segment = array("I")
        self.offset = array("Q")
        self.size = array("I")  # record bytes: header, key and payload
        self.length = array("I")  # payload bytes
        self.checksum = array("Q")

    def set(self, block: int, location: RecordAddress, length: int, checksum: int) -> None:
        if block == len(self.segment):
            for column in (self.segment, self.offset, self.size, self.length, self.checksum):
                column.append(0)
        self.segment[block], self.offset[block], self.size[block] = (
            location.segment_id,
            location.offset,
            location.length,
        )
        self.length[block], self.checksum[block] = length, checksum

    def load(
        self, segments: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, lengths: np.ndarray, checksums: np.ndarray
    ) -> None:
        """Take these columns as blocks 0..n-1 (a rebuild at start, into empty columns)."""
        if len(self.segment):
            raise ValueError("load() fills empty columns only")
        for column, values, dtype in (
            (self.segment, segments, np.uint32),
            (self.offset, offsets, np.uint64),
            (self.size, sizes, np.uint32),
            (self.length, lengths, np.uint32),
            (self.checksum, checksums, np.uint64),
        ):
            column.frombytes(values.astype(dtype).tobytes())

    def location(self, block: int) -> RecordAddress:
        return RecordAddress(self.segment[block], self.offset[block], self.size[block])

    def nbytes(self) -> int:
        return sum(c.itemsize * len(c) for c in (self.segment, self.offset, self.size, self.length, self.checksum))
