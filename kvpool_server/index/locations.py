"""Where each SSD block's record lies, one array per field, indexed by block id."""

from __future__ import annotations

from array import array

from kvpool_server.tiers.segments import Location


class RecordLocations:
    """Per block id: where its record is in the log, its payload length and checksum (32 bytes a block)."""

    __slots__ = ("segment", "offset", "size", "length", "checksum")

    def __init__(self) -> None:
        self.segment = array("I")
        self.offset = array("Q")
        self.size = array("I")  # record bytes: header, key and payload
        self.length = array("I")  # payload bytes
        self.checksum = array("Q")

    def set(self, block: int, location: Location, length: int, checksum: int) -> None:
        if block == len(self.segment):
            for column in (self.segment, self.offset, self.size, self.length, self.checksum):
                column.append(0)
        self.segment[block], self.offset[block], self.size[block] = location.segment_id, location.offset, location.length
        self.length[block], self.checksum[block] = length, checksum

    def location(self, block: int) -> Location:
        return Location(self.segment[block], self.offset[block], self.size[block])

    def nbytes(self) -> int:
        return sum(c.itemsize * len(c) for c in (self.segment, self.offset, self.size, self.length, self.checksum))
