"""Block keys to dense integer ids, in flat arrays: the index's only per-key map.

A daemon holds millions of blocks, so a dict of key tuples to objects (an object, a
tuple and a dict entry a block) is too dear. Here a key costs its hash's bytes in a cell
of one bytearray, a namespace number, and a slot in an open-addressing table of
64-bit digests and 32-bit ids (linear probing, at most 70% full, deletion by
backward shift so no tombstones pile up). Everything else a tier knows about a
block lives in columns indexed by the id (:mod:`kvpool_server.index.entry` for
DRAM, :mod:`kvpool_server.index.locations` for SSD).

An id outlives its key's mapping on purpose: a block deleted while a reader holds
it is unmapped at once (a new block of the same key may be stored) and its id
returns to the free list only when the tier releases it.

Scalar access goes through memoryviews, which index faster than numpy and give
plain ints; numpy is used where whole arrays move at once (growth).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import xxhash

from kvpool_server.index.entry import StoreKey

_EMPTY = -1
_MIN_SLOTS = 16
_MAX_LOAD = 0.7


def digest(namespace_number: int, block_hash: bytes) -> int:
    """A key's 64-bit digest: xxh3 of its block hash, seeded with its namespace's number in the table."""
    return xxhash.xxh3_64_intdigest(block_hash, namespace_number)


@dataclass(frozen=True, slots=True)
class KeyBatch:
    """Keys copied out of a table in bulk (see :meth:`KeyTable.export`)."""

    namespaces: list[str]
    namespace_ids: np.ndarray
    hashes: np.ndarray  # one zero-padded row per key
    hash_lens: np.ndarray

    def keys(self) -> list[StoreKey]:
        width = self.hashes.shape[1] if self.hashes.ndim == 2 else 0
        flat = np.ascontiguousarray(self.hashes).tobytes()
        return [
            (self.namespaces[ns], flat[i * width : i * width + n])
            for i, (ns, n) in enumerate(zip(self.namespace_ids.tolist(), self.hash_lens.tolist(), strict=True))
        ]


class HashCells:
    """Block hashes by id, each in a fixed-width cell of one bytearray.

    Cells are as wide as the longest hash stored so far (engines use one length,
    usually 32 bytes), so a hash costs its length plus two bytes, not the 70-odd a
    bytes object and its list slot take. A longer hash widens every cell once.
    """

    __slots__ = ("_cells", "_lengths", "_width")

    def __init__(self) -> None:
        self._cells = bytearray()
        self._lengths = array("H")
        self._width = 0

    def __len__(self) -> int:
        return len(self._lengths)

    def append(self, block_hash: bytes) -> None:
        if len(block_hash) > self._width:
            self._widen(len(block_hash))
        self._cells += block_hash.ljust(self._width, b"\0")
        self._lengths.append(len(block_hash))

    def set(self, index: int, block_hash: bytes) -> None:
        if len(block_hash) > self._width:
            self._widen(len(block_hash))
        start = index * self._width
        self._cells[start : start + len(block_hash)] = block_hash
        self._lengths[index] = len(block_hash)

    def clear(self, index: int) -> None:
        self._lengths[index] = 0

    def get(self, index: int) -> bytes:
        start = index * self._width
        return bytes(self._cells[start : start + self._lengths[index]])

    def equals(self, index: int, block_hash: bytes) -> bool:
        if self._lengths[index] != len(block_hash):
            return False
        start = index * self._width
        return self._cells[start : start + len(block_hash)] == block_hash

    def nbytes(self) -> int:
        return len(self._cells) + self._lengths.itemsize * len(self._lengths)

    def rows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the cells at ``indices`` (one row each) and their hashes' lengths."""
        if not self._width:
            return np.zeros((len(indices), 0), dtype=np.uint8), np.zeros(len(indices), dtype=np.int64)
        cells = np.frombuffer(self._cells, dtype=np.uint8).reshape(-1, self._width)
        return cells[indices], np.frombuffer(self._lengths, dtype=np.uint16)[indices].astype(np.int64)

    def load(self, rows: np.ndarray, lengths: np.ndarray) -> None:
        """Take ``rows`` (one hash per row, zero-padded) as ids 0..n-1; only into empty cells."""
        if len(self._lengths):
            raise ValueError("load() fills empty cells only")
        self._width = rows.shape[1] if rows.ndim == 2 else 0
        self._cells = bytearray(np.ascontiguousarray(rows, dtype=np.uint8).tobytes())
        self._lengths = array("H", lengths.astype(np.uint16).tobytes())

    def _widen(self, width: int) -> None:
        cells = np.zeros((len(self._lengths), width), dtype=np.uint8)
        if self._width:
            cells[:, : self._width] = np.frombuffer(self._cells, dtype=np.uint8).reshape(-1, self._width)
        self._cells, self._width = bytearray(cells.tobytes()), width


class KeyTable:
    """Maps ``(namespace, block hash)`` to a small integer id, O(1) per operation.

    Args:
        expected: keys to size the table for at once (it grows as needed).
    """

    __slots__ = (
        "_digests",
        "_slot_ids",
        "_mask",
        "_mapped",
        "_hashes",
        "_ns",
        "_free",
        "_namespaces",
        "_ns_ids",
        "_digest_view",
        "_ids_view",
    )
    _digests: bytearray  # the table's columns, made by _resize
    _slot_ids: bytearray

    def __init__(self, expected: int = 0) -> None:
        self._namespaces: list[str] = []
        self._ns_ids: dict[str, int] = {}
        self._hashes = HashCells()  # by id; kept after unmapping until the id is released
        self._ns = array("I")  # namespace number by id
        self._free = array("i")  # released ids, reused last-in first-out
        self._mapped = 0
        self._resize(max(_MIN_SLOTS, 1 << int(expected / _MAX_LOAD).bit_length()))

    def __len__(self) -> int:
        """Keys mapped."""
        return self._mapped

    @property
    def id_bound(self) -> int:
        """One past the largest id ever handed out: the length columns indexed by id need."""
        return len(self._ns)

    def find(self, key: StoreKey) -> int:
        """The id mapped to ``key``, or -1."""
        namespace, block_hash = key
        ns = self._ns_ids.get(namespace)
        if ns is None:
            return _EMPTY
        slot = self._probe(ns, block_hash, xxhash.xxh3_64_intdigest(block_hash, ns))  # digest(), inlined: hot
        return self._ids_view[slot] if slot >= 0 else _EMPTY

    def insert(self, key: StoreKey) -> int:
        """Map ``key``, which must not be mapped, to a fresh id.

        Raises:
            KeyError: ``key`` is mapped already.
        """
        namespace, block_hash = key
        ns = self._namespace_id(namespace)
        if (self._mapped + 1) > _MAX_LOAD * len(self._ids_view):
            self._resize(len(self._ids_view) * 2)
        key_digest = digest(ns, block_hash)
        slot = self._probe(ns, block_hash, key_digest)
        if slot >= 0:
            raise KeyError(f"{key!r} is mapped already")
        ident = self._new_id(ns, block_hash)
        self._digest_view[-1 - slot], self._ids_view[-1 - slot] = key_digest, ident
        self._mapped += 1
        return ident

    def unmap(self, ident: int) -> None:
        """Forget which key ``ident`` holds for lookups; :meth:`key_of` still answers until released."""
        ns, block_hash = self._ns[ident], self._hashes.get(ident)
        slot = self._probe(ns, block_hash, digest(ns, block_hash))
        if slot < 0 or self._ids_view[slot] != ident:
            raise KeyError(f"id {ident} is not mapped")
        self._remove_slot(slot)
        self._mapped -= 1

    def release(self, ident: int) -> None:
        """Hand an unmapped id back for reuse."""
        self._hashes.clear(ident)
        self._free.append(ident)

    def key_of(self, ident: int) -> StoreKey:
        return self._namespaces[self._ns[ident]], self._hashes.get(ident)

    def namespace_of(self, ident: int) -> str:
        return self._namespaces[self._ns[ident]]

    def load(
        self,
        namespaces: list[str],
        namespace_ids: np.ndarray,
        hashes: np.ndarray,
        hash_lens: np.ndarray,
        digests: np.ndarray,
    ) -> None:
        """Map n distinct keys at once, as ids 0..n-1 in the order given (a rebuild at start).

        Args:
            namespaces: the keys' namespaces, each once; ``namespace_ids`` indexes them per key.
            hashes: one block hash per row, zero-padded; ``hash_lens`` gives each one's length.
            digests: each key's :func:`digest`.

        Raises:
            ValueError: the table is not empty.
        """
        if len(self._ns) or self._mapped:
            raise ValueError("load() fills an empty table only")
        table_ids = np.array([self._namespace_id(name) for name in namespaces], dtype=np.uint32)
        self._hashes.load(hashes, hash_lens)
        self._ns = array("I", table_ids[namespace_ids].tobytes() if len(namespace_ids) else b"")
        self._mapped = len(digests)
        self._resize(
            max(_MIN_SLOTS, 1 << int(len(digests) / _MAX_LOAD).bit_length()),
            (digests.astype(np.uint64), np.arange(len(digests), dtype=np.int32)),
        )

    def namespace_number(self, namespace: str) -> int:
        """The number this table gives ``namespace`` (the seed of its keys' digests)."""
        return self._namespace_id(namespace)

    def export(self, ids: np.ndarray) -> KeyBatch:
        """The keys of ``ids`` as arrays, copied in bulk: turn them into tuples outside a lock."""
        rows, lengths = self._hashes.rows(ids)
        numbers = (
            np.frombuffer(self._ns, dtype=np.uint32)[ids].astype(np.int64)
            if len(ids)
            else (np.zeros(0, dtype=np.int64))
        )
        return KeyBatch(list(self._namespaces), numbers, rows, lengths)

    def mapped(self) -> np.ndarray:
        """Every mapped id, in table order (no particular meaning)."""
        ids = np.frombuffer(self._slot_ids, dtype=np.int32)
        mapped: np.ndarray = ids[ids != _EMPTY].astype(np.int64)
        return mapped

    def mapped_ids(self) -> Iterator[int]:
        """Every mapped id, in table order (no particular meaning)."""
        ids = np.frombuffer(self._slot_ids, dtype=np.int32)
        return iter(ids[ids != _EMPTY].tolist())

    def nbytes(self) -> int:
        """Bytes this table holds (arrays, the hashes and their list), for benchmarks and tests."""
        return len(self._digests) + len(self._slot_ids) + self._hashes.nbytes() + self._ns.itemsize * len(self._ns)

    # -- internals ------------------------------------------------------------

    def _namespace_id(self, namespace: str) -> int:
        ns = self._ns_ids.get(namespace)
        if ns is None:
            ns = self._ns_ids[namespace] = len(self._namespaces)
            self._namespaces.append(namespace)
        return ns

    def _new_id(self, ns: int, block_hash: bytes) -> int:
        if self._free:
            ident = self._free.pop()
            self._hashes.set(ident, block_hash)
            self._ns[ident] = ns
            return ident
        self._hashes.append(block_hash)
        self._ns.append(ns)
        return len(self._ns) - 1

    def _probe(self, ns: int, block_hash: bytes, key_digest: int) -> int:
        """The table slot holding this key; where it is absent, ``-1 - s`` for the empty slot ``s`` ending its probe."""
        digests, ids, mask = self._digest_view, self._ids_view, self._mask
        slot = key_digest & mask
        while (ident := ids[slot]) != _EMPTY:
            # the digest almost always decides: the full key is compared once, on a match
            if digests[slot] == key_digest and self._hashes.equals(ident, block_hash) and self._ns[ident] == ns:
                return slot
            slot = (slot + 1) & mask
        return -1 - slot

    def _place(self, key_digest: int, ident: int) -> None:
        ids, mask = self._ids_view, self._mask
        slot = key_digest & mask
        while ids[slot] != _EMPTY:
            slot = (slot + 1) & mask
        self._digest_view[slot] = key_digest
        ids[slot] = ident

    def _remove_slot(self, hole: int) -> None:
        """Empty ``hole`` and shift later members of its run back, so every probe path stays unbroken."""
        digests, ids, mask = self._digest_view, self._ids_view, self._mask
        slot = hole
        while True:
            slot = (slot + 1) & mask
            if ids[slot] == _EMPTY:
                break
            home = digests[slot] & mask
            # The member may fill the hole unless its home lies cyclically in (hole, slot].
            if (slot - home) & mask >= (slot - hole) & mask:
                digests[hole], ids[hole] = digests[slot], ids[slot]
                hole = slot
        ids[hole] = _EMPTY

    def _resize(self, slots: int, members: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Rebuild the table with ``slots`` slots (a power of two), placing its members (or ``members``) in bulk."""
        if members is None:
            old = getattr(self, "_slot_ids", None)
            ids = np.zeros(0, dtype=np.int32) if old is None else np.frombuffer(old, dtype=np.int32)
            keep = ids != _EMPTY
            members = (
                np.zeros(0, np.uint64) if old is None else np.frombuffer(self._digests, np.uint64)[keep],
                ids[keep],
            )
        digests_in, ids_in = members
        self._digests = bytearray(8 * slots)
        self._slot_ids = bytearray(np.full(slots, _EMPTY, dtype=np.int32).tobytes())
        self._digest_view = memoryview(self._digests).cast("Q")
        self._ids_view = memoryview(self._slot_ids).cast("i")
        self._mask = slots - 1
        overflow = _bulk_place(
            np.frombuffer(self._digests, np.uint64), np.frombuffer(self._slot_ids, np.int32), digests_in, ids_in
        )
        for key_digest, ident in overflow:
            self._place(key_digest, ident)


def _bulk_place(
    digests: np.ndarray, ids: np.ndarray, new_digests: np.ndarray, new_ids: np.ndarray
) -> list[tuple[int, int]]:
    """Place members into an empty table in one vectorised pass.

    Sorted by home slot, member k goes to ``max(home_k, slot_{k-1} + 1)``: every run
    stays contiguous from its home, which is all linear probing asks. Members that
    would run past the end are returned, to be placed one by one (they wrap).
    """
    if not len(new_ids):
        return []
    mask = len(ids) - 1
    homes = (new_digests & np.uint64(mask)).astype(np.int64)
    order = np.argsort(homes, kind="stable")
    homes, new_digests, new_ids = homes[order], new_digests[order], new_ids[order]
    steps = np.arange(len(homes), dtype=np.int64)
    slots = np.maximum.accumulate(homes - steps) + steps
    inside = slots <= mask
    digests[slots[inside]] = new_digests[inside]
    ids[slots[inside]] = new_ids[inside]
    return list(zip(new_digests[~inside].tolist(), new_ids[~inside].tolist(), strict=True))
