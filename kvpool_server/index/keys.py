"""Block keys to dense integer ids, in flat arrays: the index's only per-key map.

A daemon holds millions of blocks, so a dict of key tuples to objects (about 680
bytes a block, measured) is too dear. Here a key costs its hash's bytes object in
one list, a namespace number, and a slot in an open-addressing table of 64-bit
digests and 32-bit ids (linear probing, at most 70% full, deletion by backward shift so
no tombstones pile up). Everything else a tier knows about a block lives in
columns indexed by the id (:mod:`kvpool_server.index.columns`).

An id outlives its key's mapping on purpose: a block deleted while a reader holds
it is unmapped at once (a new block of the same key may be stored) and its id
returns to the free list only when the tier releases it.

Scalar access goes through memoryviews, which index faster than numpy and give
plain ints; numpy is used where whole arrays move at once (growth).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator

import numpy as np
import xxhash

from kvpool_server.index.entry import StoreKey

_EMPTY = -1
_MIN_SLOTS = 16
_MAX_LOAD = 0.7


def _digest(namespace_id: int, block_hash: bytes) -> int:
    return xxhash.xxh3_64_intdigest(block_hash, namespace_id)


class KeyTable:
    """Maps ``(namespace, block hash)`` to a small integer id, O(1) per operation.

    Args:
        expected: keys to size the table for at once (it grows as needed).
    """

    __slots__ = ("_digests", "_slot_ids", "_mask", "_mapped", "_hashes", "_ns", "_free",
                 "_namespaces", "_ns_ids", "_digest_view", "_ids_view")

    def __init__(self, expected: int = 0) -> None:
        self._namespaces: list[str] = []
        self._ns_ids: dict[str, int] = {}
        self._hashes: list[bytes] = []  # by id; kept after unmapping until the id is released
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
        return len(self._hashes)

    def find(self, key: StoreKey) -> int:
        """The id mapped to ``key``, or -1."""
        namespace, block_hash = key
        ns = self._ns_ids.get(namespace)
        if ns is None:
            return _EMPTY
        slot = self._slot_of(ns, block_hash)
        return self._ids_view[slot] if slot >= 0 else _EMPTY

    def insert(self, key: StoreKey) -> int:
        """Map ``key``, which must not be mapped, to a fresh id.

        Raises:
            KeyError: ``key`` is mapped already.
        """
        namespace, block_hash = key
        ns = self._namespace_id(namespace)
        if self._slot_of(ns, block_hash) >= 0:
            raise KeyError(f"{key!r} is mapped already")
        if (self._mapped + 1) > _MAX_LOAD * len(self._ids_view):
            self._resize(len(self._ids_view) * 2)
        ident = self._new_id(ns, block_hash)
        self._place(_digest(ns, block_hash), ident)
        self._mapped += 1
        return ident

    def unmap(self, ident: int) -> None:
        """Forget which key ``ident`` holds for lookups; :meth:`key_of` still answers until released."""
        slot = self._slot_of(self._ns[ident], self._hashes[ident])
        if slot < 0 or self._ids_view[slot] != ident:
            raise KeyError(f"id {ident} is not mapped")
        self._remove_slot(slot)
        self._mapped -= 1

    def release(self, ident: int) -> None:
        """Hand an unmapped id back for reuse."""
        self._hashes[ident] = b""
        self._free.append(ident)

    def key_of(self, ident: int) -> StoreKey:
        return self._namespaces[self._ns[ident]], self._hashes[ident]

    def namespace_of(self, ident: int) -> str:
        return self._namespaces[self._ns[ident]]

    def mapped_ids(self) -> Iterator[int]:
        """Every mapped id, in table order (no particular meaning)."""
        ids = np.frombuffer(self._slot_ids, dtype=np.int32)
        return iter(ids[ids != _EMPTY].tolist())

    def nbytes(self) -> int:
        """Bytes this table holds (arrays, the hashes and their list), for benchmarks and tests."""
        hashes = sys.getsizeof(self._hashes) + sum(map(sys.getsizeof, self._hashes))
        return len(self._digests) + len(self._slot_ids) + hashes + self._ns.itemsize * len(self._ns)

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
            self._hashes[ident] = block_hash
            self._ns[ident] = ns
            return ident
        self._hashes.append(block_hash)
        self._ns.append(ns)
        return len(self._hashes) - 1

    def _slot_of(self, ns: int, block_hash: bytes) -> int:
        """The table slot holding this key, or -1."""
        digest = _digest(ns, block_hash)
        digests, ids, mask = self._digest_view, self._ids_view, self._mask
        slot = digest & mask
        while (ident := ids[slot]) != _EMPTY:
            if digests[slot] == digest and self._hashes[ident] == block_hash and self._ns[ident] == ns:
                return slot
            slot = (slot + 1) & mask
        return -1

    def _place(self, digest: int, ident: int) -> None:
        ids, mask = self._ids_view, self._mask
        slot = digest & mask
        while ids[slot] != _EMPTY:
            slot = (slot + 1) & mask
        self._digest_view[slot] = digest
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

    def _resize(self, slots: int) -> None:
        """Rebuild the table with ``slots`` slots (a power of two), placing members in bulk."""
        old = getattr(self, "_slot_ids", None)
        members = np.zeros(0, dtype=np.int32) if old is None else np.frombuffer(old, dtype=np.int32)
        keep = members != _EMPTY
        digests_in = np.zeros(0, dtype=np.uint64) if old is None else np.frombuffer(self._digests, np.uint64)[keep]
        ids_in = members[keep]
        self._digests = bytearray(8 * slots)
        self._slot_ids = bytearray(np.full(slots, _EMPTY, dtype=np.int32).tobytes())
        self._digest_view = memoryview(self._digests).cast("Q")
        self._ids_view = memoryview(self._slot_ids).cast("i")
        self._mask = slots - 1
        overflow = _bulk_place(np.frombuffer(self._digests, np.uint64), np.frombuffer(self._slot_ids, np.int32),
                               digests_in, ids_in)
        for digest, ident in overflow:
            self._place(digest, ident)


def _bulk_place(digests: np.ndarray, ids: np.ndarray, new_digests: np.ndarray, new_ids: np.ndarray) -> list[tuple[int, int]]:
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
