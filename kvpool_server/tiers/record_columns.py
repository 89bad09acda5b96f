"""The records of a segment parsed in bulk into columns, for rebuilding the SSD index at start.

Walking records one Python object at a time cost about 10 microseconds a record:
minutes for a disk of small blocks. Here a lean loop reads only each record's
lengths to find where the records start; their headers are then checked all at
once with numpy, and only the header's and the key's checksums are computed a
record at a time. The first record that is not plainly sound is handed to
:func:`~kvpool_server.tiers.records.judge_record`, which applies the walk's rules
to it alone, and the bulk parse resumes after it. Same records, same verdicts as
:func:`~kvpool_server.tiers.records.walk_records`, tested against it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import xxhash

from kvpool_server.tiers.records import (
    _KNOWN_FLAGS,
    HEADER_SIZE,
    MAGIC,
    MAX_HASH_LEN,
    MAX_NAMESPACE_LEN,
    VERSION,
    RecordFlags,
    WalkResult,
    WalkStop,
    judge_record,
)

_LENGTHS = struct.Struct("<HHxxQ")  # namespace, hash and payload lengths, 6 bytes into a header
_LENGTH_FIELDS = np.dtype([("ns_len", "<u2"), ("hash_len", "<u2"), ("reserved", "<u2"), ("payload_len", "<u8")])
_HEADER = np.dtype(
    [
        ("magic", "S4"),
        ("version", "u1"),
        ("flags", "u1"),
        ("ns_len", "<u2"),
        ("hash_len", "<u2"),
        ("reserved", "<u2"),
        ("payload_len", "<u8"),
        ("payload_sum", "<u8"),
        ("key_sum", "<u4"),
        ("header_sum", "<u4"),
    ]
)
_CHUNK_RECORDS = 1 << 16  # records checked per numpy pass: bounds the work a corrupt length can waste
_SUMMED = HEADER_SIZE - 4  # header bytes under the header checksum


@dataclass(slots=True)
class RecordColumns:
    """Valid records of one segment in log order, one array per field.

    ``namespaces`` holds each distinct namespace once; ``namespace_ids`` indexes it
    per record. ``hashes`` is one row per record, as wide as the longest hash, zero
    past each hash's ``hash_lens``.
    """

    offsets: np.ndarray
    sizes: np.ndarray
    payload_lens: np.ndarray
    payload_sums: np.ndarray
    tombstones: np.ndarray
    namespace_ids: np.ndarray
    namespaces: list[bytes]
    hashes: np.ndarray
    hash_lens: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)


def scan_columns(data: bytes | memoryview, size: int, result: WalkResult) -> RecordColumns:
    """Every valid record among the first ``size`` bytes of ``data``, as :func:`walk_records` finds them.

    Args:
        data: the segment's bytes (a mapped file).
        result: filled in as :func:`walk_records` fills it.
    """
    view = memoryview(data).cast("B")
    array = np.frombuffer(view, dtype=np.uint8, count=size)
    starts: list[np.ndarray] = []
    offset = 0
    while offset < size:
        sound = _sound_starts(view, array, offset, size)
        if len(sound):
            starts.append(sound)
            offset = int(sound[-1]) + _record_len(view, int(sound[-1]))
            result.good_end = offset
            continue
        found, after = judge_record(lambda at, n: bytes(view[at : at + n]), offset, size, False, result)
        if after is None:
            return _columns(array, starts)
        if found is not None:
            starts.append(np.array([found.offset], dtype=np.int64))
        offset = after
    result.stop = WalkStop.END
    return _columns(array, starts)


def _record_len(view: memoryview, offset: int) -> int:
    lengths: tuple[int, int, int] = _LENGTHS.unpack_from(view, offset + 6)  # namespace, hash, payload
    return HEADER_SIZE + lengths[0] + lengths[1] + lengths[2]


def _candidate_starts(view: memoryview, array: np.ndarray, offset: int, size: int) -> np.ndarray:
    """Where records would start from ``offset`` on, going by their length fields alone (checked later).

    Records of one size follow each other at a constant stride: a whole stretch of them is
    recognised at once, with one look at every length field through a strided view; the
    lengths are followed a record at a time only where the size changes.
    """
    starts: list[np.ndarray] = []
    count = 0
    unpack = _LENGTHS.unpack_from
    while offset + HEADER_SIZE <= size and count < _CHUNK_RECORDS:
        ns_len, hash_len, payload_len = unpack(view, offset + 6)
        stride = HEADER_SIZE + ns_len + hash_len + payload_len
        if offset + stride > size:
            break
        same = _same_size_run(array, offset, stride, min(_CHUNK_RECORDS - count, (size - offset) // stride))
        starts.append(offset + stride * np.arange(same, dtype=np.int64))
        count += same
        offset += stride * same
    return np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)


def _same_size_run(array: np.ndarray, offset: int, stride: int, most: int) -> int:
    """How many records from ``offset`` on (at least the first, at most ``most``) claim ``stride`` bytes."""
    if most <= 1:
        return 1
    fields = np.lib.stride_tricks.as_strided(
        array[offset + 6 :], shape=(most, _LENGTH_FIELDS.itemsize), strides=(stride, 1), writeable=False
    )
    lengths = np.ascontiguousarray(fields).view(_LENGTH_FIELDS)[:, 0]
    claimed = (
        HEADER_SIZE + lengths["ns_len"].astype(np.int64) + lengths["hash_len"] + lengths["payload_len"].astype(np.int64)
    )
    differs = np.flatnonzero(claimed != stride)
    return int(differs[0]) if len(differs) else most


def _sound_starts(view: memoryview, array: np.ndarray, offset: int, size: int) -> np.ndarray:
    """Starts of the plainly sound records from ``offset`` on, up to the first that is not (or a chunk's worth)."""
    found = _candidate_starts(view, array, offset, size)
    if not len(found):
        return found
    headers = _rows(array, found, HEADER_SIZE).view(_HEADER)[:, 0]
    ok = (
        (headers["magic"] == MAGIC)
        & (headers["version"] == VERSION)
        & (headers["reserved"] == 0)
        & ((headers["flags"] & ~np.uint8(_KNOWN_FLAGS)) == 0)
        & (headers["ns_len"] <= MAX_NAMESPACE_LEN)
        & (headers["hash_len"] >= 1)
        & (headers["hash_len"] <= MAX_HASH_LEN)
    )
    bad = np.flatnonzero(~ok)
    found = found[: bad[0]] if len(bad) else found
    digest = xxhash.xxh32_intdigest
    header_sums = np.fromiter((digest(view[o : o + _SUMMED]) for o in found.tolist()), np.uint32, len(found))
    bad = np.flatnonzero(header_sums != headers["header_sum"][: len(found)])
    found = found[: bad[0]] if len(bad) else found
    key_ends = found + HEADER_SIZE + headers["ns_len"][: len(found)] + headers["hash_len"][: len(found)]
    key_sums = np.fromiter(
        (digest(view[o + HEADER_SIZE : e]) for o, e in zip(found.tolist(), key_ends.tolist(), strict=True)),
        np.uint32,
        len(found),
    )
    bad = np.flatnonzero(key_sums != headers["key_sum"][: len(found)])
    return found[: bad[0]] if len(bad) else found


def _columns(array: np.ndarray, starts: list[np.ndarray]) -> RecordColumns:
    offsets = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    headers = _rows(array, offsets, HEADER_SIZE).view(_HEADER)[:, 0]
    ns_lens = headers["ns_len"].astype(np.int64)
    hash_lens = headers["hash_len"].astype(np.int64)
    payload_lens = headers["payload_len"].astype(np.int64)
    key_at = offsets + HEADER_SIZE
    namespace_ids, namespaces = _namespaces(array, key_at, ns_lens)
    return RecordColumns(
        offsets=offsets,
        sizes=HEADER_SIZE + ns_lens + hash_lens + payload_lens,
        payload_lens=payload_lens,
        payload_sums=headers["payload_sum"].astype(np.uint64),
        tombstones=(headers["flags"] & np.uint8(RecordFlags.TOMBSTONE)) != 0,
        namespace_ids=namespace_ids,
        namespaces=namespaces,
        hashes=_gather(array, key_at + ns_lens, hash_lens),
        hash_lens=hash_lens,
    )


def _gather(array: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """One row per record: ``lengths[i]`` bytes from ``starts[i]``, zero-padded to the longest."""
    width = int(lengths.max()) if len(lengths) else 0
    rows = _rows(array, starts, width)
    rows[np.arange(width) >= lengths[:, None]] = 0
    return rows


def _rows(array: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """A copy of ``width`` bytes from each of ``starts``, reading past the array's end as zeros.

    Records of one size lie at a constant stride, so each stretch of constant stride
    is one strided view copied whole (memory speed), not a gather of every byte.
    """
    rows = np.zeros((len(starts), width), dtype=np.uint8)
    if not len(starts) or not width:
        return rows
    whole = int(np.searchsorted(starts, len(array) - width, side="right"))  # rows that end inside the array
    steps = np.diff(starts[:whole])
    cuts = np.flatnonzero(steps[1:] != steps[:-1]) + 2 if len(steps) > 1 else np.zeros(0, dtype=np.int64)
    for first, end in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [whole])).tolist(), strict=True):
        if end <= first:
            continue
        stride = int(starts[first + 1] - starts[first]) if end - first > 1 else 1
        view = np.lib.stride_tricks.as_strided(
            array[int(starts[first]) :], shape=(end - first, width), strides=(stride, 1), writeable=False
        )
        rows[first:end] = view
    for i in range(whole, len(starts)):  # the last few, cut at the array's end
        tail = array[int(starts[i]) : int(starts[i]) + width]
        rows[i, : len(tail)] = tail
    return rows


def _namespaces(array: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    """Per record the index of its namespace among the distinct ones (a segment holds few)."""
    rows = _gather(array, starts, lengths)
    if not len(rows):
        return np.zeros(0, dtype=np.int64), []
    # the length goes into the row too: b"a" and b"a\0" pad to the same bytes
    keyed = np.ascontiguousarray(np.concatenate([lengths.astype("<u2").view(np.uint8).reshape(-1, 2), rows], axis=1))
    if (keyed == keyed[0]).all():  # the usual case: one engine layout per segment
        return np.zeros(len(rows), dtype=np.int64), [rows[0, : lengths[0]].tobytes()]
    distinct, ids = np.unique(keyed.view(f"V{keyed.shape[1]}")[:, 0], return_inverse=True)
    names = []
    for row in distinct:
        raw = row.tobytes()
        names.append(raw[2 : 2 + int.from_bytes(raw[:2], "little")])
    return ids.reshape(-1).astype(np.int64), names
