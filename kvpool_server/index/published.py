"""The published index's writer: readable DRAM blocks, where same-node readers find them.

The daemon's own index (:class:`~kvpool_server.index.keys.KeyTable` and its columns)
grows and lives in Python arrays, so it cannot be mapped by another process. Beside
it the DRAM tier keeps this fixed-size, lossy table in shared memory (layout and the
readers' side in :mod:`kvpool_client.core.wire.published`): a block is published when it is
committed and withdrawn when it is unlinked (deleted, evicted, found corrupt). A block
whose probe window is full is not published (counted): readers then ask the daemon,
as they would without the table. The tier calls every method under its lock, so there
is one writer.

Each table entry also remembers which block it holds (4 bytes an entry, and 4 bytes a
block id for the way back), so withdrawing needs no probe and the hit marks readers
leave per entry (:class:`HitMarks`) lead back to blocks.
"""

from __future__ import annotations

from array import array

import numpy as np

from kvpool_client.core.wire.published import (
    CHECKSUM,
    DIGEST_HI,
    DIGEST_LO,
    ENTRY_WORDS,
    GENERATION,
    HEADER_BYTES,
    HEADER_WORDS,
    HEARTBEAT_WORD,
    LENGTH,
    OFFSET,
    RETIRED,
    STATE_WORD,
    IndexHeader,
    dirty_words,
    encode_header,
    key_digest,
    marks_bytes,
)
from kvpool_server.index.entry import StoreKey

_NONE = -1


class PublishedIndex:
    """Publishes blocks into a shared table; the only writer of it.

    Args:
        table: at least ``table_bytes(entries)`` bytes of zeros, 8-byte aligned (in the arena file).
        entries: table size, a power of two.
        arena_id: the arena's id, written into the header.
        probe_limit: entries a key may lie past its home entry, plus one.

    Raises:
        ValueError: ``entries`` is not a power of two, ``probe_limit`` is out of 1..entries,
            or ``table`` is too small.
    """

    __slots__ = ("header", "_words", "_mask", "_entry_of", "_block_of", "_namespaces", "published")

    def __init__(self, table: memoryview, entries: int, arena_id: int, probe_limit: int) -> None:
        if entries <= 0 or entries & (entries - 1) or not 0 < probe_limit <= entries:
            raise ValueError(
                f"a published index needs a power-of-two size and a probe limit within it, "
                f"got {entries} and {probe_limit}"
            )
        self.header = IndexHeader(arena_id, entries, probe_limit)
        if len(table) < self.header.nbytes:
            raise ValueError(
                f"a published index of {entries} entries needs {self.header.nbytes} bytes, got {len(table)}"
            )
        table[:HEADER_BYTES] = encode_header(self.header)
        self._words = table[: self.header.nbytes].cast("Q")
        self._mask = entries - 1
        self._entry_of = array("i")  # by block id: its entry, or -1
        self._block_of = array("i", [_NONE]) * entries  # by entry: its block id, or -1
        self._namespaces: dict[str, bytes] = {}
        self.published = 0  # live entries

    @property
    def words(self) -> memoryview:
        """The table, header and entries, as u64 words (what a compiled reader searches)."""
        return self._words

    def digest(self, key: StoreKey) -> tuple[int, int]:
        """``key``'s digest (see :func:`~kvpool_client.core.wire.published.key_digest`); needs no lock."""
        namespace = self._namespaces.get(key[0])
        if namespace is None:
            namespace = self._namespaces[key[0]] = key[0].encode()
        return key_digest(namespace, key[1])

    def publish(
        self, block: int, digest: tuple[int, int], offset: int, length: int, checksum: int, generation: int
    ) -> bool:
        """Make block ``block``, a readable block whose key has ``digest``, findable; False: its probe window is full.

        ``generation`` is the slot's generation now: the first free of the slot
        changes it, so an entry that outlives its block fails the readers' check.
        """
        entry_of = self._entry_of
        if block >= len(entry_of):
            entry_of.extend(array("i", [_NONE]) * max(1024, block + 1 - len(entry_of), len(entry_of)))
        elif entry_of[block] >= 0:
            self.withdraw(block)  # never two entries for one block
        low, high = digest
        index = low & self._mask
        if self._words[_base(index) + DIGEST_LO]:  # the home entry is taken: probe on
            index = self._free_entry(low, high)
            if index < 0:
                return False
        self._write(index, low, high, offset, length, checksum, generation)
        entry_of[block], self._block_of[index] = index, block
        self.published += 1
        return True

    def withdraw(self, block: int) -> None:
        """Remove block ``block``'s entry, if it has one.

        The entry becomes a tombstone, or empty when the entry after it is empty (no
        key's window can then run through it); tombstones just before it go too.
        """
        if block >= len(self._entry_of) or (index := self._entry_of[block]) < 0:
            return
        self._entry_of[block], self._block_of[index] = _NONE, _NONE
        self.published -= 1
        words, mask = self._words, self._mask
        if words[_base((index + 1) & mask) + DIGEST_LO]:
            self._write(index, words[_base(index) + DIGEST_LO], words[_base(index) + DIGEST_HI], 0, 0, 0, 0)
            return
        for _ in range(mask + 1):  # empty it, then the tombstones before it
            self._write(index, 0, 0, 0, 0, 0, 0)
            index = (index - 1) & mask
            base = _base(index)
            if not words[base + DIGEST_LO] or words[base + LENGTH]:
                break

    def holds(self, block: int) -> bool:
        """Whether block ``block`` is published."""
        return block < len(self._entry_of) and self._entry_of[block] >= 0

    def block_at(self, index: int) -> int:
        """The block entry ``index`` holds, or -1."""
        return self._block_of[index]

    def beat(self, now_ns: int) -> None:
        """Renew the heartbeat (monotonic nanoseconds): readers trust the table while it is recent."""
        self._words[HEARTBEAT_WORD] = now_ns

    def retire(self) -> None:
        """Tell readers this table is no longer served (the daemon is stopping)."""
        self._words[STATE_WORD] = RETIRED

    def close(self) -> None:
        """Let go of the table's memory, so the arena can be unmapped."""
        self._words.release()

    def nbytes(self) -> int:
        """Bytes of private bookkeeping (the shared table itself is in the arena file)."""
        return self._entry_of.itemsize * (len(self._entry_of) + len(self._block_of))

    def _free_entry(self, low: int, high: int) -> int:
        """The first tombstone or empty entry of the digest's window; -1 when there is none.

        A live entry of the same digest would name another key (digests are identities
        here, and a block is withdrawn before its key can be stored again): it is
        withdrawn and nothing is published, so neither key is served from the table.
        """
        words, mask, free = self._words, self._mask, _NONE
        for step in range(self.header.probe_limit):
            index = (low + step) & mask
            base = _base(index)
            found = words[base + DIGEST_LO]
            if not found:
                return index if free < 0 else free
            if not words[base + LENGTH]:
                free = index if free < 0 else free
            elif found == low and words[base + DIGEST_HI] == high:
                self.withdraw(self._block_of[index])
                return _NONE
        return free

    def _write(self, index: int, low: int, high: int, offset: int, length: int, checksum: int, generation: int) -> None:
        """Rewrite one entry under its seqlock: ``seq`` odd while the fields change."""
        words, base = self._words, HEADER_WORDS + index * ENTRY_WORDS
        seq = words[base]
        words[base] = seq + 1
        words[base + DIGEST_LO], words[base + DIGEST_HI] = low, high
        words[base + OFFSET], words[base + LENGTH] = offset, length
        words[base + CHECKSUM], words[base + GENERATION] = checksum, generation
        words[base] = seq + 2


def _base(index: int) -> int:
    return HEADER_WORDS + index * ENTRY_WORDS


class HitMarks:
    """Same-node readers' marks of the entries they read through (the daemon's side).

    Readers store a coarse monotonic tick in an entry's mark, then set its chunk's
    dirty word. :meth:`drain` clears the dirty words first and then reads their chunks'
    marks, so a mark stored after its chunk was read sets the chunk dirty again and is
    seen by the next drain. x86-64 may still let the drain's loads pass its own clearing
    store, so a mark stored in that instant can lose its dirty word: a ``full`` drain
    compares every mark and finds it (a lost mark only delays a recency update).

    Args:
        region: ``marks_bytes(entries)`` shared, writable bytes (the marks file).
        entries: the table's size.
    """

    def __init__(self, region: memoryview, entries: int) -> None:
        if len(region) < marks_bytes(entries):
            raise ValueError(f"hit marks of {entries} entries need {marks_bytes(entries)} bytes, got {len(region)}")
        words = np.frombuffer(region, dtype=np.uint64, count=marks_bytes(entries) // 8)
        chunks = dirty_words(entries)
        self._dirty, self._marks = words[:chunks], words[chunks:]
        self._seen = np.zeros(entries, dtype=np.uint64)
        self._chunk = entries // chunks

    def drain(self, full: bool = False) -> list[int]:
        """Entries marked since the last drain, the least recently marked first.

        Args:
            full: compare every chunk's marks, dirty or not.
        """
        dirty = np.arange(len(self._dirty)) if full else np.flatnonzero(self._dirty)
        if not dirty.size:
            return []
        self._dirty[dirty] = 0
        picked = [self._changed(int(chunk)) for chunk in dirty]
        changed = np.concatenate(picked)
        ticks = self._seen[changed]
        ordered: list[int] = changed[np.argsort(ticks, kind="stable")].tolist()
        return ordered

    def _changed(self, chunk: int) -> np.ndarray:
        start = chunk * self._chunk
        marks = self._marks[start : start + self._chunk].copy()  # one read of what readers keep writing
        changed = np.flatnonzero(marks != self._seen[start : start + self._chunk])
        self._seen[start + changed] = marks[changed]
        return changed + start

    def close(self) -> None:
        """Drop the views of the region, so its mapping can be closed."""
        del self._dirty, self._marks
