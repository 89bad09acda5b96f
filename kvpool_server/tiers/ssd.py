"""The SSD tier: blocks demoted from DRAM, kept in a :class:`SegmentLog` on local disk.

An in-memory index (:class:`~kvpool_server.tiers.ssd_index.SsdIndex`) maps each key
to its newest record and keeps what each segment and namespace holds. Space is
managed in two steps, both inside :meth:`SsdTier.write` when a record would not fit:

- eviction drops the least valuable key from the index (its bytes turn dead);
- compaction copies the live records of the sealed segment with the least live
  bytes to the log's head and deletes the segment, which returns its bytes.

Bytes on disk never exceed ``capacity``: appends stop one segment short of it, the
room a compaction needs for the records it copies before it deletes a segment.

A delete removes the key from the index at once and leaves a tombstone record, so
a restart does not resurrect it. A tombstone is copied forward by compaction
until its segment is the oldest one (nothing older is left for it to hide), so
until then it counts as live when choosing what to compact: a segment of
tombstones only would otherwise be copied forward forever, freeing nothing.

A disk error pauses writes for ``retry_after_error_s``; a compaction that cannot
copy a record forward keeps its segment, so no stored block is lost to it.

Blocking: every method except ``contains``, ``length_of``, ``location_of``,
``log_range``, ``keys_between``, ``keys_before``, ``touch``, ``keys``, ``usage``,
``failure`` and ``forget`` does file I/O: call it from a thread, never an event
loop. ``_lock`` guards the index (array operations only); ``_write_lock`` makes one
writer at a time (appends, eviction, compaction). Reads run beside writes: a read
that loses its segment to compaction retries at the record's new location.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice

from kvpool_server.eviction import EvictionPolicy, LRUPolicy
from kvpool_server.index import StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.quotas import GroupQuotas, quota_groups
from kvpool_server.tiers.read_streams import Stretch
from kvpool_server.tiers.rebuild import DigestCollision, release_free_memory, survivors
from kvpool_server.tiers.records import HEADER_SIZE, CorruptRecord, RecordFlags
from kvpool_server.tiers.segments import SegmentLog, SegmentMissing
from kvpool_server.tiers.spans import RecordAddress, plan_spans
from kvpool_server.tiers.ssd_index import IndexedRecord, SsdIndex
from kvpool_server.tiers.usage import NamespaceUsage, TierUsage

log = logging.getLogger("kvpool.ssd")

_READ_RETRIES = 3  # a record can move at most this often while one read runs
SEGMENT_STRIDE = 1 << 48  # log positions per segment (see log_range): more than any segment's bytes
_QUOTA_VICTIM_SCAN = 4096  # how far down the eviction order to look for a namespace over its quota


@dataclass(frozen=True, slots=True)
class SsdConfig:
    directory: str
    capacity: int  # bytes of segment files, compaction headroom included
    segment_size: int
    fsync: bool
    gc_live_ratio: float = 0.5  # compact a sealed segment whose live share falls below this
    retry_after_error_s: float = 10.0  # pause writes this long after a disk error
    namespace_quota: int = 0  # most record bytes one namespace may hold here; 0: no quota


def record_size(key: StoreKey, payload_len: int) -> int:
    """Bytes one record of ``key`` takes on disk."""
    return HEADER_SIZE + len(key[0].encode()) + len(key[1]) + payload_len


class SsdTier:
    """Blocks in segment files with an index, LRU (or any policy) eviction and compaction.

    Args:
        config: directory, capacity and segment settings.
        counters: where ``ssd_*`` events are counted.
        policy_factory: the eviction order of keys.

    Raises:
        OSError: the directory cannot be created or a segment opened.
    """

    def __init__(
        self,
        config: SsdConfig,
        counters: Counters,
        policy_factory: Callable[[], EvictionPolicy] = LRUPolicy,
        group_quotas: GroupQuotas | None = None,
    ) -> None:
        if config.capacity < 3 * config.segment_size:
            # one segment of compaction headroom, plus room to seal a full active
            # segment and start the next (with two, a full first segment is stuck)
            raise ValueError("SSD capacity must hold at least three segments")
        self._config = config
        self._group_quotas = group_quotas  # a tenant's quota over the namespaces it writes, besides each namespace's
        self._counters = counters
        self._budget = config.capacity - config.segment_size  # a segment's room for compaction
        self._log = SegmentLog(config.directory, config.segment_size, config.fsync)
        self._index = SsdIndex(policy_factory())
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._failure: str | None = None
        self._failed_at = 0.0
        self._rebuild()

    def close(self) -> None:
        with self._write_lock:
            self._log.close()

    # -- start: rebuild the index ----------------------------------------------

    def _rebuild(self) -> None:
        """Replay every record in log order: the newest record of a key wins (decided in bulk)."""
        started = time.monotonic()
        try:
            kept = survivors(self._log.scan_columns(), self._index.keys)
        except DigestCollision as exc:
            log.warning("SSD index rebuilt record by record", extra={"reason": str(exc)})
            self._index = SsdIndex(self._index.policy)  # the key table the bulk pass filled, emptied
            self._index.replay(self._log.scan())
        else:
            self._index.load(kept)
            self._counters.add("ssd_corrupt_blocks", kept.undecodable)
            del kept
            release_free_memory()  # the rebuild's temporaries: hundreds of MiB at 10M records
        stats = self._log.stats()
        self._counters.add("ssd_corrupt_blocks", stats.corrupt_records)
        log.info(
            "SSD tier opened",
            extra={
                "directory": self._config.directory,
                "blocks": len(self._index.keys),
                "segments": stats.segments,
                "corrupt_records": stats.corrupt_records,
                "torn_bytes": stats.truncated_bytes,
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    # -- no I/O ---------------------------------------------------------------

    def contains(self, key: StoreKey) -> bool:
        with self._lock:
            return self._index.keys.find(key) >= 0

    def length_of(self, key: StoreKey) -> int | None:
        with self._lock:
            record = self._index.get(key)
        return None if record is None else record.length

    def location_of(self, key: StoreKey) -> RecordAddress | None:
        with self._lock:
            record = self._index.get(key)
        return None if record is None else record.location

    def index_bytes(self) -> int:
        """Bytes the index holds: key table, columns, per-segment runs and the eviction order (for benchmarks)."""
        with self._lock:
            return self._index.nbytes()

    def log_range(self, location: RecordAddress) -> Stretch:
        """A record's place in the log as one line: segment ``s`` spans positions from
        ``s * SEGMENT_STRIDE``, and a sealed segment's end is the next one's start."""
        start = location.segment_id * SEGMENT_STRIDE + location.offset
        end = start + location.length
        if (
            location.segment_id != self._log.active_segment_id
            and self._log.size_of(location.segment_id) == location.offset + location.length
        ):
            end = (location.segment_id + 1) * SEGMENT_STRIDE
        return Stretch(start, end)

    def keys_between(self, stretch: Stretch) -> list[StoreKey]:
        """The keys of the live records lying back to back in one segment from the one
        at ``stretch.start`` to the one holding ``stretch.end``, in log order; the walk
        stops at the first dead record and at the segment's end."""
        segment_id, offset = divmod(stretch.start, SEGMENT_STRIDE)
        end = min(stretch.end - segment_id * SEGMENT_STRIDE, SEGMENT_STRIDE)
        keys: list[StoreKey] = []
        with self._lock:
            run = self._index.runs.get(segment_id)
            position, block = run.at(offset) if run is not None else (-1, -1)
            while offset < end and block >= 0 and run is not None:
                keys.append(self._index.keys.key_of(block))
                offset += self._index.records.size[block]
                position += 1
                start, block = run.entry(position)
                if start != offset:
                    break
        return keys

    def keys_before(self, stretch: Stretch) -> list[StoreKey]:
        """The keys of the live records lying back to back below ``stretch.end``, from the
        one ending there down, for as many bytes as the stretch holds (the record crossing
        its start included), walking on into the previous segment at a segment's start
        (positions jump there, bytes do not); the walk stops at the first dead record."""
        keys: list[StoreKey] = []
        segment_id, offset = divmod(stretch.end, SEGMENT_STRIDE)
        left = stretch.end - stretch.start
        with self._lock:
            while left > 0:
                if offset == 0:  # the previous segment's last record ends here
                    segment_id -= 1
                    offset = self._log.size_of(segment_id) or 0
                block = self._index.ending_at(segment_id, offset)
                if block < 0:
                    break
                keys.append(self._index.keys.key_of(block))
                offset -= self._index.records.size[block]
                left -= self._index.records.size[block]
        return keys

    def touch(self, keys: Sequence[StoreKey]) -> None:
        """Refresh the recency of keys read from elsewhere (blocks read ahead into DRAM),
        the last one most of all."""
        with self._lock:
            for key in keys:
                block = self._index.keys.find(key)
                if block >= 0:
                    self._index.policy.touch(block)

    def keys(self) -> list[StoreKey]:
        with self._lock:  # copies in bulk under the lock; the tuples are built after it
            batch = self._index.keys.export(self._index.keys.mapped())
        return batch.keys()

    def eviction_order(self) -> list[StoreKey]:
        """Every key, the first to be evicted first (an O(n) walk: for tests and tools)."""
        with self._lock:
            return [self._index.keys.key_of(block) for block in self._index.policy.candidates()]

    def namespace_bytes(self) -> dict[str, int]:
        """Record bytes per namespace, kept as records come and go (cheap: for every metrics scrape)."""
        with self._lock:
            return {ns: n for ns, n in self._index.namespace_bytes.items() if n}

    def namespace_usage(self) -> dict[str, NamespaceUsage]:
        """Records and their payload bytes per namespace (walks the index: an admin call)."""
        usage: defaultdict[str, NamespaceUsage] = defaultdict(NamespaceUsage)
        with self._lock:
            for block in self._index.keys.mapped_ids():
                usage[self._index.keys.namespace_of(block)].add(self._index.records.length[block])
        return dict(usage)

    def usage(self) -> TierUsage:
        with self._lock:
            return TierUsage(self._config.capacity, self._log.stats().bytes, len(self._index.keys))

    def failure(self) -> str | None:
        """Why writes are paused (the last disk error), or None when the tier is healthy."""
        if self._failure is not None and time.monotonic() - self._failed_at >= self._config.retry_after_error_s:
            return None  # the pause is over: the next write tries again
        return self._failure

    def forget(self, key: StoreKey) -> bool:
        """Drop ``key`` from the index; the caller then writes a tombstone (:meth:`bury`)."""
        with self._lock:
            found = self._index.drop(key)
        if found:
            self._counters.add("ssd_deletes")
        return found

    # -- writes (blocking) ----------------------------------------------------

    def write(self, key: StoreKey, payload: memoryview, checksum: int, depth: int = 0) -> bool:
        """Store one block demoted from DRAM.

        Args:
            checksum: the block's xxh3-64 as DRAM knows it; recorded as is, so bytes
                that changed in memory since then read back as corrupt, not as good.
            depth: the block's depth in its prefix chain, for the eviction policy.

        Returns:
            True when stored; False when the key is already here, the tier is paused
            after a disk error, or the block cannot fit at all.
        """
        with self._write_lock:
            if self.failure() is not None or self.contains(key):
                return False
            size = record_size(key, len(payload))
            if not self._within_quota(key[0], size) or not self._make_room(size):
                return False
            location = self._append(key, payload, checksum, RecordFlags.NONE)
            if location is None:
                return False
            with self._lock:
                self._index.add(key, location, len(payload), checksum, depth)
        self._counters.add("ssd_demotions")
        return True

    def bury(self, key: StoreKey) -> None:
        """Write a tombstone for a key deleted (or never indexed) here, so a restart forgets it."""
        with self._write_lock:
            if self.contains(key) or not self._make_room(record_size(key, 0)):
                return  # stored again since; or no room: a restart may then resurrect it
            self._append_tombstone(key)

    def _append_tombstone(self, key: StoreKey) -> bool:
        location = self._append(key, b"", 0, RecordFlags.TOMBSTONE)
        if location is None:
            return False
        with self._lock:
            self._index.note_tombstone(key, location)
        return True

    def _append(
        self, key: StoreKey, payload: memoryview | bytes, checksum: int, flags: RecordFlags
    ) -> RecordAddress | None:
        """Append a record; on a disk error, pause writes and return None."""
        try:
            location = self._log.append(key[0], key[1], payload, flags, payload_sum=checksum)
        except OSError as exc:
            self._fail(exc)
            return None
        self._failure = None  # the disk takes writes again
        return location

    def _fail(self, exc: OSError) -> None:
        self._failure = f"{errno.errorcode.get(exc.errno or 0, 'EIO')}: {exc.strerror or exc}"
        self._failed_at = time.monotonic()
        self._counters.add("ssd_io_errors")
        log.error(
            "SSD write failed; demotion paused",
            extra={"error": self._failure, "retry_s": self._config.retry_after_error_s},
        )

    def _make_room(self, size: int) -> bool:
        """Evict and compact until ``size`` more bytes fit the budget.

        Returns:
            False if they never can, or a disk error stopped a compaction.

        Every compaction frees bytes (a victim's kept share is below
        ``gc_live_ratio``), and eviction ends when the index is empty, so this ends.
        """
        if size > self._config.segment_size:
            return False
        while self._log.stats().bytes + size > self._budget:
            segment = self._compaction_victim()
            if segment is not None:
                if not self._compact(segment):
                    return False
            elif not self._evict_one():
                return False
        return True

    def _oldest_segment(self, sizes: dict[int, int]) -> int | None:
        """The oldest segment holding any record: its tombstones hide nothing older."""
        return min((segment for segment, size in sizes.items() if size), default=None)

    def _compaction_victim(self) -> int | None:
        """The sealed segment with the least bytes to keep, if compacting it is worth it.

        A segment keeps its live records and, unless it is the oldest, its tombstones.
        """
        active = self._log.active_segment_id
        sizes = self._log.segment_sizes()
        oldest = self._oldest_segment(sizes)
        best: tuple[float, int] | None = None
        for segment, size in sizes.items():
            if segment == active or size == 0:
                continue
            kept = self._index.live.get(segment, 0)
            if segment != oldest:
                kept += self._index.tombstone_bytes.get(segment, 0)
            live_share = kept / size
            if best is None or live_share < best[0]:
                best = (live_share, segment)
        if best is None or best[0] >= self._config.gc_live_ratio:
            return None
        return best[1]

    def _within_quota(self, namespace: str, size: int) -> bool:
        """Evict each quota group's own least recent records until ``size`` more bytes fit every
        quota ``namespace``'s blocks count against (its own, and its tenants').

        Only the oldest ``_QUOTA_VICTIM_SCAN`` keys of the eviction order are looked
        at; a group with none of its records among them is refused the write
        instead (the block stays in DRAM until it is evicted there).
        """
        for group in quota_groups(namespace, self._config.namespace_quota, self._group_quotas):
            while group.held(self._index.namespace_bytes) + size > group.limit:
                with self._lock:
                    scan = islice(self._index.policy.candidates(), _QUOTA_VICTIM_SCAN)
                    victim = next((b for b in scan if group.covers(self._index.keys.namespace_of(b))), None)
                    if victim is None or size > group.limit:
                        self._counters.add("ssd_quota_refusals")
                        return False
                    self._index.drop_block(victim)
                self._counters.add("ssd_quota_evictions")
        return True

    def _evict_one(self) -> bool:
        with self._lock:
            victim = next(iter(self._index.policy.candidates()), None)
            if victim is None:
                return False
            self._index.drop_block(victim)
        self._counters.add("ssd_evictions")
        return True

    def _compact(self, segment: int) -> bool:
        """Move ``segment``'s live records (and needed tombstones) to the head, then delete it.

        Returns:
            False when a disk error stopped a copy: the segment then stays, with
            every record not yet moved, and nothing is lost.
        """
        oldest = segment == self._oldest_segment(self._log.segment_sizes())
        with self._lock:
            run = self._index.runs.get(segment)
            # in log order: stretches stay sequential
            keys = [self._index.keys.key_of(block) for block in run.live()] if run is not None else []
            tombstones = list(self._index.tombstones_in.get(segment, ()))
        for key in keys:
            if not self._move(key, segment):
                return False
        for key in tombstones if not oldest else ():
            if not self.contains(key) and not self._append_tombstone(key):
                return False
        with self._lock:
            self._index.drop_segment(segment)
        self._log.delete_segment(segment)
        self._counters.add("ssd_compactions")
        return True

    def _move(self, key: StoreKey, segment: int) -> bool:
        """Copy one live record to the head; False only when the copy could not be written."""
        with self._lock:
            record = self._index.get(key)
        if record is None or record.location.segment_id != segment:
            return True
        buffer = memoryview(bytearray(record.length))
        if not self._read(key, record, buffer):
            return True  # corrupt (dropped) or unreadable: nothing to keep
        location = self._append(key, buffer, record.checksum, RecordFlags.NONE)
        if location is None:
            return False
        with self._lock:
            if self._index.get(key) == record:
                self._index.relocate(record, location)
        return True

    # -- reads (blocking) -----------------------------------------------------

    def read_many(
        self, keys: Sequence[StoreKey], targets: Sequence[memoryview], *, touch: bool = True
    ) -> list[int | None]:
        """Read a batch of blocks, each into its target (exactly its length), and verify each.

        The records are read in disk order, records lying back to back as one
        sequential stretch (:func:`plan_spans`). When they lie in several places,
        the kernel is first asked to fetch the other stretches (``POSIX_FADV_WILLNEED``),
        so the device works on all of them at once instead of one after another.

        Args:
            touch: client reads: refresh recency and count each hit or miss.

        Returns:
            Per key, as :meth:`read_into`: the block's checksum with verified bytes
            in its target, or None (a miss, a corrupt record, a read error).
        """
        with self._lock:
            records = [self._index.get(key) for key in keys]
            for record in reversed(records):  # tail first: the head ends up most recent
                if record is not None and touch:
                    self._index.policy.touch(record.block)
        # gone, or stored again with another length since the caller asked: a miss
        wanted = [(i, r) for i, r in enumerate(records) if r is not None and r.length == targets[i].nbytes]
        spans = plan_spans([record.location for _, record in wanted])
        if len(spans) > 1:  # the first is read at once, and the kernel reads ahead of it
            self._will_need([span.location for span in spans[1:]])
        sums: list[int | None] = [None] * len(keys)
        for span in spans:
            members = [wanted[m] for m in span.members]
            for (i, record), ok in zip(members, self._read_span(members, keys, targets), strict=True):
                sums[i] = record.checksum if ok else None
        hits = sum(s is not None for s in sums)
        if touch and hits:
            self._counters.add("ssd_hits", hits)
        if touch and hits < len(keys):
            self._counters.add("ssd_misses", len(keys) - hits)
        return sums

    def _will_need(self, locations: list[RecordAddress]) -> None:
        if not locations:
            return
        try:
            self._log.will_need(locations)
        except OSError as exc:  # only a hint: the reads themselves report real errors
            log.debug("read-ahead hint failed", extra={"error": str(exc)})

    def _read_span(
        self, members: list[tuple[int, IndexedRecord]], keys: Sequence[StoreKey], targets: Sequence[memoryview]
    ) -> list[bool]:
        """Read one span's records; per member, whether its target holds verified bytes."""
        try:
            problems = self._log.read_span(
                [r.location for _, r in members], [targets[i] for i, _ in members], [keys[i] for i, _ in members]
            )
        except SegmentMissing:  # compacted meanwhile: each record, at its new location
            return [self.read_into(keys[i], targets[i], touch=False) is not None for i, _ in members]
        except OSError as exc:
            self._counters.add("ssd_io_errors")
            log.error("SSD read failed", extra={"blocks": len(members), "error": str(exc)})
            return [False] * len(members)
        for (i, record), problem in zip(members, problems, strict=True):
            if problem is not None:
                self._corrupt(keys[i], record, problem)
        return [problem is None for problem in problems]

    def read_into(self, key: StoreKey, target: memoryview, *, touch: bool = True) -> int | None:
        """Read ``key``'s block into ``target`` (exactly its length) and verify it.

        Args:
            touch: a client read: refresh recency and count the hit or miss.

        Returns:
            The block's checksum, with the verified bytes in ``target``; None on a
            miss, or when the record is corrupt (then dropped, counted and logged)
            or unreadable.
        """
        for _ in range(_READ_RETRIES):
            with self._lock:
                record = self._index.get(key)
                if record is not None and touch:
                    self._index.policy.touch(record.block)
            if record is None or record.length != target.nbytes:
                break  # gone, or stored again with another length since the caller asked
            try:
                ok = self._read(key, record, target)
            except SegmentMissing:
                continue  # compacted meanwhile: look again
            if touch:
                self._counters.add("ssd_hits" if ok else "ssd_misses")
            return record.checksum if ok else None
        if touch:
            self._counters.add("ssd_misses")
        return None

    def _read(self, key: StoreKey, record: IndexedRecord, target: memoryview) -> bool:
        """One verified read; a corrupt record is dropped. Raises SegmentMissing."""
        try:
            self._log.read_into(record.location, target, key)
            return True
        except CorruptRecord as exc:
            self._corrupt(key, record, exc)
        except OSError as exc:
            self._counters.add("ssd_io_errors")
            log.error("SSD read failed", extra={"ns": key[0], "key": key[1].hex(), "error": str(exc)})
        return False

    def _corrupt(self, key: StoreKey, record: IndexedRecord, exc: CorruptRecord) -> None:
        """Drop a record whose bytes failed a check: it is a miss from now on."""
        with self._lock:
            if self._index.get(key) == record:
                self._index.drop_block(record.block)
        self._counters.add("ssd_corrupt_blocks")
        log.error("corrupt SSD record dropped", extra={"ns": key[0], "key": key[1].hex(), "error": str(exc)})
