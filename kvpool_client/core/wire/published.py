"""Layout of a daemon's published index, shared by the daemon (the one writer) and same-node readers.

A same-node client that knows where a block lies copies it out of the arena without
asking the daemon (:mod:`kvpool_client.transport.shm`). The published index tells it
where: the daemon publishes each readable DRAM block as ``key -> (offset, length,
checksum, slot generation)`` in a fixed-size table in shared memory, and readers look
keys up without a lock. It is a cache of locations, not the daemon's index: a block
missing from it (its probe window was full) is only read the slower way, by asking.
The reader validates every hit with the slot generation before and after its copy,
as for a location the daemon answered, so a stale entry costs a fall back, never a
wrong byte.

A key is its 128-bit digest here: xxh3-128 of the namespace's UTF-8 bytes prefixed by
their length (one byte: namespaces have at most 255) and the block hash. Both ends
compute it, and a digest match is taken as a key match (two keys sharing a 128-bit
digest are not expected in the life of the universe). Digest 0 marks an empty entry,
so a key whose digest is 0 is given 1 instead.

Layout (8-byte words, little endian: readers run on x86-64 only), at the offset server
info announces, inside the arena file after the slot generations::

    magic "KVPIDX01" | arena_id | entries | probe_limit | state | heartbeat | zero padding to 64 bytes
    entries * 64 bytes: seq | digest_lo | digest_hi | offset | length | checksum | generation | spare

``entries`` is a power of two. A key lives within ``probe_limit`` entries of its home
entry (``digest_lo mod entries``), linear probing with wrap-around; an empty entry
(digest 0) ends a probe. A withdrawn block leaves a tombstone (digest kept, length 0):
probes go on past it, and a publish reuses it.

``state`` is :data:`LIVE` while the daemon serves this arena and :data:`RETIRED` once
it shut down: a reader of a retired table maps the node's new arena. A daemon killed
outright cannot say so; ``heartbeat`` (monotonic nanoseconds, which every process of
a host shares) tells: the daemon renews it every :data:`BEAT_INTERVAL_S`, and a reader
that finds it older than :data:`BEAT_LIMIT_NS` asks the daemon instead, whose answer
names its arena (a restarted daemon's is another one).

Readers mark each read through an entry in a separate *hit marks* file (the arena is
read-only to them), so the daemon's eviction order still sees those reads, batched:
the daemon compares the marks every half second or so and refreshes the marked blocks,
least recently marked first. Its layout (u64 words)::

    dirty_words(entries) words: word c is set when a mark of chunk c (MARK_CHUNK entries) changed
    entries words: per entry, monotonic nanoseconds >> MARK_SHIFT of its latest read

Each entry is a seqlock: the writer makes ``seq`` odd, writes the fields, then makes it
even again. A reader reads ``seq``, the fields, and ``seq`` again, and trusts the
fields only if both reads are equal and even. Each word is read and written whole
(aligned 8-byte loads and stores), and x86-64 keeps stores in order and loads in
order, which is all the argument needs; see :mod:`kvpool_client.transport.shm`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

import xxhash

MAGIC = b"KVPIDX01"
HEADER_BYTES = 64
ENTRY_BYTES = 64
ENTRY_WORDS = ENTRY_BYTES // 8
HEADER_WORDS = HEADER_BYTES // 8
DEFAULT_PROBE_LIMIT = 16
LIVE, RETIRED = 1, 2
_HEADER = struct.Struct("<8sQQQQQ")
STATE_WORD, HEARTBEAT_WORD = 4, 5  # the header words holding ``state`` and ``heartbeat``
BEAT_INTERVAL_S = 0.1
BEAT_LIMIT_NS = 1_000_000_000  # a table whose daemon has not beaten for this long is not trusted
# Word offsets within an entry.
SEQ, DIGEST_LO, DIGEST_HI, OFFSET, LENGTH, CHECKSUM, GENERATION = range(7)
_MASK64 = (1 << 64) - 1
MARK_CHUNK = 4096  # entries per dirty word of the hit marks
MARK_SHIFT = 20  # a mark is monotonic nanoseconds >> 20: a tick of about a millisecond


@dataclass(frozen=True, slots=True)
class IndexHeader:
    arena_id: int  # the arena this table describes (as in the slot generations' header)
    entries: int  # a power of two
    probe_limit: int
    state: int = LIVE
    heartbeat: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the header and entries."""
        return table_bytes(self.entries)


class PublishedEntry(NamedTuple):  # a tuple: made on every read through the table, at a third of a dataclass's cost
    """One block as a reader found it; ``slot`` is its entry's number in the table (where a hit is marked)."""

    slot: int
    offset: int
    length: int
    checksum: int
    generation: int


def table_bytes(entries: int) -> int:
    """Bytes a table of ``entries`` entries takes, header included."""
    return HEADER_BYTES + ENTRY_BYTES * entries


def aligned_offset(offset: int) -> int:
    """``offset`` rounded up to a cache line: where the table starts, so no entry straddles two lines."""
    return -(-offset // ENTRY_BYTES) * ENTRY_BYTES


def dirty_words(entries: int) -> int:
    """Dirty words of a hit marks file: one per chunk of :data:`MARK_CHUNK` entries (at least one)."""
    return max(1, entries // MARK_CHUNK)


def marks_bytes(entries: int) -> int:
    """Bytes of the hit marks file of a table of ``entries`` entries."""
    return 8 * (dirty_words(entries) + entries)


def key_digest(namespace: bytes, block_hash: bytes) -> tuple[int, int]:
    """(low, high) 64-bit halves of a key's digest, never both 0.

    Args:
        namespace: the namespace's UTF-8 bytes (at most 255).
        block_hash: the block's hash.
    """
    value = xxhash.xxh3_128_intdigest(bytes((len(namespace),)) + namespace + block_hash) or 1
    return value & _MASK64, value >> 64


def encode_header(header: IndexHeader) -> bytes:
    packed = _HEADER.pack(MAGIC, header.arena_id, header.entries, header.probe_limit, header.state, header.heartbeat)
    return packed.ljust(HEADER_BYTES, b"\0")


def decode_header(data: bytes | memoryview) -> IndexHeader:
    """Raises ValueError: not a published index header of this version, or an impossible one."""
    if len(data) < HEADER_BYTES:
        raise ValueError(f"published index header is {len(data)} bytes, expected {HEADER_BYTES}")
    magic, arena_id, entries, probe_limit, state, heartbeat = _HEADER.unpack(bytes(data[: _HEADER.size]))
    if magic != MAGIC:
        raise ValueError(f"not a kvpool published index (magic {magic!r})")
    if entries <= 0 or entries & (entries - 1) or not 0 < probe_limit <= entries:
        raise ValueError(f"published index of {entries} entries with probe limit {probe_limit}")
    return IndexHeader(arena_id, entries, probe_limit, state, heartbeat)


class PublishedReader:
    """Lock-free lookups in a published table (a reader never writes it).

    Args:
        table: the table's bytes, header first, 8-byte aligned (a read-only mapping).

    Raises:
        ValueError: ``table`` holds no valid header, or is shorter than its entries.
    """

    def __init__(self, table: memoryview) -> None:
        self.header = decode_header(table)
        if len(table) < self.header.nbytes:
            raise ValueError(f"published index needs {self.header.nbytes} bytes, {len(table)} mapped")
        self.words = table[: self.header.nbytes].cast("Q")  # the compiled reader reads it too
        self._mask = self.header.entries - 1
        self._probes = range(self.header.probe_limit)
        self._namespaces: dict[str, bytes] = {}

    @property
    def live(self) -> bool:
        """Whether the daemon still serves this table (False once it shut down)."""
        return self.words[STATE_WORD] == LIVE

    def trusted_until(self) -> int:
        """When (monotonic nanoseconds) the table stops being trusted unless the daemon beats again."""
        return self.words[HEARTBEAT_WORD] + BEAT_LIMIT_NS

    def find(self, namespace: str, block_hash: bytes) -> PublishedEntry | None:
        """The block's live entry, read consistently; None: not published, being rewritten, or withdrawn.

        (One function: it runs on every same-node get the compiled reader does not serve.)
        """
        low, high = self.digest(namespace, block_hash)
        words, mask = self.words, self._mask
        for step in self._probes:
            index = (low + step) & mask
            base = HEADER_WORDS + index * ENTRY_WORDS
            seq = words[base]
            found = words[base + DIGEST_LO]
            if not found:
                return None  # empty: the key lies in no later entry
            if found != low or words[base + DIGEST_HI] != high:
                continue  # another key, or a tombstone: probes go on past both
            offset, length = words[base + OFFSET], words[base + LENGTH]
            checksum, generation = words[base + CHECKSUM], words[base + GENERATION]
            if seq & 1 or words[base] != seq:
                return None  # the writer is at this entry: ask the daemon instead
            if length:
                return PublishedEntry(index, offset, length, checksum, generation)
        return None

    def digest(self, namespace: str, block_hash: bytes) -> tuple[int, int]:
        """:func:`key_digest` of the key, each namespace's prefix made once."""
        prefix = self._namespaces.get(namespace)
        if prefix is None:
            raw = namespace.encode()
            prefix = self._namespaces[namespace] = bytes((len(raw),)) + raw
        value = xxhash.xxh3_128_intdigest(prefix + block_hash) or 1
        return value & _MASK64, value >> 64

    def release(self) -> None:
        """Let go of the table's memory (so its mapping can be closed)."""
        self.words.release()


class MarkWriter:
    """A reader's side of the hit marks: one mark and one dirty word stored per read.

    Args:
        region: the marks file, mapped writable.
        entries: the table's size.

    Raises:
        ValueError: ``region`` is too small.
    """

    def __init__(self, region: memoryview, entries: int) -> None:
        if len(region) < marks_bytes(entries):
            raise ValueError(f"hit marks of {entries} entries need {marks_bytes(entries)} bytes, {len(region)} mapped")
        self.words = region[: marks_bytes(entries)].cast("Q")  # the compiled reader marks in it too
        self.first = dirty_words(entries)  # where the marks start, after the dirty words
        self.shift = (entries // self.first).bit_length() - 1  # entry >> shift: its dirty word

    def mark(self, index: int, tick: int) -> None:
        """Entry ``index`` was read at ``tick``: the mark first, then its chunk's dirty word."""
        self.words[self.first + index] = tick
        self.words[index >> self.shift] = 1
