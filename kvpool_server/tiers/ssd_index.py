"""What the SSD tier stores where: the in-memory index over its segment log.

Each key maps to its newest record, compactly: a key table
(:class:`~kvpool_server.index.keys.KeyTable`) gives the key's block id, a column per
field by block id (:class:`~kvpool_server.index.locations.RecordLocations`) gives the
record's address, length and checksum, and per segment its records in log order
(:class:`~kvpool_server.index.runs.SegmentRecords`) let walks follow the log; about
120 bytes a record besides the key's bytes. Beside them: live and tombstone bytes
per segment (what compaction weighs), live bytes per namespace (quotas and metrics),
and the eviction order of block ids.

Why apart from :mod:`~kvpool_server.tiers.ssd`: the tier decides (when to evict,
which segment to compact, how to read and retry, what a disk error pauses) and does
the I/O; this module only keeps the books those decisions read and change, so every
structure that must agree with the others changes in one place (:meth:`SsdIndex.add`,
:meth:`SsdIndex.drop_block`, :meth:`SsdIndex.relocate`). No I/O and no lock of its own:
the tier's ``_lock`` guards every call (or the tier is still opening, with no threads).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvpool_server.eviction import EvictionPolicy
from kvpool_server.index import StoreKey
from kvpool_server.index.keys import KeyTable
from kvpool_server.index.locations import RecordLocations
from kvpool_server.index.runs import SegmentRecords
from kvpool_server.tiers.rebuild import Survivors
from kvpool_server.tiers.segment_files import ScanEntry
from kvpool_server.tiers.spans import RecordAddress


@dataclass(frozen=True, slots=True)
class IndexedRecord:
    """A snapshot of one indexed record, taken under the lock."""

    block: int
    location: RecordAddress
    checksum: int
    length: int


class SsdIndex:
    """The SSD tier's books: keys, where their records lie, and what each segment and namespace holds.

    Args:
        policy: the eviction order of block ids, kept in step with the key table.
    """

    def __init__(self, policy: EvictionPolicy) -> None:
        self.keys = KeyTable()  # key -> block id of its newest record
        self.records = RecordLocations()  # by block id
        self.policy = policy  # eviction order of block ids
        self.live: defaultdict[int, int] = defaultdict(int)  # segment -> live record bytes
        self.runs: defaultdict[int, SegmentRecords] = defaultdict(SegmentRecords)  # segment -> its records
        self.tombstones_in: defaultdict[int, set[StoreKey]] = defaultdict(set)
        self.tombstone_bytes: defaultdict[int, int] = defaultdict(int)  # segment -> tombstone record bytes
        self.namespace_bytes: defaultdict[str, int] = defaultdict(int)  # namespace -> live record bytes

    # -- filled at start --------------------------------------------------------

    def load(self, kept: Survivors) -> None:
        """Index the survivors of a replay as blocks 0..n-1, in log order (into an empty index)."""
        live = kept.records
        self.keys.load(live.namespaces, live.namespace_ids, live.hashes, live.hash_lens, live.digests)
        self.records.load(live.segments, live.offsets, live.sizes, live.payload_lens, live.payload_sums)
        blocks = np.arange(len(live), dtype=np.int64)
        bounds = np.flatnonzero(np.diff(live.segments)) + 1
        for members in np.split(blocks, bounds) if len(blocks) else ():
            segment = int(live.segments[members[0]])
            self.runs[segment] = SegmentRecords.of(live.offsets[members], members)
            self.live[segment] = int(live.sizes[members].sum())
        for number, total in enumerate(np.bincount(live.namespace_ids, weights=live.sizes).tolist()):
            if total:
                self.namespace_bytes[live.namespaces[number]] = int(total)
        self.policy.extend(blocks)
        for key, location in kept.tombstones:
            self.note_tombstone(key, location)

    def replay(self, scan: Iterable[ScanEntry]) -> None:
        """The rebuild one record at a time, in log order: what :meth:`load` does in bulk."""
        for found in scan:
            self.drop(found.key)
            if found.tombstone:
                self.note_tombstone(found.key, found.location)
            else:
                self.add(found.key, found.location, found.payload_len, found.checksum)

    # -- queries ----------------------------------------------------------------

    def get(self, key: StoreKey) -> IndexedRecord | None:
        block = self.keys.find(key)
        if block < 0:
            return None
        records = self.records
        return IndexedRecord(block, records.location(block), records.checksum[block], records.length[block])

    def ending_at(self, segment_id: int, offset: int) -> int:
        """The live block whose record ends exactly at ``offset`` of the segment, or -1."""
        run = self.runs.get(segment_id)
        if run is None:
            return -1
        position, block = run.before(offset)
        start, _ = run.entry(position)
        return block if block >= 0 and start + self.records.size[block] == offset else -1

    def nbytes(self) -> int:
        """Bytes held: key table, columns, per-segment runs and the eviction order (for benchmarks)."""
        runs = sum(run.nbytes() for run in self.runs.values())
        order = getattr(self.policy, "nbytes", lambda: 0)()
        return self.keys.nbytes() + self.records.nbytes() + runs + order

    # -- changes ----------------------------------------------------------------

    def add(self, key: StoreKey, location: RecordAddress, length: int, checksum: int, depth: int = 0) -> None:
        block = self.keys.insert(key)
        self.records.set(block, location, length, checksum)
        self._account(block)
        self.policy.insert(block, depth)

    def drop(self, key: StoreKey) -> bool:
        block = self.keys.find(key)
        if block < 0:
            return False
        self.drop_block(block)
        return True

    def drop_block(self, block: int) -> None:
        self._unaccount(block)
        self.policy.remove(block)
        self.keys.unmap(block)
        self.keys.release(block)

    def relocate(self, record: IndexedRecord, location: RecordAddress) -> None:
        """``record``'s bytes now lie at ``location`` (copied there by compaction)."""
        self._unaccount(record.block)
        self.records.set(record.block, location, record.length, record.checksum)
        self._account(record.block)

    def drop_segment(self, segment: int) -> None:
        """Forget a segment about to be deleted; its records still indexed (unreadable ones) go with it."""
        left = self.runs.get(segment)
        for block in left.live() if left is not None else ():  # unreadable (already counted): lost with it
            self.drop_block(block)
        self.runs.pop(segment, None)
        self.live.pop(segment, None)
        self.tombstones_in.pop(segment, None)
        self.tombstone_bytes.pop(segment, None)

    def note_tombstone(self, key: StoreKey, location: RecordAddress) -> None:
        self.tombstones_in[location.segment_id].add(key)
        self.tombstone_bytes[location.segment_id] += location.length

    def _account(self, block: int) -> None:
        records = self.records
        segment, size = records.segment[block], records.size[block]
        self.live[segment] += size
        self.runs[segment].append(records.offset[block], block)
        self.namespace_bytes[self.keys.namespace_of(block)] += size

    def _unaccount(self, block: int) -> None:
        records = self.records
        segment, size = records.segment[block], records.size[block]
        namespace = self.keys.namespace_of(block)
        self.live[segment] -= size
        run = self.runs.get(segment)
        if run is not None:
            run.kill(records.offset[block])
        self.namespace_bytes[namespace] -= size
        if not self.namespace_bytes[namespace]:
            del self.namespace_bytes[namespace]
