"""One segment file: its name, and the I/O on one open file of records.

A segment is the file ``<id, 12 digits>.seg`` holding records
(:mod:`kvpool_server.tiers.records`) back to back. The functions here take a file
descriptor and a size and know nothing else: positioned writes and reads that
resume after short transfers, the checks of a record read back, and the walks that
find a file's records (record by record, or mapped and parsed as columns).

Why apart from :mod:`~kvpool_server.tiers.segments`: the log there owns the state
of many files (which exist, which one takes appends, who still reads one being
deleted, the locks and the counts); these functions hold no state, so what one
file's bytes mean and how they move is read and tested here, apart from when and
under which lock the log calls them.

Blocking: every function except :func:`segment_name` does file I/O.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvpool_server.index import StoreKey
from kvpool_server.tiers.record_columns import RecordColumns, scan_columns
from kvpool_server.tiers.records import (
    HEADER_SIZE,
    CorruptRecord,
    RecordFlags,
    WalkResult,
    decode_record_header,
    split_key,
    verify_payload,
    walk_records,
)
from kvpool_server.tiers.spans import RecordAddress

SEGMENT_SUFFIX = ".seg"
_ID_DIGITS = 12


@dataclass(frozen=True, slots=True)
class ScanEntry:
    """One record found by :func:`scan_segment` (what :meth:`~kvpool_server.tiers.segments.SegmentLog.scan` yields)."""

    key: StoreKey
    location: RecordAddress
    checksum: int  # xxh3-64 of the payload
    payload_len: int
    tombstone: bool  # a deletion marker: the key's older records are void


def segment_name(segment_id: int) -> str:
    """The file name of segment ``segment_id``."""
    return f"{segment_id:0{_ID_DIGITS}d}{SEGMENT_SUFFIX}"


def segment_ids_in(directory: Path) -> list[int]:
    """The ids of the segment files in ``directory``, in order; other files are ignored."""
    ids = []
    for path in directory.iterdir():
        stem = path.name.removesuffix(SEGMENT_SUFFIX)
        if path.name.endswith(SEGMENT_SUFFIX) and len(stem) == _ID_DIGITS and stem.isdigit():
            ids.append(int(stem))
    return sorted(ids)


def open_segment(path: Path, flags: int) -> int:
    """Open a segment file for appends and reads, marked as read sequentially.

    Reads walk a segment front to back (a batch's stretches, a prefix chain's records
    one batch after another), so ``POSIX_FADV_SEQUENTIAL`` doubles the kernel's
    read-ahead window: more of the next batch is on its way while this one is sent.
    """
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | flags, 0o644)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return fd


def pwritev_all(fd: int, buffers: list[memoryview], offset: int) -> None:
    """Write all of ``buffers`` at ``offset``, resuming after short writes."""
    while buffers:
        written = os.pwritev(fd, buffers, offset)
        offset += written
        while buffers and written >= len(buffers[0]):
            written -= len(buffers[0])
            buffers.pop(0)
        if buffers:
            buffers[0] = buffers[0][written:]


def preadv_all(fd: int, buffers: list[memoryview], offset: int) -> int:
    """Fill ``buffers`` from ``offset``, resuming after short reads; returns bytes read (less only at end of file)."""
    total = 0
    while buffers:
        got = os.preadv(fd, buffers, offset)
        if got == 0:
            break
        offset, total = offset + got, total + got
        while buffers and got >= len(buffers[0]):
            got -= len(buffers[0])
            buffers.pop(0)
        if buffers:
            buffers[0] = buffers[0][got:]
    return total


def check_record(front: bytearray, payload: memoryview, location: RecordAddress, key: StoreKey | None) -> None:
    """Verify one record read as its header and key (``front``), then its payload; raises :class:`CorruptRecord`."""
    header = decode_record_header(front)
    if header.record_len != location.length:
        raise CorruptRecord("record length differs from the location's")
    key_bytes = memoryview(front)[HEADER_SIZE:]
    if key is None:
        split_key(header, key_bytes)
    else:  # the exact bytes wanted: a stronger check than the key checksum, and cheaper
        namespace = key[0].encode()
        if header.namespace_len != len(namespace) or key_bytes != namespace + key[1]:
            raise CorruptRecord("record holds a different key")
    verify_payload(header, payload)


def scan_segment(segment_id: int, fd: int, size: int, verify: bool, walk: WalkResult) -> Iterator[ScanEntry]:
    """Yield the valid records of one segment file in order; see :func:`walk_records`."""
    namespaces: dict[bytes, str] = {}  # a segment holds few namespaces: decode each once
    for found in walk_records(lambda offset, n: os.pread(fd, n, offset), size, verify, walk):
        namespace = namespaces.get(found.namespace)
        if namespace is None:
            try:
                namespace = namespaces[found.namespace] = found.namespace.decode()
            except UnicodeDecodeError:
                walk.corrupt += 1  # checksums matched, so it was written so: never serve it
                continue
        header = found.header
        location = RecordAddress(segment_id, found.offset, header.record_len)
        tombstone = header.flags == RecordFlags.TOMBSTONE
        yield ScanEntry((namespace, found.hash), location, header.payload_checksum, header.payload_len, tombstone)


def scan_mapped(fd: int, size: int, walk: WalkResult) -> RecordColumns:
    """:func:`scan_columns` over a segment file mapped read-only (an empty one cannot be mapped)."""
    if not size:
        return scan_columns(b"", 0, walk)
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
        view = memoryview(mapped)
        try:
            return scan_columns(view, size, walk)
        finally:
            view.release()


def read_records(
    fd: int, locations: list[RecordAddress], views: list[memoryview], keys: list[StoreKey | None]
) -> list[CorruptRecord | None]:
    """One preadv of records lying back to back from ``locations[0]``, then each record's checks.

    Returns:
        Per record, None when its payload in ``views`` is verified, else why not.
    """
    fronts = [bytearray(loc.length - len(view)) for loc, view in zip(locations, views, strict=True)]  # header and key
    buffers = [memoryview(b) for pair in zip(fronts, views, strict=True) for b in pair]
    got = preadv_all(fd, buffers, locations[0].offset)
    problems: list[CorruptRecord | None] = []
    for location, front, view, key in zip(locations, fronts, views, keys, strict=True):
        if got < location.offset + location.length - locations[0].offset:
            problems.append(CorruptRecord(f"short read: record ends past the {got} bytes read"))
            continue
        try:
            check_record(front, view, location, key)
            problems.append(None)
        except CorruptRecord as exc:  # kept without its traceback, whose frames hold the target views
            problems.append(exc.with_traceback(None))
    return problems
