"""Pure encoding and decoding of data-plane frames: bytes in, typed messages out.

No sockets here. A reader of the stream does three steps, each bounded:

1. read :data:`HEADER_SIZE` bytes, :func:`decode_header` (checks magic, version,
   op and the announced sizes against :class:`WireLimits`);
2. read ``header.meta_len`` bytes, :func:`decode_message`;
3. move ``header.payload_len`` payload bytes, split as the message says
   (:func:`payload_lengths`), directly into their destinations.

Layout (little endian)::

    header  magic "KV" | version u8 | op u8 | status u16 | reserved u16 |
            request_id u64 | meta_len u32 | payload_len u64
    keys    ns_len u8 | namespace utf-8 | hash_size u8 | count u32 | count*hash_size
    PUT     keys | count*u32 lengths | has_depths u8 | has_depths ? count*u32 chain depths
    GET/DEL/LOCATE keys
    EXISTS  prefix u8 | keys
    HELLO   token bytes (at most MAX_TOKEN_BYTES); the response has no meta
    status  count u32 | count*u8 statuses                  (PUT/EXISTS/DELETE responses)
    GET rsp count u32 | count*u8 statuses | count*u32 lengths | count*u64 checksums
    LOCATE rsp  count u32 | arena_id u64 | count*u8 statuses | count*u64 offsets |
            count*u32 lengths | count*u64 checksums | count*u64 generations
    ERROR   utf-8 message (header.status holds the code)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from kvpool_client.errors import ErrorCode, LimitExceeded, ProtocolError
from kvpool_client.wire.frames import (
    MAGIC,
    MAX_HASH_BYTES,
    MAX_NAMESPACE_BYTES,
    MAX_TOKEN_BYTES,
    PROTOCOL_VERSION,
    RESPONSE_BIT,
    DeleteRequest,
    ErrorResponse,
    ExistsRequest,
    FrameHeader,
    GetRequest,
    GetResponse,
    LocateRequest,
    LocateResponse,
    Message,
    Op,
    HelloRequest,
    HelloResponse,
    PingRequest,
    PingResponse,
    PutRequest,
    StatusResponse,
    WireLimits,
)

_HEADER = struct.Struct("<2sBBHHQIQ")
HEADER_SIZE = _HEADER.size
_U32 = struct.Struct("<I")
_MAX_ERROR_MESSAGE = 1000  # fits the smallest meta limit (WireLimits.max_meta >= 1024)
_STATUS_OPS = frozenset({Op.PUT, Op.EXISTS, Op.DELETE})
_VALID_OPS = frozenset(int(op) for op in Op)


# -- encoding ---------------------------------------------------------------


def encode(message: Message) -> bytes:
    """Encode header and meta of ``message``; its payload is sent separately.

    Raises:
        ProtocolError: the message cannot be represented (namespace or hash too long,
            mismatched list lengths, mixed hash sizes).
    """
    op, status, meta = _encode_meta(message)
    return _encode_header(op, status, message.request_id, meta, payload_length(message)) + meta


def payload_length(message: Message) -> int:
    """Total payload bytes that follow the meta of ``message``."""
    if isinstance(message, (PutRequest, GetResponse)):
        return sum(message.lengths)
    return 0


def payload_lengths(message: Message) -> list[int]:
    """Length of each block in the payload, in order (zero-length entries dropped)."""
    if isinstance(message, (PutRequest, GetResponse)):
        return [n for n in message.lengths if n]
    return []


def _encode_header(op: int, status: int, request_id: int, meta: bytes, payload_len: int) -> bytes:
    try:
        return _HEADER.pack(MAGIC, PROTOCOL_VERSION, op, status, 0, request_id, len(meta), payload_len)
    except struct.error as exc:
        raise ProtocolError(f"header field out of range: {exc}") from exc


def _encode_meta(message: Message) -> tuple[int, int, bytes]:
    match message:
        case PutRequest(namespace=ns, hashes=hashes, lengths=lengths, depths=depths):
            if len(lengths) != len(hashes) or (depths is not None and len(depths) != len(hashes)):
                raise ProtocolError(f"{len(hashes)} keys but {len(lengths)} lengths or depths")
            tail = b"\x00" if depths is None else b"\x01" + _pack_array("I", depths)
            return Op.PUT, 0, _encode_keys(ns, hashes) + _pack_array("I", lengths) + tail
        case GetRequest(namespace=ns, hashes=hashes):
            return Op.GET, 0, _encode_keys(ns, hashes)
        case ExistsRequest(namespace=ns, hashes=hashes, prefix=prefix):
            return Op.EXISTS, 0, bytes([1 if prefix else 0]) + _encode_keys(ns, hashes)
        case DeleteRequest(namespace=ns, hashes=hashes):
            return Op.DELETE, 0, _encode_keys(ns, hashes)
        case PingRequest():
            return Op.PING, 0, b""
        case HelloRequest(token=token):
            if len(token) > MAX_TOKEN_BYTES:
                raise ProtocolError(f"a token is at most {MAX_TOKEN_BYTES} bytes")
            return Op.HELLO, 0, bytes(token)
        case LocateRequest(namespace=ns, hashes=hashes):
            return Op.LOCATE, 0, _encode_keys(ns, hashes)
        case StatusResponse(op=op, statuses=statuses):
            if op not in _STATUS_OPS:
                raise ProtocolError(f"{Op(op).name} is not answered by per-key statuses")
            return op | RESPONSE_BIT, 0, _U32.pack(len(statuses)) + _statuses(statuses)
        case GetResponse(statuses=statuses, lengths=lengths, checksums=checksums):
            return Op.GET | RESPONSE_BIT, 0, _encode_get_response(statuses, lengths, checksums)
        case PingResponse():
            return Op.PING | RESPONSE_BIT, 0, b""
        case HelloResponse():
            return Op.HELLO | RESPONSE_BIT, 0, b""
        case LocateResponse():
            return Op.LOCATE | RESPONSE_BIT, 0, _encode_locate_response(message)
        case ErrorResponse(op=op, code=code, message=text):
            if not 0 < code <= 0xFFFF:
                raise ProtocolError(f"error code {code} outside 1..65535")
            return op | RESPONSE_BIT, code, _truncate_utf8(text, _MAX_ERROR_MESSAGE)
    raise TypeError(f"not a wire message: {message!r}")


def _encode_keys(namespace: str, hashes: Sequence[bytes]) -> bytes:
    try:
        ns = namespace.encode()
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"namespace is not encodable as UTF-8: {exc}") from exc
    if not 0 < len(ns) <= MAX_NAMESPACE_BYTES:
        raise ProtocolError(f"namespace must be 1..{MAX_NAMESPACE_BYTES} bytes, got {len(ns)}")
    size = len(hashes[0]) if hashes else 1
    if not 0 < size <= MAX_HASH_BYTES or any(len(h) != size for h in hashes):
        raise ProtocolError(f"hashes of one frame must share one size in 1..{MAX_HASH_BYTES}")
    return b"".join([bytes([len(ns)]), ns, bytes([size]), _U32.pack(len(hashes)), *hashes])


def _encode_get_response(statuses: Sequence[int], lengths: Sequence[int], checksums: Sequence[int]) -> bytes:
    count = len(statuses)
    sums = list(checksums) or [0] * count
    if not len(lengths) == len(sums) == count:
        raise ProtocolError("statuses, lengths and checksums differ in length")
    if any(n and s != ErrorCode.OK for s, n in zip(statuses, lengths)):
        raise ProtocolError("a key that is not OK cannot carry payload bytes")
    return _U32.pack(count) + _statuses(statuses) + _pack_array("I", lengths) + _pack_array("Q", sums)


def _encode_locate_response(message: LocateResponse) -> bytes:
    m, count = message, len(message.statuses)
    if not len(m.offsets) == len(m.lengths) == len(m.checksums) == len(m.generations) == count:
        raise ProtocolError("statuses, offsets, lengths, checksums and generations differ in length")
    if any(s != ErrorCode.OK and (o or n or c or g) for s, o, n, c, g in _locations(m)):
        raise ProtocolError("a key that is not OK cannot carry a location")
    arrays = (_pack_array("Q", m.offsets), _pack_array("I", m.lengths), _pack_array("Q", m.checksums))
    return b"".join([_U32.pack(count), _pack_array("Q", [m.arena_id]), _statuses(m.statuses), *arrays,
                     _pack_array("Q", m.generations)])


def _locations(m: LocateResponse) -> zip[tuple[int, int, int, int, int]]:
    return zip(m.statuses, m.offsets, m.lengths, m.checksums, m.generations)


def _statuses(statuses: Sequence[int]) -> bytes:
    try:
        return bytes(statuses)
    except ValueError as exc:
        raise ProtocolError(f"per-key status out of 0..255: {exc}") from exc


def _truncate_utf8(text: str, limit: int) -> bytes:
    # Cut on a character boundary so the peer decodes what we meant.
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore").encode()


def _pack_array(code: str, values: Sequence[int]) -> bytes:
    try:
        return struct.pack(f"<{len(values)}{code}", *values)
    except struct.error as exc:
        raise ProtocolError(f"value out of range for the wire: {exc}") from exc


# -- decoding ---------------------------------------------------------------


def decode_header(data: bytes | bytearray | memoryview, limits: WireLimits) -> FrameHeader:
    """Decode and bound-check a frame header of exactly :data:`HEADER_SIZE` bytes.

    Raises:
        ProtocolError: bad magic, unknown version or op, wrong size.
        LimitExceeded: meta or payload larger than ``limits`` allow.
    """
    if len(data) != HEADER_SIZE:
        raise ProtocolError(f"header must be {HEADER_SIZE} bytes, got {len(data)}")
    magic, version, op, status, _, request_id, meta_len, payload_len = _HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version}", ErrorCode.UNSUPPORTED_VERSION)
    if op & ~RESPONSE_BIT not in _VALID_OPS:
        raise ProtocolError(f"unknown op {op}")
    if meta_len > limits.max_meta:
        raise LimitExceeded(f"meta of {meta_len} bytes exceeds {limits.max_meta}")
    if payload_len > limits.max_payload:
        raise LimitExceeded(f"payload of {payload_len} bytes exceeds {limits.max_payload}")
    return FrameHeader(op, status, request_id, meta_len, payload_len)


def header_identity(data: bytes | bytearray | memoryview) -> tuple[int, Op]:
    """(request id, op) of a header that failed to decode, to address the error reply.

    Falls back to (0, PING) when the bytes are not even a kvpool header of our version.
    """
    if len(data) == HEADER_SIZE:
        magic, version, op, _, _, request_id, _, _ = _HEADER.unpack(data)
        if magic == MAGIC and version == PROTOCOL_VERSION and op & ~RESPONSE_BIT in _VALID_OPS:
            return request_id, Op(op & ~RESPONSE_BIT)
    return 0, Op.PING


def decode_message(header: FrameHeader, meta: bytes | bytearray | memoryview, limits: WireLimits) -> Message:
    """Decode the meta section announced by ``header`` into a typed message.

    Raises:
        ProtocolError: truncated or trailing bytes, inconsistent counts or lengths.
        LimitExceeded: too many keys or a block larger than ``limits.max_block_size``.
    """
    if len(meta) != header.meta_len:
        raise ProtocolError(f"meta is {len(meta)} bytes, header says {header.meta_len}")
    reader = _Reader(memoryview(meta))
    message = _decode_body(header, reader, limits)
    reader.expect_end()
    if payload_length(message) != header.payload_len:
        raise ProtocolError(f"blocks add up to {payload_length(message)} bytes, header says {header.payload_len}")
    return message


def _decode_body(header: FrameHeader, reader: _Reader, limits: WireLimits) -> Message:
    rid, op = header.request_id, Op(header.op & ~RESPONSE_BIT)
    if header.is_response:
        return _decode_response(op, rid, header.status, reader, limits)
    if op is Op.PUT:
        ns, hashes = _decode_keys(reader, limits)
        lengths = reader.array("I", len(hashes))
        if any(n > limits.max_block_size for n in lengths):
            raise LimitExceeded(f"a block exceeds the {limits.max_block_size}-byte block limit")
        has_depths = reader.take(1)[0]
        if has_depths > 1:
            raise ProtocolError(f"has_depths must be 0 or 1, not {has_depths}")
        depths = reader.array("I", len(hashes)) if has_depths else None
        return PutRequest(rid, ns, hashes, lengths, depths)
    if op is Op.EXISTS:
        prefix = reader.take(1)[0]
        return ExistsRequest(rid, *_decode_keys(reader, limits), prefix=bool(prefix))
    if op is Op.PING:
        return PingRequest(rid)
    if op is Op.HELLO:
        if reader.remaining > MAX_TOKEN_BYTES:
            raise LimitExceeded(f"a token is at most {MAX_TOKEN_BYTES} bytes")
        return HelloRequest(rid, bytes(reader.take(reader.remaining)))
    request = {Op.GET: GetRequest, Op.LOCATE: LocateRequest}.get(op, DeleteRequest)
    return request(rid, *_decode_keys(reader, limits))


def _decode_response(op: Op, rid: int, status: int, reader: _Reader, limits: WireLimits) -> Message:
    if status != ErrorCode.OK:
        text = bytes(reader.take(reader.remaining)).decode("utf-8", "replace")
        return ErrorResponse(rid, op, status, text)
    if op is Op.PING:
        return PingResponse(rid)
    if op is Op.HELLO:
        return HelloResponse(rid)
    if op is Op.LOCATE:
        return _decode_locate_response(rid, reader, limits)
    count = reader.count(limits)
    statuses = list(reader.take(count))
    if op is not Op.GET:
        return StatusResponse(rid, op, statuses)
    lengths = reader.array("I", count)
    checksums = reader.array("Q", count)
    if any(n > limits.max_block_size for n in lengths):
        raise LimitExceeded(f"a block exceeds the {limits.max_block_size}-byte block limit")
    if any(n and s != ErrorCode.OK for s, n in zip(statuses, lengths)):
        raise ProtocolError("a key that is not OK carries payload bytes")
    return GetResponse(rid, statuses, lengths, checksums)


def _decode_locate_response(rid: int, reader: _Reader, limits: WireLimits) -> LocateResponse:
    count = reader.count(limits)
    (arena_id,) = reader.array("Q", 1)
    statuses = list(reader.take(count))
    offsets, lengths = reader.array("Q", count), reader.array("I", count)
    message = LocateResponse(rid, arena_id, statuses, offsets, lengths, reader.array("Q", count), reader.array("Q", count))
    if any(n > limits.max_block_size for n in lengths):
        raise LimitExceeded(f"a block exceeds the {limits.max_block_size}-byte block limit")
    if any(s != ErrorCode.OK and (o or n or c or g) for s, o, n, c, g in _locations(message)):
        raise ProtocolError("a key that is not OK carries a location")
    return message


def _decode_keys(reader: _Reader, limits: WireLimits) -> tuple[str, list[bytes]]:
    ns_len = reader.take(1)[0]
    if ns_len == 0:
        raise ProtocolError("empty namespace")
    try:
        namespace = bytes(reader.take(ns_len)).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"namespace is not UTF-8: {exc}") from exc
    size = reader.take(1)[0]
    if not 0 < size <= MAX_HASH_BYTES:
        raise ProtocolError(f"hash size {size} outside 1..{MAX_HASH_BYTES}")
    count = reader.count(limits)
    raw = bytes(reader.take(count * size))
    return namespace, [raw[i : i + size] for i in range(0, len(raw), size)]


class _Reader:
    """Cursor over a meta section; every read is bounds-checked."""

    __slots__ = ("_view", "_pos")

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._view) - self._pos

    def take(self, n: int) -> memoryview:
        if n > self.remaining:
            raise ProtocolError(f"meta truncated: need {n} bytes at offset {self._pos}, have {self.remaining}")
        chunk = self._view[self._pos : self._pos + n]
        self._pos += n
        return chunk

    def count(self, limits: WireLimits) -> int:
        (count,) = _U32.unpack(self.take(4))
        if count > limits.max_keys:
            raise LimitExceeded(f"{count} keys exceed the limit of {limits.max_keys} per request")
        return count

    def array(self, code: str, count: int) -> list[int]:
        return list(struct.unpack(f"<{count}{code}", self.take(count * struct.calcsize(code))))

    def expect_end(self) -> None:
        if self.remaining:
            raise ProtocolError(f"{self.remaining} trailing bytes after meta")
