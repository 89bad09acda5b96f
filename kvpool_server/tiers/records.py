"""The on-disk record format of the SSD tier, as pure functions (no I/O of its own).

A record is a fixed header, then the key (namespace bytes, then hash bytes), then
the payload. All integers are little-endian::

    offset size field
         0    4 magic            b"KVSR"
         4    1 version          1
         5    1 flags            RecordFlags; unknown bits are corruption
         6    2 namespace_len    <= MAX_NAMESPACE_LEN
         8    2 hash_len         1 .. MAX_HASH_LEN
        10    2 reserved         0
        12    8 payload_len      <= MAX_PAYLOAD_LEN
        20    8 payload_checksum xxh3-64 of the payload (the DRAM tier's block checksum)
        28    4 key_checksum     xxh32 of namespace bytes + hash bytes
        32    4 header_checksum  xxh32 of bytes 0..31

The header checksum makes the lengths trustworthy before anything is read past the
header; the key checksum means a flipped key byte cannot file good bytes under a
wrong key; the payload checksum is verified wherever the payload leaves the disk.

:func:`walk_records` parses a run of records through a caller-supplied ``read_at``
function, so the recovery rules are testable on a bytes buffer.

Two error families: ``ValueError`` when the caller asks to encode something out of
bounds, :class:`CorruptRecord` when bytes read back do not form a valid record.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import xxhash

from kvpool_client.core.errors import ErrorCode, KVPoolError

MAGIC = b"KVSR"
VERSION = 1
MAX_NAMESPACE_LEN = 1024
MAX_HASH_LEN = 256
MAX_PAYLOAD_LEN = (1 << 32) - 1
_CHUNK = 1 << 20  # read size when hashing payloads or checking a zero tail

ReadAt = Callable[[int, int], bytes]  # (offset, size) -> up to size bytes at offset

_FIELDS = struct.Struct("<4sBBHHHQQI")  # everything the header checksum covers
_CHECKSUM = struct.Struct("<I")
HEADER_SIZE = _FIELDS.size + _CHECKSUM.size  # 36


class RecordFlags(enum.IntFlag):
    """Per-record flags; any other bit set is corruption."""

    NONE = 0
    TOMBSTONE = 1  # the key was deleted: no payload; it hides the key's older records


_KNOWN_FLAGS = int(RecordFlags.TOMBSTONE)


class CorruptRecord(KVPoolError):
    """Bytes read from disk are not a valid record, or fail a checksum.

    The bytes must be treated as a miss; they are never served.
    """

    code = ErrorCode.CHECKSUM_MISMATCH


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """A decoded, checksum-verified record header."""

    flags: RecordFlags
    namespace_len: int
    hash_len: int
    payload_len: int
    payload_checksum: int
    key_checksum: int

    @property
    def key_len(self) -> int:
        return self.namespace_len + self.hash_len

    @property
    def record_len(self) -> int:
        """Header + key + payload: how many bytes this record occupies."""
        return HEADER_SIZE + self.key_len + self.payload_len


def payload_checksum(payload: memoryview | bytes) -> int:
    """xxh3-64 of the payload: the same value the DRAM tier stores per block."""
    return xxhash.xxh3_64_intdigest(payload)


def key_checksum(namespace: bytes, hash_: bytes) -> int:
    """xxh32 over namespace then hash, streamed (no concatenation copy)."""
    hasher = xxhash.xxh32()
    hasher.update(namespace)
    hasher.update(hash_)
    return hasher.intdigest()


def _check_bounds(namespace_len: int, hash_len: int, payload_len: int) -> str | None:
    """Return why the lengths are out of bounds, or None when they are fine."""
    if not 0 <= namespace_len <= MAX_NAMESPACE_LEN:
        return f"namespace length {namespace_len} not in 0..{MAX_NAMESPACE_LEN}"
    if not 1 <= hash_len <= MAX_HASH_LEN:
        return f"hash length {hash_len} not in 1..{MAX_HASH_LEN}"
    if not 0 <= payload_len <= MAX_PAYLOAD_LEN:
        return f"payload length {payload_len} not in 0..{MAX_PAYLOAD_LEN}"
    return None


def encode_record_header(
    namespace: bytes,
    hash_: bytes,
    payload_len: int,
    payload_sum: int,
    flags: RecordFlags = RecordFlags.NONE,
) -> bytes:
    """Build the fixed header for a record with this key and payload.

    Args:
        namespace: namespace bytes (may be empty).
        hash_: block hash bytes (non-empty).
        payload_len: payload length in bytes.
        payload_sum: :func:`payload_checksum` of the payload.
        flags: record flags.

    Returns:
        ``HEADER_SIZE`` bytes; the record is header + namespace + hash + payload.

    Raises:
        ValueError: a length is out of bounds, or flags/checksum do not fit.
    """
    problem = _check_bounds(len(namespace), len(hash_), payload_len)
    if problem is not None:
        raise ValueError(problem)
    if int(flags) & ~_KNOWN_FLAGS or not 0 <= payload_sum < 1 << 64:
        raise ValueError("unknown flags or checksum out of range")
    fields = _FIELDS.pack(
        MAGIC,
        VERSION,
        int(flags),
        len(namespace),
        len(hash_),
        0,
        payload_len,
        payload_sum,
        key_checksum(namespace, hash_),
    )
    return fields + _CHECKSUM.pack(xxhash.xxh32_intdigest(fields))


def decode_record_header(buf: bytes | bytearray | memoryview) -> RecordHeader:
    """Decode and verify the first ``HEADER_SIZE`` bytes of ``buf``.

    Args:
        buf: at least ``HEADER_SIZE`` bytes; extra bytes are ignored.

    Returns:
        The header, with its checksum, magic, version, flags and bounds verified.

    Raises:
        CorruptRecord: too short, bad magic, version, flags, bounds or checksum.
    """
    view = memoryview(buf)
    if len(view) < HEADER_SIZE:
        raise CorruptRecord(f"header truncated: {len(view)} < {HEADER_SIZE} bytes")
    fields = view[: _FIELDS.size]
    (stored_sum,) = _CHECKSUM.unpack_from(view, _FIELDS.size)
    if xxhash.xxh32_intdigest(fields) != stored_sum:
        raise CorruptRecord("header checksum mismatch")
    magic, version, flags, ns_len, hash_len, reserved, pay_len, pay_sum, key_sum = _FIELDS.unpack(fields)
    if magic != MAGIC or version != VERSION or reserved != 0 or flags & ~_KNOWN_FLAGS:
        raise CorruptRecord(f"bad magic/version/flags: {magic!r} v{version} f{flags}")
    problem = _check_bounds(ns_len, hash_len, pay_len)
    if problem is not None:
        raise CorruptRecord(problem)
    return RecordHeader(RecordFlags(flags), ns_len, hash_len, pay_len, pay_sum, key_sum)


def split_key(header: RecordHeader, key_bytes: bytes | memoryview) -> tuple[bytes, bytes]:
    """Verify the key bytes that follow ``header`` and split them.

    Args:
        header: the record's decoded header.
        key_bytes: exactly ``header.key_len`` bytes read after the header.

    Returns:
        ``(namespace, hash)`` as bytes.

    Raises:
        CorruptRecord: wrong length or key checksum mismatch.
    """
    if len(key_bytes) != header.key_len:
        raise CorruptRecord(f"key truncated: {len(key_bytes)} != {header.key_len}")
    namespace = bytes(key_bytes[: header.namespace_len])
    hash_ = bytes(key_bytes[header.namespace_len :])
    if key_checksum(namespace, hash_) != header.key_checksum:
        raise CorruptRecord("key checksum mismatch")
    return namespace, hash_


def verify_payload(header: RecordHeader, payload: memoryview | bytes) -> None:
    """Raise :class:`CorruptRecord` unless ``payload`` matches ``header``."""
    if len(payload) != header.payload_len:
        raise CorruptRecord(f"payload length {len(payload)} != {header.payload_len}")
    if payload_checksum(payload) != header.payload_checksum:
        raise CorruptRecord("payload checksum mismatch")


class WalkStop(enum.Enum):
    """Why a walk over a run of records stopped."""

    END, TORN, CORRUPT = range(3)  # clean end; partial or zero-filled tail; bad header


@dataclass(slots=True)
class WalkResult:
    """How a walk ended; filled in as it goes."""

    good_end: int = 0  # just past the last record whose header was sound
    stop: WalkStop = WalkStop.END
    corrupt: int = 0  # records skipped, plus one for a bad header that stopped the walk


@dataclass(frozen=True, slots=True)
class FoundRecord:
    offset: int
    header: RecordHeader
    namespace: bytes
    hash: bytes


def _is_zero(read_at: ReadAt, offset: int, end: int) -> bool:
    while offset < end:
        chunk = read_at(offset, min(_CHUNK, end - offset))
        if not chunk or chunk.count(0) != len(chunk):
            return False
        offset += len(chunk)
    return True


def _payload_ok(read_at: ReadAt, header: RecordHeader, offset: int) -> bool:
    """Stream the payload at ``offset`` through xxh3-64 and compare."""
    hasher = xxhash.xxh3_64()
    left = header.payload_len
    while left:
        chunk = read_at(offset, min(_CHUNK, left))
        if not chunk:
            return False
        hasher.update(chunk)
        offset, left = offset + len(chunk), left - len(chunk)
    return hasher.intdigest() == header.payload_checksum


def walk_records(read_at: ReadAt, size: int, verify: bool, result: WalkResult) -> Iterator[FoundRecord]:
    """Yield the valid records among ``size`` bytes, in order.

    A record whose key (or, with ``verify``, payload) fails its checksum under a sound
    header is skipped and counted. A bad header stops the walk (lengths untrusted):
    ``CORRUPT``, unless everything from it to ``size`` is zero bytes (``TORN``). A
    partial header or a record past ``size`` stops it as ``TORN``.

    Sound records are parsed in bulk from large reads (:func:`_walk_sound`); the
    first record that is anything else is judged alone, by the rules above.

    Args:
        read_at: ``(offset, n) -> bytes``, fewer than ``n`` only at the end.
        size: how many bytes the run holds.
        verify: also hash every payload.
        result: filled in with the stop reason, the good end and the corrupt count.
    """
    offset = 0
    while offset < size:
        if not verify:
            offset = yield from _walk_sound(read_at, offset, size, result)
            if offset >= size:
                break
        found, after = judge_record(read_at, offset, size, verify, result)
        if after is None:
            return
        offset = after
        if found is not None:
            yield found
    result.stop = WalkStop.END


def judge_record(
    read_at: ReadAt, offset: int, size: int, verify: bool, result: WalkResult
) -> tuple[FoundRecord | None, int | None]:
    """One step of :func:`walk_records`, by its rules: the record at ``offset``, if valid, and where the walk goes on.

    Returns:
        ``(record, next offset)``; the record is None when it was skipped as corrupt
        (counted); the next offset is None when the walk stops here (``result.stop`` set).
    """
    header = _next_header(read_at, offset, size, result)
    if header is None:
        return None, None
    try:
        namespace, hash_ = split_key(header, read_at(offset + HEADER_SIZE, header.key_len))
        payload_at = offset + HEADER_SIZE + header.key_len
        if verify and not _payload_ok(read_at, header, payload_at):
            raise CorruptRecord("payload checksum mismatch")
        found: FoundRecord | None = FoundRecord(offset, header, namespace, hash_)
    except CorruptRecord:
        found, result.corrupt = None, result.corrupt + 1
    result.good_end = offset + header.record_len
    return found, result.good_end


_WINDOW = 1 << 20  # bytes read at once by the bulk walk among small records
_SMALL_READ = 4096  # ... and after a large one, whose payload it skips
_RECORD_HEAD = struct.Struct("<4sBBHHHQQII")  # the header's fields and its checksum
_FLAG_VALUES = {int(flag): flag for flag in (RecordFlags.NONE, RecordFlags.TOMBSTONE)}


def _walk_sound(read_at: ReadAt, offset: int, size: int, result: WalkResult) -> Generator[FoundRecord, None, int]:
    """Yield records from ``offset`` on while each is whole and passes every check.

    Rebuilding the index of millions of small records is bound by the cost per
    record, so this reads a window at a time and checks headers inline, without a
    call per field. It makes no judgement: at the first record that is not plainly
    sound (a bad checksum, bounds, a record past ``size``) it returns that record's
    offset, for :func:`walk_records` to judge by its rules.
    """
    window, base, pos, record_len = b"", offset, 0, 0
    view = memoryview(window)
    while base + pos < size:
        if pos + HEADER_SIZE > len(window):
            base, pos = base + pos, 0
            # after a large record, read only what the next header and key need
            wanted = _WINDOW if record_len <= _WINDOW // 16 else _SMALL_READ
            window = read_at(base, min(wanted, size - base))
            view = memoryview(window)
            if len(window) < HEADER_SIZE:
                break
        magic, version, flags, ns_len, hash_len, reserved, payload_len, payload_sum, key_sum, head_sum = (
            _RECORD_HEAD.unpack_from(window, pos)
        )
        key_at = pos + HEADER_SIZE
        key_end = key_at + ns_len + hash_len
        record_len = HEADER_SIZE + ns_len + hash_len + payload_len
        if (
            magic != MAGIC
            or version != VERSION
            or reserved
            or flags not in _FLAG_VALUES
            or ns_len > MAX_NAMESPACE_LEN
            or not 1 <= hash_len <= MAX_HASH_LEN
            or base + pos + record_len > size
            or xxhash.xxh32_intdigest(view[pos : key_at - _CHECKSUM.size]) != head_sum
        ):
            break
        if key_end > len(window):  # the key runs past the window: read on from this record
            if pos == 0:
                break  # a key longer than a window: leave it to the careful path
            base, pos, window = base + pos, 0, b""
            continue
        if xxhash.xxh32_intdigest(view[key_at:key_end]) != key_sum:
            break
        header = RecordHeader(_FLAG_VALUES[flags], ns_len, hash_len, payload_len, payload_sum, key_sum)
        yield FoundRecord(base + pos, header, window[key_at : key_at + ns_len], window[key_at + ns_len : key_end])
        pos += record_len
        result.good_end = base + pos
    return base + pos


def _next_header(read_at: ReadAt, offset: int, size: int, result: WalkResult) -> RecordHeader | None:
    """The sound header of a whole record at ``offset``, or None with ``result.stop`` set."""
    if size - offset < HEADER_SIZE:
        result.stop = WalkStop.TORN
        return None
    try:
        header = decode_record_header(read_at(offset, HEADER_SIZE))
    except CorruptRecord:
        zero = _is_zero(read_at, offset, size)
        result.stop = WalkStop.TORN if zero else WalkStop.CORRUPT
        result.corrupt += 0 if zero else 1
        return None
    if offset + header.record_len > size:
        result.stop = WalkStop.TORN
        return None
    return header
