"""Which records a restart keeps, decided for all of them at once.

Replaying the log record by record (drop the key, add it again) costs a few
microseconds a record in Python: a minute for ten million. The rule it applies is
simple enough to decide in bulk: a key's newest record wins, and a winning
tombstone means the key is gone. Keys are grouped by their 64-bit digest; keys
sharing a digest are compared in full, and should two different keys ever share
one, :func:`survivors` says so and the caller replays record by record instead.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import xxhash

from kvpool_server.index import StoreKey
from kvpool_server.index.keys import KeyTable
from kvpool_server.tiers.record_columns import RecordColumns
from kvpool_server.tiers.segments import Location


def release_free_memory() -> None:
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    The rebuild's temporary arrays are large; glibc raises its mmap threshold after
    freeing large blocks, so they come from the heap, and freed heap stays with the
    process unless trimmed.
    """
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


class DigestCollision(Exception):
    """Two different keys share a 64-bit digest: decide record by record."""


@dataclass(slots=True)
class Survivors:
    """The live records after a replay of the log, in log order, one array per field."""

    namespaces: list[str]
    namespace_ids: np.ndarray
    hashes: np.ndarray
    hash_lens: np.ndarray
    digests: np.ndarray
    segments: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    payload_lens: np.ndarray
    payload_sums: np.ndarray
    tombstones: list[tuple[StoreKey, Location]]  # every tombstone record, in log order
    undecodable: int  # records whose namespace is not UTF-8: never served

    def __len__(self) -> int:
        return len(self.offsets)


def survivors(segments: Iterable[tuple[int, RecordColumns]], table: KeyTable) -> Survivors:
    """The records a replay of ``segments`` (oldest first) would leave indexed.

    Args:
        table: the empty key table the survivors will go into; it numbers the
            namespaces, which seed the digests.

    Raises:
        DigestCollision: two different keys share a digest.
    """
    merged = _merge(list(segments), table)
    digests = merged.digests
    order = np.argsort(digests, kind="stable")  # equal digests stay in log order
    same_as_next = digests[order][1:] == digests[order][:-1]
    pairs = np.flatnonzero(same_as_next)
    first, second = order[pairs], order[pairs + 1]
    if not (_same_key(merged, first, second)).all():
        raise DigestCollision(f"{int((~_same_key(merged, first, second)).sum())} digest collisions")
    newest = order[np.append(~same_as_next, True)] if len(order) else order
    live = np.sort(newest[~merged.is_tombstone[newest]])
    return Survivors(
        namespaces=merged.namespaces, namespace_ids=merged.namespace_ids[live], hashes=merged.hashes[live],
        hash_lens=merged.hash_lens[live], digests=digests[live], segments=merged.segments[live],
        offsets=merged.offsets[live], sizes=merged.sizes[live], payload_lens=merged.payload_lens[live],
        payload_sums=merged.payload_sums[live], tombstones=_tombstones(merged), undecodable=merged.undecodable,
    )


@dataclass(slots=True)
class _Merged:
    namespaces: list[str]
    namespace_ids: np.ndarray
    hashes: np.ndarray
    hash_lens: np.ndarray
    digests: np.ndarray
    segments: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    payload_lens: np.ndarray
    payload_sums: np.ndarray
    is_tombstone: np.ndarray
    undecodable: int


def _merge(segments: list[tuple[int, RecordColumns]], table: KeyTable) -> _Merged:
    """Every segment's columns as one set, namespaces numbered by ``table``, digests taken."""
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
    keep = [m >= 0 for _, _, m in parts]
    hashes = np.concatenate([_widen(c.hashes[k], width) for (_, c, _), k in zip(parts, keep, strict=True)]) if parts \
        else np.zeros((0, 0), dtype=np.uint8)
    hash_lens = _cat([c.hash_lens[k] for (_, c, _), k in zip(parts, keep, strict=True)], np.int64)
    namespace_ids = _cat([m[k] for (_, _, m), k in zip(parts, keep, strict=True)], np.int64)
    seeds = np.array([table.namespace_number(name) for name in names], dtype=np.int64)
    return _Merged(
        namespaces=names, namespace_ids=namespace_ids, hashes=hashes, hash_lens=hash_lens,
        digests=_digests(hashes, hash_lens, seeds[namespace_ids] if len(seeds) else namespace_ids),
        segments=_cat([np.full(int(k.sum()), s, dtype=np.int64) for (s, _, _), k in zip(parts, keep, strict=True)],
                      np.int64),
        offsets=_cat([c.offsets[k] for (_, c, _), k in zip(parts, keep, strict=True)], np.int64),
        sizes=_cat([c.sizes[k] for (_, c, _), k in zip(parts, keep, strict=True)], np.int64),
        payload_lens=_cat([c.payload_lens[k] for (_, c, _), k in zip(parts, keep, strict=True)], np.int64),
        payload_sums=_cat([c.payload_sums[k] for (_, c, _), k in zip(parts, keep, strict=True)], np.uint64),
        is_tombstone=_cat([c.tombstones[k] for (_, c, _), k in zip(parts, keep, strict=True)], np.bool_),
        undecodable=undecodable,
    )


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
    flat = memoryview(np.ascontiguousarray(hashes).reshape(-1)).cast("B")
    starts = range(0, len(hashes) * width, width)
    xxh3 = xxhash.xxh3_64_intdigest  # digest(), inlined: ten million calls
    return np.fromiter((xxh3(flat[start : start + length], seed) for start, length, seed
                        in zip(starts, hash_lens.tolist(), seeds.tolist(), strict=True)), np.uint64, len(hashes))


def _same_key(merged: _Merged, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    return ((merged.namespace_ids[first] == merged.namespace_ids[second])
            & (merged.hash_lens[first] == merged.hash_lens[second])
            & (merged.hashes[first] == merged.hashes[second]).all(axis=1))


def _tombstones(merged: _Merged) -> list[tuple[StoreKey, Location]]:
    found = []
    for i in np.flatnonzero(merged.is_tombstone).tolist():
        key = (merged.namespaces[merged.namespace_ids[i]], merged.hashes[i, : merged.hash_lens[i]].tobytes())
        found.append((key, Location(int(merged.segments[i]), int(merged.offsets[i]), int(merged.sizes[i]))))
    return found
