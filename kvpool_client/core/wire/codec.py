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

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any

from kvpool_client.core.errors import ErrorCode, LimitExceeded, ProtocolError
from kvpool_client.core.wire.frames import (
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
    HelloRequest,
    HelloResponse,
    LocateRequest,
    LocateResponse,
    Message,
    Op,
    PingRequest,
    PingResponse,
    PutRequest,
    StatusResponse,
    WireLimits,
)

_HEADER = struct.Struct("<2sBBHHQIQ")
HEADER_SIZE = _HEADER.size
_U32 = struct.Struct("<I")
_KEYS_TAIL = struct.Struct("<BI")  # hash_size u8 | count u32, after the namespace
_ITEM_BYTES = {"I": 4, "Q": 8}
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
    encoder = _ENCODERS.get(type(message))
    if encoder is None:
        raise TypeError(f"not a wire message: {message!r}")
    op, status, meta = encoder(message)
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


# Each encoder returns (op byte, header status, meta) for one message type.
Encoded = tuple[int, int, bytes]


def _put(m: PutRequest) -> Encoded:
    if len(m.lengths) != len(m.hashes) or (m.depths is not None and len(m.depths) != len(m.hashes)):
        raise ProtocolError(f"{len(m.hashes)} keys but {len(m.lengths)} lengths or depths")
    tail = b"\x00" if m.depths is None else b"\x01" + _pack_array("I", m.depths)
    return Op.PUT, 0, _encode_keys(m.namespace, m.hashes) + _pack_array("I", m.lengths) + tail


def _exists(m: ExistsRequest) -> Encoded:
    return Op.EXISTS, 0, (b"\x01" if m.prefix else b"\x00") + _encode_keys(m.namespace, m.hashes)


def _hello(m: HelloRequest) -> Encoded:
    if len(m.token) > MAX_TOKEN_BYTES:
        raise ProtocolError(f"a token is at most {MAX_TOKEN_BYTES} bytes")
    return Op.HELLO, 0, bytes(m.token)


def _status_response(m: StatusResponse) -> Encoded:
    if m.op not in _STATUS_OPS:
        raise ProtocolError(f"{Op(m.op).name} is not answered by per-key statuses")
    return m.op | RESPONSE_BIT, 0, _U32.pack(len(m.statuses)) + _statuses(m.statuses)


def _error_response(m: ErrorResponse) -> Encoded:
    if not 0 < m.code <= 0xFFFF:
        raise ProtocolError(f"error code {m.code} outside 1..65535")
    return m.op | RESPONSE_BIT, m.code, _truncate_utf8(m.message, _MAX_ERROR_MESSAGE)


def _keys_of(op: Op) -> Callable[[GetRequest | DeleteRequest | LocateRequest], Encoded]:
    return lambda m: (op, 0, _encode_keys(m.namespace, m.hashes))


def _empty(op: int) -> Callable[[Message], Encoded]:
    return lambda m: (op, 0, b"")


_ENCODERS: dict[type, Callable[[Any], Encoded]] = {
    PutRequest: _put,
    GetRequest: _keys_of(Op.GET),
    ExistsRequest: _exists,
    DeleteRequest: _keys_of(Op.DELETE),
    LocateRequest: _keys_of(Op.LOCATE),
    PingRequest: _empty(Op.PING),
    HelloRequest: _hello,
    StatusResponse: _status_response,
    GetResponse: lambda m: (Op.GET | RESPONSE_BIT, 0, _encode_get_response(m.statuses, m.lengths, m.checksums)),
    LocateResponse: lambda m: (Op.LOCATE | RESPONSE_BIT, 0, _encode_locate_response(m)),
    PingResponse: _empty(Op.PING | RESPONSE_BIT),
    HelloResponse: _empty(Op.HELLO | RESPONSE_BIT),
    ErrorResponse: _error_response,
}


def _encode_keys(namespace: str, hashes: Sequence[bytes]) -> bytes:
    size = len(hashes[0]) if hashes else 1
    if not 0 < size <= MAX_HASH_BYTES or (len(hashes) > 1 and set(map(len, hashes)) != {size}):
        raise ProtocolError(f"hashes of one frame must share one size in 1..{MAX_HASH_BYTES}")
    return b"".join([_namespace_field(namespace), _KEYS_TAIL.pack(size, len(hashes)), *hashes])


@functools.lru_cache(maxsize=1024)
def _namespace_field(namespace: str) -> bytes:
    """ns_len u8 | namespace utf-8, checked (a client uses few namespaces: each is encoded once)."""
    try:
        ns = namespace.encode()
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"namespace is not encodable as UTF-8: {exc}") from exc
    if not 0 < len(ns) <= MAX_NAMESPACE_BYTES:
        raise ProtocolError(f"namespace must be 1..{MAX_NAMESPACE_BYTES} bytes, got {len(ns)}")
    return bytes([len(ns)]) + ns


def _encode_get_response(statuses: Sequence[int], lengths: Sequence[int], checksums: Sequence[int]) -> bytes:
    count = len(statuses)
    sums = list(checksums) or [0] * count
    if not len(lengths) == len(sums) == count:
        raise ProtocolError("statuses, lengths and checksums differ in length")
    if _carries_data_when_not_ok(statuses, lengths):
        raise ProtocolError("a key that is not OK cannot carry payload bytes")
    return _U32.pack(count) + _pack(_get_response_layout(count), _statuses(statuses), *lengths, *sums)


def _encode_locate_response(message: LocateResponse) -> bytes:
    m, count = message, len(message.statuses)
    if not len(m.offsets) == len(m.lengths) == len(m.checksums) == len(m.generations) == count:
        raise ProtocolError("statuses, offsets, lengths, checksums and generations differ in length")
    if _carries_data_when_not_ok(m.statuses, m.offsets, m.lengths, m.checksums, m.generations):
        raise ProtocolError("a key that is not OK cannot carry a location")
    fields = (*m.offsets, *m.lengths, *m.checksums, *m.generations)
    return _U32.pack(count) + _pack(_locate_response_layout(count), m.arena_id, _statuses(m.statuses), *fields)


def answer_meta_size(op: Op, count: int) -> int:
    """Meta bytes of a successful answer to a request for ``count`` keys: a client reads
    header and meta in one receive of exactly this much, never into the payload."""
    if op is Op.GET:
        return _U32.size + _get_response_layout(count).size
    if op is Op.LOCATE:
        return _U32.size + _locate_response_layout(count).size
    if op in _STATUS_OPS:
        return _U32.size + count  # one status byte a key
    return 0


# A response's fields after its count, packed and unpacked in one call.
@functools.lru_cache(maxsize=64)
def _get_response_layout(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}s{count}I{count}Q")


@functools.lru_cache(maxsize=64)
def _locate_response_layout(count: int) -> struct.Struct:
    return struct.Struct(f"<Q{count}s{count}Q{count}I{count}Q{count}Q")


def _pack(layout: struct.Struct, *values: object) -> bytes:
    try:
        return layout.pack(*values)
    except struct.error as exc:
        raise ProtocolError(f"value out of range for the wire: {exc}") from exc


def _carries_data_when_not_ok(statuses: Sequence[int], *columns: Sequence[int]) -> bool:
    """Whether a key that is not OK has a non-zero value in one of ``columns``."""
    if statuses.count(ErrorCode.OK) == len(statuses):  # the usual answer: every key found
        return False
    return any(s != ErrorCode.OK and any(values) for s, *values in zip(statuses, *columns, strict=True))


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


# The usual answer to a one-key GET, header and meta in one: count 1 | status | length | checksum.
_GET_ONE_ANSWER = struct.Struct("<2sBBHHQIQIBIQ")
GET_ONE_ANSWER_SIZE = _GET_ONE_ANSWER.size
_GET_ONE_META = GET_ONE_ANSWER_SIZE - HEADER_SIZE
_GET_ANSWER_OP = Op.GET | RESPONSE_BIT


def decode_get_one(data: bytes, request_id: int, limits: WireLimits) -> tuple[int, int, int] | None:
    """(status, length, checksum) of ``data`` when it is exactly a well-formed GET answer to
    one key of ``request_id`` (header and meta); None for anything else (an error frame, a
    partial read, a broken frame): :func:`decode_header` and :func:`decode_message` then
    read it the general way and say what is wrong.

    One unpack instead of a header, a reader and a message: a single-block get is made of
    little else.
    """
    if len(data) != GET_ONE_ANSWER_SIZE:
        return None
    magic, version, op, status, _, rid, meta_len, payload_len, count, key_status, length, checksum = (
        _GET_ONE_ANSWER.unpack(data)
    )
    if (
        magic != MAGIC
        or version != PROTOCOL_VERSION
        or op != _GET_ANSWER_OP
        or status
        or rid != request_id
        or meta_len != _GET_ONE_META
        or count != 1
        or payload_len != length
        or length > limits.max_block_size
        or length > limits.max_payload
        or (length and key_status != ErrorCode.OK)
    ):
        return None
    return key_status, length, checksum


def encode_get_one(request_id: int, status: int, length: int, checksum: int) -> bytes:
    """The answer to a one-key GET, header and meta, as ``encode(GetResponse(...))`` makes it.

    Raises:
        ProtocolError: a status that is not OK with a length, or a field out of range.
    """
    if status != ErrorCode.OK and length:
        raise ProtocolError("a key that is not OK cannot carry payload bytes")
    args = (
        MAGIC,
        PROTOCOL_VERSION,
        _GET_ANSWER_OP,
        0,
        0,
        request_id,
        _GET_ONE_META,
        length,
        1,
        status,
        length,
        checksum,
    )
    return _pack(_GET_ONE_ANSWER, *args)


def encode_get_one_request(request_id: int, namespace: str, block: bytes) -> bytes:
    """``encode(GetRequest(request_id, namespace, [block]))`` in one pack (a single-block get).

    Raises:
        ProtocolError: the namespace or the hash cannot be represented, or the id is out of range.
    """
    keys = _encode_keys(namespace, (block,))
    return _pack(_HEADER, MAGIC, PROTOCOL_VERSION, Op.GET, 0, 0, request_id, len(keys), 0) + keys


_REQUEST_HEAD = struct.Struct("<2sBBHHQIQB")  # a keyed request's header and ns_len


def decode_get_one_request(
    data: bytes | bytearray | memoryview, limits: WireLimits
) -> tuple[int, str, bytes, int] | None:
    """(request id, namespace, hash, frame size) when ``data`` starts with a whole, well-formed GET
    of one key; None for anything else (not here whole, another op, a broken frame), which
    :func:`decode_header` and :func:`decode_message` then read the general way.

    Reads the buffer in place: the daemon answers most single-block gets from here.
    """
    head = _one_key_request(data, Op.GET, limits)
    if head is None:
        return None
    request_id, payload_len, namespace, block, after, end = head
    if payload_len or after != end:
        return None
    return request_id, namespace, block, end


def _one_key_request(
    data: bytes | bytearray | memoryview, op: Op, limits: WireLimits
) -> tuple[int, int, str, bytes, int, int] | None:
    """(request id, payload length, namespace, hash, where the hash ends, where the head ends) when
    ``data`` starts with the whole head of an ``op`` request for one key, well-formed up to its
    hash; None otherwise."""
    if len(data) < _REQUEST_HEAD.size:
        return None
    magic, version, code, _, _, request_id, meta_len, payload_len, ns_len = _REQUEST_HEAD.unpack_from(data)
    tail = HEADER_SIZE + 1 + ns_len  # hash_size u8 | count u32
    end = HEADER_SIZE + meta_len
    if magic != MAGIC or version != PROTOCOL_VERSION or code != op or not ns_len or len(data) < end:
        return None
    if end < tail + _KEYS_TAIL.size or meta_len > limits.max_meta or limits.max_keys < 1:
        return None
    size, count = _KEYS_TAIL.unpack_from(data, tail)
    after = tail + _KEYS_TAIL.size + size
    if count != 1 or not 0 < size <= MAX_HASH_BYTES or after > end:
        return None
    try:
        namespace = str(data[HEADER_SIZE + 1 : tail], "utf-8")
    except UnicodeDecodeError:
        return None
    return request_id, payload_len, namespace, bytes(data[after - size : after]), after, end


# A one-key PUT's head after its namespace: hash_size u8 | count u32 (1), then the hash, its
# length u32 and has_depths u8 (and, when 1, its depth u32); its answer: count 1 | status.
_PUT_ONE_LENGTH = struct.Struct("<IB")
_PUT_ONE_ANSWER = struct.Struct("<2sBBHHQIQIB")
PUT_ONE_ANSWER_SIZE = _PUT_ONE_ANSWER.size
_PUT_ANSWER_OP = Op.PUT | RESPONSE_BIT


def encode_put_one_request(request_id: int, namespace: str, block: bytes, length: int, depth: int | None) -> bytes:
    """``encode(PutRequest(request_id, namespace, [block], [length], depths))`` in a few packs (a
    single-block put; ``depths`` is ``[depth]``, or None without one).

    Raises:
        ProtocolError: the namespace, the hash, the length or the depth cannot be represented.
    """
    keys = _encode_keys(namespace, (block,))
    tail = _pack(_PUT_ONE_LENGTH, length, depth is not None) + (b"" if depth is None else _pack(_U32, depth))
    head = _pack(_HEADER, MAGIC, PROTOCOL_VERSION, Op.PUT, 0, 0, request_id, len(keys) + len(tail), length)
    return head + keys + tail


def decode_put_one_request(data: bytes | bytearray | memoryview, limits: WireLimits) -> tuple[PutRequest, int] | None:
    """The request and its head's size (header and meta) when ``data`` starts with the whole
    head of a well-formed PUT of one block; None for anything else (not here whole, another op,
    a broken frame), which :func:`decode_header` and :func:`decode_message` then read the
    general way and refuse with the reason.

    Reads the buffer in place: the daemon takes most single-block puts from here.
    """
    head = _one_key_request(data, Op.PUT, limits)
    if head is None:
        return None
    request_id, payload_len, namespace, block, after, end = head
    if after + _PUT_ONE_LENGTH.size > end:
        return None
    length, has_depth = _PUT_ONE_LENGTH.unpack_from(data, after)
    if has_depth > 1 or after + _PUT_ONE_LENGTH.size + has_depth * _U32.size != end or length != payload_len:
        return None
    if length > limits.max_block_size or length > limits.max_payload:
        return None
    depths = [_U32.unpack_from(data, end - _U32.size)[0]] if has_depth else None
    return PutRequest(request_id, namespace, [block], [length], depths), end


def encode_put_one_answer(request_id: int, status: int) -> bytes:
    """``encode(StatusResponse(request_id, Op.PUT, [status]))`` in one pack.

    Raises:
        ProtocolError: the status or the id is out of range.
    """
    return _pack(
        _PUT_ONE_ANSWER, MAGIC, PROTOCOL_VERSION, _PUT_ANSWER_OP, 0, 0, request_id, _U32.size + 1, 0, 1, status
    )


def decode_put_one_answer(data: bytes, request_id: int) -> int | None:
    """The status of ``data`` when it is exactly a well-formed answer to a PUT of one block
    with ``request_id``; None for anything else (an error frame, a partial read, a broken
    frame), which the general decoders then read."""
    if len(data) != PUT_ONE_ANSWER_SIZE:
        return None
    magic, version, op, status, _, rid, meta_len, payload_len, count, key_status = _PUT_ONE_ANSWER.unpack(data)
    if (
        magic != MAGIC
        or version != PROTOCOL_VERSION
        or op != _PUT_ANSWER_OP
        or status
        or rid != request_id
        or meta_len != _U32.size + 1
        or payload_len
        or count != 1
    ):
        return None
    return int(key_status)


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
    reader = _Reader(meta if type(meta) is bytes else bytes(meta))
    message = _decode_body(header, reader, limits)
    reader.expect_end()
    if payload_length(message) != header.payload_len:
        raise ProtocolError(f"blocks add up to {payload_length(message)} bytes, header says {header.payload_len}")
    return message


def _decode_body(header: FrameHeader, reader: _Reader, limits: WireLimits) -> Message:
    rid, op = header.request_id, header.request_op
    if header.op & RESPONSE_BIT:
        return _decode_response(op, rid, header.status, reader, limits)
    if op is Op.PUT:
        ns, hashes = _decode_keys(reader, limits)
        lengths = reader.array("I", len(hashes))
        if lengths and max(lengths) > limits.max_block_size:
            raise LimitExceeded(f"a block exceeds the {limits.max_block_size}-byte block limit")
        has_depths = reader.byte()
        if has_depths > 1:
            raise ProtocolError(f"has_depths must be 0 or 1, not {has_depths}")
        depths = reader.array("I", len(hashes)) if has_depths else None
        return PutRequest(rid, ns, hashes, lengths, depths)
    if op is Op.EXISTS:
        prefix = reader.byte()
        return ExistsRequest(rid, *_decode_keys(reader, limits), prefix=bool(prefix))
    if op is Op.PING:
        return PingRequest(rid)
    if op is Op.HELLO:
        if reader.remaining > MAX_TOKEN_BYTES:
            raise LimitExceeded(f"a token is at most {MAX_TOKEN_BYTES} bytes")
        return HelloRequest(rid, reader.take(reader.remaining))
    request = _KEYED_REQUESTS[op]
    return request(rid, *_decode_keys(reader, limits))


_KEYED_REQUESTS: dict[Op, type[GetRequest | LocateRequest | DeleteRequest]] = {
    Op.GET: GetRequest,
    Op.LOCATE: LocateRequest,
    Op.DELETE: DeleteRequest,
}


def _decode_response(op: Op, rid: int, status: int, reader: _Reader, limits: WireLimits) -> Message:
    if status != ErrorCode.OK:
        text = reader.take(reader.remaining).decode("utf-8", "replace")
        return ErrorResponse(rid, op, status, text)
    if op is Op.PING:
        return PingResponse(rid)
    if op is Op.HELLO:
        return HelloResponse(rid)
    if op is Op.LOCATE:
        return _decode_locate_response(rid, reader, limits)
    count = reader.count(limits)
    if op is not Op.GET:
        return StatusResponse(rid, op, list(reader.take(count)))
    raw, *fields = reader.unpack(_get_response_layout(count))
    statuses, lengths, checksums = list(raw), fields[:count], fields[count:]
    if lengths and max(lengths) > limits.max_block_size:
        raise LimitExceeded(f"a block exceeds the {limits.max_block_size}-byte block limit")
    if _carries_data_when_not_ok(statuses, lengths):
        raise ProtocolError("a key that is not OK carries payload bytes")
    return GetResponse(rid, statuses, lengths, checksums)


def _decode_locate_response(rid: int, reader: _Reader, limits: WireLimits) -> LocateResponse:
    count = reader.count(limits)
    arena_id, raw, *fields = reader.unpack(_locate_response_layout(count))
    offsets, lengths = fields[:count], fields[count : 2 * count]
    checksums, generations = fields[2 * count : 3 * count], fields[3 * count :]
    message = LocateResponse(rid, arena_id, list(raw), offsets, lengths, checksums, generations)
    if lengths and max(lengths) > limits.max_block_size:
        raise LimitExceeded(f"a block exceeds the {limits.max_block_size}-byte block limit")
    if _carries_data_when_not_ok(message.statuses, offsets, lengths, checksums, generations):
        raise ProtocolError("a key that is not OK carries a location")
    return message


def _decode_keys(reader: _Reader, limits: WireLimits) -> tuple[str, list[bytes]]:
    ns_len = reader.byte()
    if ns_len == 0:
        raise ProtocolError("empty namespace")
    try:
        namespace = reader.take(ns_len).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"namespace is not UTF-8: {exc}") from exc
    size = reader.byte()
    if not 0 < size <= MAX_HASH_BYTES:
        raise ProtocolError(f"hash size {size} outside 1..{MAX_HASH_BYTES}")
    count = reader.count(limits)
    raw = reader.take(count * size)
    if count == 1:
        return namespace, [raw]
    return namespace, [raw[i : i + size] for i in range(0, len(raw), size)]


class _Reader:
    """Cursor over a meta section; every read is bounds-checked."""

    __slots__ = ("_data", "_pos", "_end")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0
        self._end = len(data)

    @property
    def remaining(self) -> int:
        return self._end - self._pos

    def _advance(self, n: int) -> int:
        """Claim the next ``n`` bytes; returns where they start."""
        start = self._pos
        if start + n > self._end:
            raise ProtocolError(f"meta truncated: need {n} bytes at offset {start}, have {self._end - start}")
        self._pos = start + n
        return start

    def take(self, n: int) -> bytes:
        start = self._advance(n)
        return self._data[start : start + n]

    def byte(self) -> int:
        return self._data[self._advance(1)]

    def count(self, limits: WireLimits) -> int:
        count: int = _U32.unpack_from(self._data, self._advance(4))[0]
        if count > limits.max_keys:
            raise LimitExceeded(f"{count} keys exceed the limit of {limits.max_keys} per request")
        return count

    def array(self, code: str, count: int) -> list[int]:
        start = self._advance(count * _ITEM_BYTES[code])
        return list(struct.unpack_from(f"<{count}{code}", self._data, start))

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack_from(self._data, self._advance(layout.size))

    def expect_end(self) -> None:
        if self._pos != self._end:
            raise ProtocolError(f"{self._end - self._pos} trailing bytes after meta")
