"""Which records a restart keeps, decided for all of them at once.

Replaying the log record by record (drop the key, add it again) costs a few
microseconds a record in Python: a minute for ten million. The rule it applies is
simple enough to decide in bulk: a key's newest record wins, and a winning
tombstone means the key is gone. Keys are grouped by their 64-bit digest; keys
sharing a digest are compared in full, and should two different keys ever share
one, :func:`survivors` says so and the caller replays record by record instead.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import xxhash

from kvpool_server.index import StoreKey
from kvpool_server.index.keys import KeyTable
from kvpool_server.tiers.record_columns import RecordColumns
from kvpool_server.tiers.spans import RecordAddress


def release_free_memory() -> None:
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    The rebuild's temporary arrays are large; glibc raises its mmap threshold after
    freeing large blocks, so they come from the heap, and freed heap stays with the
    process unless trimmed.
    """
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)


class DigestCollision(Exception):
    """Two different keys share a 64-bit digest: decide record by record."""


@dataclass(slots=True)
class LogRecords:
    """Records of the log, one array per field; ``namespace_ids`` index ``namespaces``."""

    namespaces: list[str]
    namespace_ids: np.ndarray
    hashes: np.ndarray  # one zero-padded row per record
    hash_lens: np.ndarray
    digests: np.ndarray
    segments: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    payload_lens: np.ndarray
    payload_sums: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)

    def take(self, rows: np.ndarray) -> LogRecords:
        """These rows, in this order."""
        columns = (getattr(self, name)[rows] for name in self.__slots__ if name != "namespaces")
        return LogRecords(self.namespaces, *columns)


@dataclass(slots=True)
class Survivors:
    """What a replay of the log leaves."""

    records: LogRecords  # the live records, in log order
    tombstones: list[tuple[StoreKey, RecordAddress]]  # every tombstone record, in log order
    undecodable: int  # records whose namespace is not UTF-8: never served


def survivors(segments: Iterable[tuple[int, RecordColumns]], table: KeyTable) -> Survivors:
    """The records a replay of ``segments`` (oldest first) would leave indexed.

    Args:
        table: the empty key table the survivors will go into; it numbers the
            namespaces, which seed the digests.

    Raises:
        DigestCollision: two different keys share a digest.
    """
    merged, is_tombstone, undecodable = _merge(list(segments), table)
    digests = merged.digests
    order = np.argsort(digests, kind="stable")  # equal digests stay in log order
    same_as_next = digests[order][1:] == digests[order][:-1]
    pairs = np.flatnonzero(same_as_next)
    first, second = order[pairs], order[pairs + 1]
    if not (_same_key(merged, first, second)).all():
        raise DigestCollision(f"{int((~_same_key(merged, first, second)).sum())} digest collisions")
    newest = order[np.append(~same_as_next, True)] if len(order) else order
    live = np.sort(newest[~is_tombstone[newest]])
    return Survivors(merged.take(live), _tombstones(merged.take(np.flatnonzero(is_tombstone))), undecodable)


def _merge(segments: list[tuple[int, RecordColumns]], table: KeyTable) -> tuple[LogRecords, np.ndarray, int]:
    """Every segment's columns as one set, namespaces numbered by ``table``, digests taken.

    Returns:
        The records, which of them are tombstones, and how many were left out (namespace not UTF-8).
    """
    names: list[str] = []
    numbers: dict[str, int] = {}
    parts: list[tuple[int, RecordColumns, np.ndarray]] = []  # (segment, columns, kept rows' namespace indices)
    undecodable = 0
    for segment_id, columns in segments:
        local = np.full(len(columns.namespaces), -1, dtype=np.int64)
        for i, raw in enumerate(columns.namespaces):
            try:
                name = raw.decode()
            except UnicodeDecodeError:
                continue  # checksums matched, so it was written so: never serve it
            local[i] = numbers.setdefault(name, len(names))
            if local[i] == len(names):
                names.append(name)
        mapped = local[columns.namespace_ids] if len(columns) else np.zeros(0, dtype=np.int64)
        undecodable += int((mapped < 0).sum())
        parts.append((segment_id, columns, mapped))
    width = max((c.hashes.shape[1] for _, c, _ in parts if len(c)), default=0)
    kept = [(segment_id, columns, mapped >= 0) for segment_id, columns, mapped in parts]

    def column(name: str, dtype: type) -> np.ndarray:
        return _cat([getattr(c, name)[k] for _, c, k in kept], dtype)

    hashes = (
        np.concatenate([_widen(c.hashes[k], width) for _, c, k in kept]) if kept else (np.zeros((0, 0), dtype=np.uint8))
    )
    hash_lens = column("hash_lens", np.int64)
    namespace_ids = _cat([m[m >= 0] for _, _, m in parts], np.int64)
    seeds = np.array([table.namespace_number(name) for name in names], dtype=np.int64)
    records = LogRecords(
        namespaces=names,
        namespace_ids=namespace_ids,
        hashes=hashes,
        hash_lens=hash_lens,
        digests=_digests(hashes, hash_lens, seeds[namespace_ids] if len(seeds) else namespace_ids),
        segments=_cat([np.full(int(k.sum()), s, dtype=np.int64) for s, _, k in kept], np.int64),
        offsets=column("offsets", np.int64),
        sizes=column("sizes", np.int64),
        payload_lens=column("payload_lens", np.int64),
        payload_sums=column("payload_sums", np.uint64),
    )
    return records, column("tombstones", np.bool_), undecodable


def _cat(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype=dtype)


def _widen(rows: np.ndarray, width: int) -> np.ndarray:
    if rows.shape[1] == width:
        return rows
    wide = np.zeros((len(rows), width), dtype=np.uint8)
    wide[:, : rows.shape[1]] = rows
    return wide


def _digests(hashes: np.ndarray, hash_lens: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Each key's :func:`~kvpool_server.index.keys.digest`, one call a key (about 0.3 microseconds)."""
    if not len(hashes):
        return np.zeros(0, dtype=np.uint64)
    width = hashes.shape[1]
    flat = np.ascontiguousarray(hashes).reshape(-1).data.cast("B")
    starts = range(0, len(hashes) * width, width)
    xxh3 = xxhash.xxh3_64_intdigest  # digest(), inlined: ten million calls
    return np.fromiter(
        (
            xxh3(flat[start : start + length], seed)
            for start, length, seed in zip(starts, hash_lens.tolist(), seeds.tolist(), strict=True)
        ),
        np.uint64,
        len(hashes),
    )


def _same_key(records: LogRecords, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    same: np.ndarray = (
        (records.namespace_ids[first] == records.namespace_ids[second])
        & (records.hash_lens[first] == records.hash_lens[second])
        & (records.hashes[first] == records.hashes[second]).all(axis=1)
    )
    return same


def _tombstones(records: LogRecords) -> list[tuple[StoreKey, RecordAddress]]:
    found = []
    for i in range(len(records)):
        key = (records.namespaces[records.namespace_ids[i]], records.hashes[i, : records.hash_lens[i]].tobytes())
        found.append((key, RecordAddress(int(records.segments[i]), int(records.offsets[i]), int(records.sizes[i]))))
    return found
