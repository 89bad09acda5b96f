"""A log-structured store of records in segment files: the SSD tier's storage.

Records (:mod:`kvpool_server.tiers.records`) are appended to the active segment, a file
``<id, 12 digits>.seg``; when the next record would not fit, a new segment starts.
Nothing is rewritten in place: space comes back by deleting whole segments, after the
caller (garbage collection, above this module) has copied out what it still wants.

Blocking: **every** method except ``stats`` and ``segment_ids`` does file I/O and
blocks (open, pread/preadv, pwritev, fdatasync, ftruncate, unlink, directory fsync):
call them from a thread pool, never the event loop. Thread-safe: appends are serialized;
reads run concurrently with appends and each other; a segment deleted under a read is
closed when that read finishes.

Crash safety:
    - ``append`` returns once the whole record is written (and, with ``fsync``,
      ``fdatasync`` returned): that is the acknowledgement.
    - On open the last segment is walked (headers and keys). A torn tail (a partial
      header, a record past end of file, or a zero-filled tail) is truncated and
      appends resume there; a corrupt header there instead starts a new segment.
    - A header checksum mismatch makes the lengths untrustworthy, so the rest of that
      segment cannot be found: ``scan`` counts one corrupt record plus the lost bytes
      and moves on. A bad key checksum (or payload, with ``verify``) under a good
      header skips only that record.
    - ``scan`` checks payload checksums only with ``verify=True`` (reads everything);
      ``read_into`` and ``read_span`` always do, so a corrupt payload is a miss, never
      wrong bytes.

Batched reads: :func:`~kvpool_server.tiers.spans.plan_spans` groups the records a
batch wants into spans that lie back to back on disk, and :meth:`SegmentLog.read_span`
reads a span front to back in calls of about ``READ_CHUNK`` bytes (the kernel's
read-ahead then streams the device ahead of the reads).

The log holds the state of its files (which exist, the active one, reader counts of a
segment being deleted, locks, counts); what one file holds and the I/O on it are in
:mod:`~kvpool_server.tiers.segment_files`, record addresses and spans in
:mod:`~kvpool_server.tiers.spans`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvpool_server.index import StoreKey
from kvpool_server.tiers.record_columns import RecordColumns
from kvpool_server.tiers.records import (
    HEADER_SIZE,
    CorruptRecord,
    RecordFlags,
    WalkResult,
    WalkStop,
    encode_record_header,
    payload_checksum,
)
from kvpool_server.tiers.segment_files import (
    ScanEntry,
    open_segment,
    pwritev_all,
    read_records,
    scan_mapped,
    scan_segment,
    segment_ids_in,
    segment_name,
)
from kvpool_server.tiers.spans import READ_CHUNK, RecordAddress, chunk_span


class SegmentMissing(LookupError):
    """The location names a segment this log does not have (deleted, or never was)."""


@dataclass(frozen=True, slots=True)
class SegmentStats:
    segments: int
    bytes: int
    corrupt_records: int  # found by scans of this object, cumulative
    lost_bytes: int  # bytes after a corrupt header, unreachable, cumulative
    truncated_bytes: int  # torn tail removed on open


@dataclass(slots=True)
class _Segment:
    id: int
    fd: int
    size: int
    readers: int = 0
    doomed: bool = False  # deleted; close the fd when the last reader leaves


class SegmentLog:
    """Append-only records in segment files under one directory.

    Args:
        directory: where segment files live; created if missing. Files whose names
            are not ``<12 digits>.seg`` are ignored.
        segment_size: the most bytes one segment holds; a record larger than this
            cannot be stored.
        fsync: ``fdatasync`` after every append (and ``fsync`` the directory when a
            segment is created or deleted), so an acknowledged record survives power
            loss, not only a process crash.
    """

    def __init__(self, directory: str | os.PathLike[str], segment_size: int, fsync: bool) -> None:
        if segment_size <= HEADER_SIZE:
            raise ValueError(f"segment_size must exceed the {HEADER_SIZE}-byte header")
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._segment_size = segment_size
        self._fsync = fsync
        self._write_lock = threading.Lock()  # one appender at a time
        self._meta_lock = threading.Lock()  # segment table, sizes, reader counts
        self._segments: dict[int, _Segment] = {}
        self._corrupt = self._lost = self._truncated = 0
        self._tail_scan: tuple[int, int, RecordColumns, WalkResult] | None = None
        for segment_id in segment_ids_in(self._dir):
            fd = open_segment(self._dir / segment_name(segment_id), 0)
            self._segments[segment_id] = _Segment(segment_id, fd, os.fstat(fd).st_size)
        self._next_id = max(self._segments, default=0) + 1
        last = self._segments.get(self._next_id - 1)
        self._active = last if last is not None and self._recover_tail(last) else self._new_segment()

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Close every segment file. The log must not be used afterwards."""
        with self._write_lock, self._meta_lock:
            for segment in self._segments.values():
                os.close(segment.fd)
            self._segments.clear()

    def __enter__(self) -> SegmentLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _recover_tail(self, segment: _Segment) -> bool:
        """Truncate a torn tail off ``segment``; return whether appends may continue there."""
        walk = WalkResult()
        columns = scan_mapped(segment.fd, segment.size, walk)
        if walk.stop is WalkStop.TORN:
            os.ftruncate(segment.fd, walk.good_end)
            self._sync(segment.fd)
            self._truncated += segment.size - walk.good_end
            segment.size = walk.good_end
        self._tail_scan = (segment.id, segment.size, columns, walk)  # the rebuild's scan takes it, once
        return walk.stop is not WalkStop.CORRUPT

    def _new_segment(self) -> _Segment:
        """Create the next segment file and make it active. Caller holds the write lock."""
        segment_id = self._next_id
        path = self._dir / segment_name(segment_id)
        fd = open_segment(path, os.O_CREAT | os.O_EXCL)
        self._sync_dir()
        segment = _Segment(segment_id, fd, 0)
        with self._meta_lock:
            self._segments[segment_id] = segment
            self._next_id += 1
        self._active = segment
        return segment

    def _sync(self, fd: int) -> None:
        if self._fsync:
            os.fdatasync(fd)

    def _sync_dir(self) -> None:
        if self._fsync:  # makes a created or removed file name durable
            fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    # -- writes ---------------------------------------------------------------

    def append(
        self,
        namespace: str,
        hash_: bytes,
        payload: memoryview | bytes,
        flags: RecordFlags = RecordFlags.NONE,
        payload_sum: int | None = None,
    ) -> RecordAddress:
        """Append one record; the payload is handed to ``pwritev`` without a copy.

        Args:
            namespace: the key's namespace (UTF-8 encoded on disk).
            hash_: the key's block hash (1..MAX_HASH_LEN bytes).
            payload: the block's bytes (any C-contiguous buffer); empty for a tombstone.
            flags: record flags, e.g. ``TOMBSTONE``.
            payload_sum: the payload's xxh3-64 if the caller knows it already
                (saves hashing the payload again).

        Returns:
            Where the record now lives. The record is complete on disk (and durable,
            with ``fsync``) when this returns.

        Raises:
            ValueError: a length is out of bounds or the record exceeds ``segment_size``.
            OSError: the write failed (e.g. ``ENOSPC``); the partial record is
                truncated away where possible and the log stays usable.
        """
        view = memoryview(payload).cast("B")
        ns = namespace.encode()
        if payload_sum is None:
            payload_sum = payload_checksum(view)
        header = encode_record_header(ns, hash_, len(view), payload_sum, flags)
        total = HEADER_SIZE + len(ns) + len(hash_) + len(view)
        if total > self._segment_size:
            raise ValueError(f"record of {total} bytes exceeds segment size {self._segment_size}")
        with self._write_lock:
            segment = self._active
            if segment.size + total > self._segment_size:
                segment = self._new_segment()
            offset = segment.size
            self._write(segment, [memoryview(header), memoryview(ns), memoryview(hash_), view], offset)
            with self._meta_lock:
                segment.size = offset + total
        return RecordAddress(segment.id, offset, total)

    def _write(self, segment: _Segment, buffers: list[memoryview], offset: int) -> None:
        try:
            pwritev_all(segment.fd, buffers, offset)
            self._sync(segment.fd)
        except OSError:
            with contextlib.suppress(OSError):  # if this fails, the next append overwrites it; a reopen truncates it
                os.ftruncate(segment.fd, offset)  # drop the partial record so the tail stays clean
            raise

    def delete_segment(self, segment_id: int) -> None:
        """Remove a sealed segment and its file (garbage collection).

        Locations in it become :class:`SegmentMissing`. Reads already in flight
        finish first; the file descriptor is closed after the last of them.

        Raises:
            SegmentMissing: no such segment.
            ValueError: ``segment_id`` is the active segment.
        """
        with self._write_lock:
            if segment_id == self._active.id:
                raise ValueError(f"segment {segment_id} is active")
            with self._meta_lock:
                segment = self._segments.pop(segment_id, None)
                if segment is None:
                    raise SegmentMissing(segment_id)
                segment.doomed = True
                close_now = segment.readers == 0
            os.unlink(self._dir / segment_name(segment_id))
            if close_now:
                os.close(segment.fd)
            self._sync_dir()

    # -- reads ----------------------------------------------------------------

    def _acquire(self, segment_id: int) -> _Segment:
        with self._meta_lock:
            segment = self._segments.get(segment_id)
            if segment is None:
                raise SegmentMissing(segment_id)
            segment.readers += 1
            return segment

    def _release(self, segment: _Segment) -> None:
        with self._meta_lock:
            segment.readers -= 1
            close_now = segment.doomed and segment.readers == 0
        if close_now:
            os.close(segment.fd)

    def will_need(self, locations: list[RecordAddress]) -> None:
        """Ask the kernel to start reading these records now (``POSIX_FADV_WILLNEED``).

        A batch's reads then overlap on the device instead of queueing one by one
        behind small read-ahead windows. A location whose segment is gone is skipped.
        """
        for location in locations:
            try:
                segment = self._acquire(location.segment_id)
            except SegmentMissing:
                continue
            try:
                os.posix_fadvise(segment.fd, location.offset, location.length, os.POSIX_FADV_WILLNEED)
            finally:
                self._release(segment)

    def read_into(self, location: RecordAddress, target: memoryview, key: StoreKey | None = None) -> None:
        """Read the payload at ``location`` into ``target`` and verify it.

        Args:
            location: from :meth:`append` or :meth:`scan`.
            target: writable buffer of exactly the payload's length.
            key: if given, the record's key must equal it.

        Raises:
            CorruptRecord: short read, header, key or payload checksum mismatch, or a
                different key. ``target``'s contents are then garbage: never serve them.
            SegmentMissing: the segment was deleted.
            ValueError: ``target`` cannot hold this record's payload.
            OSError: the read failed.
        """
        problem = self.read_span([location], [target], [key])[0]
        if problem is not None:
            raise problem

    def read_span(
        self, locations: Sequence[RecordAddress], targets: Sequence[memoryview], keys: Sequence[StoreKey | None]
    ) -> list[CorruptRecord | None]:
        """Read records lying back to back in one segment (a :class:`~kvpool_server.tiers.spans.Span`) and verify each.

        The payloads go straight into ``targets`` (one copy, out of the page cache);
        headers and keys into small buffers. Calls of about ``READ_CHUNK`` bytes go
        front to back, and each record is verified right after its call, while its
        bytes are still in the CPU cache.

        Args:
            locations: the records, in disk order, each starting where the last ends.
            targets: one writable buffer per record, exactly its payload's length.
            keys: the key each record must hold (None: any).

        Returns:
            Per record, None when its bytes in ``targets`` are verified, else why not
            (its target then holds garbage: never serve it).

        Raises:
            SegmentMissing: the segment was deleted.
            ValueError: the locations are not back to back in one segment, or a
                target is read-only or does not fit its record.
            OSError: a read failed.
        """
        views = [memoryview(t).cast("B") for t in targets]
        for i, (location, view) in enumerate(zip(locations, views, strict=True)):
            if view.readonly or location.length - HEADER_SIZE - len(view) < 1:
                raise ValueError("target is read-only or larger than the record's payload")
            if i and (location.segment_id, location.offset) != (
                locations[i - 1].segment_id,
                locations[i - 1].offset + locations[i - 1].length,
            ):
                raise ValueError("locations are not back to back in one segment")
        if not locations:
            return []
        segment = self._acquire(locations[0].segment_id)
        try:
            return [
                problem
                for call in chunk_span([loc.length for loc in locations], READ_CHUNK)
                for problem in read_records(
                    segment.fd, [locations[i] for i in call], [views[i] for i in call], [keys[i] for i in call]
                )
            ]
        finally:
            self._release(segment)

    def scan(self, verify: bool = False) -> Iterator[ScanEntry]:
        """Yield every readable record, segment by segment, oldest first.

        Meant for rebuilding the index at start. Records appended while a scan runs
        may or may not be seen. Corrupt records and unreachable bytes are added to
        :meth:`stats` as each segment finishes.

        Args:
            verify: also read every payload and check its checksum (slow: reads
                everything); without it, payloads are verified on read only.
        """
        with self._meta_lock:
            snapshot = sorted((s.id, s.size) for s in self._segments.values())
        for segment_id, size in snapshot:
            try:
                segment = self._acquire(segment_id)
            except SegmentMissing:
                continue  # deleted since the snapshot
            walk = WalkResult()
            try:
                yield from scan_segment(segment_id, segment.fd, size, verify, walk)
            finally:
                self._release(segment)
            with self._meta_lock:
                self._corrupt += walk.corrupt
                self._lost += size - walk.good_end if walk.stop is WalkStop.CORRUPT else 0

    def scan_columns(self) -> Iterator[tuple[int, RecordColumns]]:
        """Every readable record, a segment at a time as columns, oldest segment first.

        What :meth:`scan` finds (without ``verify``), parsed in bulk
        (:mod:`~kvpool_server.tiers.record_columns`): the rebuild of a large index at start.
        """
        with self._meta_lock:
            snapshot = sorted((s.id, s.size) for s in self._segments.values())
        tail, self._tail_scan = self._tail_scan, None  # what the tail recovery parsed at start, if still so
        for segment_id, size in snapshot:
            columns, walk = tail[2:] if tail is not None and tail[:2] == (segment_id, size) else (None, WalkResult())
            if columns is None:
                try:
                    segment = self._acquire(segment_id)
                except SegmentMissing:
                    continue  # deleted since the snapshot
                try:
                    columns = scan_mapped(segment.fd, size, walk)
                finally:
                    self._release(segment)
            with self._meta_lock:
                self._corrupt += walk.corrupt
                self._lost += size - walk.good_end if walk.stop is WalkStop.CORRUPT else 0
            yield segment_id, columns

    # -- introspection --------------------------------------------------------

    @property
    def active_segment_id(self) -> int:
        return self._active.id  # sealed segments are all the others

    def segment_ids(self) -> list[int]:
        """Ids of the segments on disk, oldest first (the last one is active)."""
        with self._meta_lock:
            return sorted(self._segments)

    def size_of(self, segment_id: int) -> int | None:
        """A segment's bytes, None if it is gone (no I/O)."""
        segment = self._segments.get(segment_id)  # one dict read: atomic under the GIL
        return None if segment is None else segment.size

    def segment_sizes(self) -> dict[int, int]:
        """Segment id -> bytes, for every segment on disk (no I/O)."""
        with self._meta_lock:
            return {s.id: s.size for s in self._segments.values()}

    def stats(self) -> SegmentStats:
        """Counts only; no I/O."""
        with self._meta_lock:
            return SegmentStats(
                segments=len(self._segments),
                bytes=sum(s.size for s in self._segments.values()),
                corrupt_records=self._corrupt,
                lost_bytes=self._lost,
                truncated_bytes=self._truncated,
            )
