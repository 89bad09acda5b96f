"""Pure encoding and decoding of data-plane frames: bytes in, typed messages out.

No sockets here. A reader of the stream does three steps, each bounded:

1. read :data:`HEADER_SIZE` bytes, :func:`decode_header` (checks magic, version,
   op and the announced sizes against :class:`WireLimits`);
2. read ``header.meta_len`` bytes, :func:`decode_message`;
3. move ``header.payload_len`` payload bytes, split as the message says
   (:func:`payload_lengths`), directly into their destinations.

Where each field lies is :mod:`~kvpool_client.core.wire.layout`'s (header and keys); what
its value may be, :mod:`~kvpool_client.core.wire.rules`'. The meta of each op::

    PUT, RESERVE  keys | count*u32 lengths | has_depths u8 | has_depths ? count*u32 chain depths
    GET/DEL/LOCATE keys
    COMMIT  lease u64 | count u32 | count*u64 checksums
    EXISTS  prefix u8 | keys
    HELLO   token bytes (at most MAX_TOKEN_BYTES); the response has no meta
    PEER    no meta
    status  count u32 | count*u8 statuses                  (PUT/EXISTS/DELETE/COMMIT responses)
    GET rsp count u32 | count*u8 statuses | count*u32 lengths | count*u64 checksums
    LOCATE rsp  count u32 | arena_id u64 | count*u8 statuses | count*u64 offsets |
            count*u32 lengths | count*u64 checksums | count*u64 generations
    PEER rsp    arena_id u64 | base u64 | size u64 | generations_offset u64 | agent metadata
    RESERVE rsp count u32 | arena_id u64 | lease u64 | count*u8 statuses | count*u64 offsets
    ERROR   utf-8 message (header.status holds the code)

The single-key GET and PUT also have one-step codecs (:mod:`~kvpool_client.core.wire.one_key`),
held to these by property tests.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from kvpool_client.core.errors import ErrorCode, ProtocolError
from kvpool_client.core.wire import rules
from kvpool_client.core.wire.frames import (
    MAGIC,
    PROTOCOL_VERSION,
    RESPONSE_BIT,
    CommitRequest,
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
    PeerRequest,
    PeerResponse,
    PingRequest,
    PingResponse,
    PutRequest,
    ReserveRequest,
    ReserveResponse,
    StatusResponse,
    WireLimits,
)
from kvpool_client.core.wire.layout import (
    COMMIT_HEAD,
    HEADER,
    HEADER_SIZE,
    PEER_RESPONSE,
    U32,
    get_response_layout,
    keys_field,
    locate_response_layout,
    pack,
    reserve_response_layout,
)

_ITEM_BYTES = {"I": 4, "Q": 8}
_MAX_ERROR_MESSAGE = 1000  # fits the smallest meta limit (WireLimits.max_meta >= 1024)
_STATUS_OPS = frozenset({Op.PUT, Op.EXISTS, Op.DELETE, Op.COMMIT})


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
    return pack(HEADER, MAGIC, PROTOCOL_VERSION, op, status, 0, request_id, len(meta), payload_len)


# Each encoder returns (op byte, header status, meta) for one message type.
Encoded = tuple[int, int, bytes]


def _put(m: PutRequest | ReserveRequest) -> Encoded:
    if len(m.lengths) != len(m.hashes) or (m.depths is not None and len(m.depths) != len(m.hashes)):
        raise ProtocolError(f"{len(m.hashes)} keys but {len(m.lengths)} lengths or depths")
    tail = b"\x00" if m.depths is None else b"\x01" + _pack_array("I", m.depths)
    op = Op.PUT if isinstance(m, PutRequest) else Op.RESERVE
    return op, 0, keys_field(m.namespace, m.hashes) + _pack_array("I", m.lengths) + tail


def _commit(m: CommitRequest) -> Encoded:
    return Op.COMMIT, 0, pack(COMMIT_HEAD, m.lease, len(m.checksums)) + _pack_array("Q", m.checksums)


def _peer_response(m: PeerResponse) -> Encoded:
    head = pack(PEER_RESPONSE, m.arena_id, m.base, m.size, m.generations_offset)
    return Op.PEER | RESPONSE_BIT, 0, head + bytes(m.agent)


def _reserve_response(m: ReserveResponse) -> Encoded:
    count = len(m.statuses)
    if len(m.offsets) != count:
        raise ProtocolError("statuses and offsets differ in length")
    rules.check_nothing_when_not_ok("a slot", m.statuses, m.offsets)
    meta = pack(reserve_response_layout(count), m.arena_id, m.lease, _statuses(m.statuses), *m.offsets)
    return Op.RESERVE | RESPONSE_BIT, 0, U32.pack(count) + meta


def _exists(m: ExistsRequest) -> Encoded:
    return Op.EXISTS, 0, (b"\x01" if m.prefix else b"\x00") + keys_field(m.namespace, m.hashes)


def _hello(m: HelloRequest) -> Encoded:
    rules.check_token_size(len(m.token))
    return Op.HELLO, 0, bytes(m.token)


def _status_response(m: StatusResponse) -> Encoded:
    if m.op not in _STATUS_OPS:
        raise ProtocolError(f"{Op(m.op).name} is not answered by per-key statuses")
    return m.op | RESPONSE_BIT, 0, U32.pack(len(m.statuses)) + _statuses(m.statuses)


def _error_response(m: ErrorResponse) -> Encoded:
    if not 0 < m.code <= 0xFFFF:
        raise ProtocolError(f"error code {m.code} outside 1..65535")
    return m.op | RESPONSE_BIT, m.code, _truncate_utf8(m.message, _MAX_ERROR_MESSAGE)


def _keys_of(op: Op) -> Callable[[GetRequest | DeleteRequest | LocateRequest], Encoded]:
    return lambda m: (op, 0, keys_field(m.namespace, m.hashes))


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
    PeerRequest: _empty(Op.PEER),
    ReserveRequest: _put,
    CommitRequest: _commit,
    PeerResponse: _peer_response,
    ReserveResponse: _reserve_response,
    StatusResponse: _status_response,
    GetResponse: lambda m: (Op.GET | RESPONSE_BIT, 0, _encode_get_response(m.statuses, m.lengths, m.checksums)),
    LocateResponse: lambda m: (Op.LOCATE | RESPONSE_BIT, 0, _encode_locate_response(m)),
    PingResponse: _empty(Op.PING | RESPONSE_BIT),
    HelloResponse: _empty(Op.HELLO | RESPONSE_BIT),
    ErrorResponse: _error_response,
}


def _encode_get_response(statuses: Sequence[int], lengths: Sequence[int], checksums: Sequence[int]) -> bytes:
    count = len(statuses)
    sums = list(checksums) or [0] * count
    if not len(lengths) == len(sums) == count:
        raise ProtocolError("statuses, lengths and checksums differ in length")
    rules.check_nothing_when_not_ok("payload bytes", statuses, lengths)
    return U32.pack(count) + pack(get_response_layout(count), _statuses(statuses), *lengths, *sums)


def _encode_locate_response(message: LocateResponse) -> bytes:
    m, count = message, len(message.statuses)
    if not len(m.offsets) == len(m.lengths) == len(m.checksums) == len(m.generations) == count:
        raise ProtocolError("statuses, offsets, lengths, checksums and generations differ in length")
    rules.check_nothing_when_not_ok("a location", m.statuses, m.offsets, m.lengths, m.checksums, m.generations)
    fields = (*m.offsets, *m.lengths, *m.checksums, *m.generations)
    return U32.pack(count) + pack(locate_response_layout(count), m.arena_id, _statuses(m.statuses), *fields)


def answer_meta_size(op: Op, count: int) -> int:
    """Meta bytes of a successful answer to a request for ``count`` keys: a client reads
    header and meta in one receive of exactly this much, never into the payload."""
    if op is Op.GET:
        return U32.size + get_response_layout(count).size
    if op is Op.LOCATE:
        return U32.size + locate_response_layout(count).size
    if op is Op.RESERVE:
        return U32.size + reserve_response_layout(count).size
    if op in _STATUS_OPS:
        return U32.size + count  # one status byte a key
    return 0


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
    magic, version, op, status, _, request_id, meta_len, payload_len = HEADER.unpack(data)
    rules.check_header(magic, version, op, meta_len, payload_len, limits)
    return FrameHeader(op, status, request_id, meta_len, payload_len)


def header_identity(data: bytes | bytearray | memoryview) -> tuple[int, Op]:
    """(request id, op) of a header that failed to decode, to address the error reply.

    Falls back to (0, PING) when the bytes are not even a kvpool header of our version.
    """
    if len(data) == HEADER_SIZE:
        magic, version, op, _, _, request_id, _, _ = HEADER.unpack(data)
        if magic == MAGIC and version == PROTOCOL_VERSION and op & ~RESPONSE_BIT in rules.VALID_OPS:
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
    rules.check_payload(payload_length(message), header.payload_len)
    return message


def _decode_body(header: FrameHeader, reader: _Reader, limits: WireLimits) -> Message:
    rid, op = header.request_id, header.request_op
    if header.op & RESPONSE_BIT:
        return _decode_response(op, rid, header.status, reader, limits)
    if op is Op.PUT or op is Op.RESERVE:
        ns, hashes = _decode_keys(reader, limits)
        lengths = reader.array("I", len(hashes))
        rules.check_block_lengths(lengths, limits)
        depths = reader.array("I", len(hashes)) if rules.depths_flag(reader.byte()) else None
        return (PutRequest if op is Op.PUT else ReserveRequest)(rid, ns, hashes, lengths, depths)
    if op is Op.COMMIT:
        lease, count = reader.unpack(COMMIT_HEAD)
        rules.check_count(count, limits)
        return CommitRequest(rid, lease, reader.array("Q", count))
    if op is Op.PEER:
        return PeerRequest(rid)
    if op is Op.EXISTS:
        prefix = reader.byte()
        return ExistsRequest(rid, *_decode_keys(reader, limits), prefix=bool(prefix))
    if op is Op.PING:
        return PingRequest(rid)
    if op is Op.HELLO:
        rules.check_token_size(reader.remaining)
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
    if op is Op.PEER:
        arena_id, base, size, generations_offset = reader.unpack(PEER_RESPONSE)
        return PeerResponse(rid, arena_id, base, size, generations_offset, reader.take(reader.remaining))
    count = reader.count(limits)
    if op is Op.RESERVE:
        arena_id, lease, raw, *offsets = reader.unpack(reserve_response_layout(count))
        rules.check_nothing_when_not_ok("a slot", list(raw), offsets)
        return ReserveResponse(rid, arena_id, lease, list(raw), offsets)
    if op is not Op.GET:
        return StatusResponse(rid, op, list(reader.take(count)))
    raw, *fields = reader.unpack(get_response_layout(count))
    statuses, lengths, checksums = list(raw), fields[:count], fields[count:]
    rules.check_block_lengths(lengths, limits)
    rules.check_nothing_when_not_ok("payload bytes", statuses, lengths)
    return GetResponse(rid, statuses, lengths, checksums)


def _decode_locate_response(rid: int, reader: _Reader, limits: WireLimits) -> LocateResponse:
    count = reader.count(limits)
    arena_id, raw, *fields = reader.unpack(locate_response_layout(count))
    offsets, lengths = fields[:count], fields[count : 2 * count]
    checksums, generations = fields[2 * count : 3 * count], fields[3 * count :]
    message = LocateResponse(rid, arena_id, list(raw), offsets, lengths, checksums, generations)
    rules.check_block_lengths(lengths, limits)
    rules.check_nothing_when_not_ok("a location", message.statuses, offsets, lengths, checksums, generations)
    return message


def _decode_keys(reader: _Reader, limits: WireLimits) -> tuple[str, list[bytes]]:
    raw_namespace = reader.take(reader.byte())
    size = reader.byte()
    count = reader.u32()
    namespace = rules.keys_namespace(raw_namespace, size, count, limits)
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

    def u32(self) -> int:
        value: int = U32.unpack_from(self._data, self._advance(4))[0]
        return value

    def count(self, limits: WireLimits) -> int:
        count = self.u32()
        rules.check_count(count, limits)
        return count

    def array(self, code: str, count: int) -> list[int]:
        start = self._advance(count * _ITEM_BYTES[code])
        return list(struct.unpack_from(f"<{count}{code}", self._data, start))

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack_from(self._data, self._advance(layout.size))

    def expect_end(self) -> None:
        if self._pos != self._end:
            raise ProtocolError(f"{self._end - self._pos} trailing bytes after meta")
