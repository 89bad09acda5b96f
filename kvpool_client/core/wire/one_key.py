"""The single-key GET and PUT, encoded and decoded in one step.

A single-block get or put is made of little else than its frames, so these read and write
them with one fixed layout instead of a reader, a header and a message. They are
specialisations of :mod:`~kvpool_client.core.wire.codec`, not a second codec:

- an encoder writes exactly the bytes ``codec.encode`` writes for the same message;
- a decoder first recognises its frame's shape (the op, one key, the sizes its layout
  fixes) and returns None for anything else; then it applies the same
  :mod:`~kvpool_client.core.wire.rules` the general decoder applies, and returns None when
  one fails, so the general decoder reads those bytes and says what is wrong.

Property tests hold each function here to the general codec on mutated frames.
"""

from __future__ import annotations

import struct

from kvpool_client.core.errors import ProtocolError
from kvpool_client.core.wire import rules
from kvpool_client.core.wire.frames import MAGIC, PROTOCOL_VERSION, RESPONSE_BIT, Op, PutRequest, WireLimits
from kvpool_client.core.wire.layout import HEADER, HEADER_SIZE, KEYS_TAIL, U32, keys_field, pack

# -- GET --------------------------------------------------------------------------------------

# The answer, header and meta in one: count 1 | status | length | checksum.
_GET_ANSWER = struct.Struct("<2sBBHHQIQIBIQ")
GET_ONE_ANSWER_SIZE = _GET_ANSWER.size
_GET_ANSWER_META = GET_ONE_ANSWER_SIZE - HEADER_SIZE
_GET_ANSWER_OP = Op.GET | RESPONSE_BIT


def encode_get_one_request(request_id: int, namespace: str, block: bytes) -> bytes:
    """``encode(GetRequest(request_id, namespace, [block]))``.

    Raises:
        ProtocolError: the namespace or the hash cannot be represented, or the id is out of range.
    """
    keys = keys_field(namespace, (block,))
    return pack(HEADER, MAGIC, PROTOCOL_VERSION, Op.GET, 0, 0, request_id, len(keys), 0) + keys


def decode_get_one_request(
    data: bytes | bytearray | memoryview, limits: WireLimits
) -> tuple[int, str, bytes, int] | None:
    """(request id, namespace, hash, frame size) when ``data`` starts with a whole, well-formed GET
    of one key; None for anything else (not here whole, another shape, a broken frame).

    Reads the buffer in place: the daemon answers most single-block gets from here.
    """
    head = _one_key_head(data, Op.GET, limits)
    if head is None:
        return None
    request_id, payload_len, namespace, block, after, end = head
    if after != end:  # more meta than one key: the general decoder says "trailing bytes"
        return None
    try:
        rules.check_payload(0, payload_len)
    except ProtocolError:
        return None
    return request_id, namespace, block, end


def encode_get_one(request_id: int, status: int, length: int, checksum: int) -> bytes:
    """The answer to a one-key GET, header and meta: ``encode(GetResponse(...))``.

    Raises:
        ProtocolError: a status that is not OK with a length, or a field out of range.
    """
    rules.check_nothing_when_not_ok("payload bytes", (status,), (length,))
    meta = (1, status, length, checksum)
    return pack(_GET_ANSWER, MAGIC, PROTOCOL_VERSION, _GET_ANSWER_OP, 0, 0, request_id, _GET_ANSWER_META, length, *meta)


def decode_get_one(data: bytes, request_id: int, limits: WireLimits) -> tuple[int, int, int] | None:
    """(status, length, checksum) when ``data`` is exactly a well-formed GET answer to one key of
    ``request_id`` (header and meta); None for anything else (an error frame, a partial read,
    a broken frame)."""
    if len(data) != GET_ONE_ANSWER_SIZE:
        return None
    magic, version, op, status, _, rid, meta_len, payload_len, count, key_status, length, checksum = _GET_ANSWER.unpack(
        data
    )
    if op != _GET_ANSWER_OP or status or rid != request_id or meta_len != _GET_ANSWER_META or count != 1:
        return None
    try:
        rules.check_header(magic, version, op, meta_len, payload_len, limits)
        rules.check_count(count, limits)
        rules.check_block_length(length, limits)
        rules.check_nothing_when_not_ok("payload bytes", (key_status,), (length,))
        rules.check_payload(length, payload_len)
    except ProtocolError:
        return None
    return key_status, length, checksum


# -- PUT --------------------------------------------------------------------------------------

# The request's meta after its hash: length u32 | has_depths u8 (and, when 1, the depth u32).
_PUT_LENGTH = struct.Struct("<IB")
# The answer, header and meta in one: count 1 | status.
_PUT_ANSWER = struct.Struct("<2sBBHHQIQIB")
PUT_ONE_ANSWER_SIZE = _PUT_ANSWER.size
_PUT_ANSWER_META = PUT_ONE_ANSWER_SIZE - HEADER_SIZE
_PUT_ANSWER_OP = Op.PUT | RESPONSE_BIT


def encode_put_one_request(request_id: int, namespace: str, block: bytes, length: int, depth: int | None) -> bytes:
    """``encode(PutRequest(request_id, namespace, [block], [length], depths))``, ``depths`` being
    ``[depth]``, or None without one.

    Raises:
        ProtocolError: the namespace, the hash, the length or the depth cannot be represented.
    """
    keys = keys_field(namespace, (block,))
    tail = pack(_PUT_LENGTH, length, depth is not None) + (b"" if depth is None else pack(U32, depth))
    head = pack(HEADER, MAGIC, PROTOCOL_VERSION, Op.PUT, 0, 0, request_id, len(keys) + len(tail), length)
    return head + keys + tail


def decode_put_one_request(data: bytes | bytearray | memoryview, limits: WireLimits) -> tuple[PutRequest, int] | None:
    """The request and its head's size (header and meta) when ``data`` starts with the whole
    head of a well-formed PUT of one block; None for anything else (not here whole, another
    shape, a broken frame).

    Reads the buffer in place: the daemon takes most single-block puts from here.
    """
    head = _one_key_head(data, Op.PUT, limits)
    if head is None:
        return None
    request_id, payload_len, namespace, block, after, end = head
    if after + _PUT_LENGTH.size > end:
        return None
    length, flag = _PUT_LENGTH.unpack_from(data, after)
    if end != after + _PUT_LENGTH.size + (U32.size if flag == 1 else 0):
        return None
    try:
        rules.check_block_length(length, limits)
        depths = [U32.unpack_from(data, end - U32.size)[0]] if rules.depths_flag(flag) else None
        rules.check_payload(length, payload_len)
    except ProtocolError:
        return None
    return PutRequest(request_id, namespace, [block], [length], depths), end


def encode_put_one_answer(request_id: int, status: int) -> bytes:
    """``encode(StatusResponse(request_id, Op.PUT, [status]))``.

    Raises:
        ProtocolError: the status or the id is out of range.
    """
    return pack(_PUT_ANSWER, MAGIC, PROTOCOL_VERSION, _PUT_ANSWER_OP, 0, 0, request_id, _PUT_ANSWER_META, 0, 1, status)


def decode_put_one_answer(data: bytes, request_id: int, limits: WireLimits) -> int | None:
    """The status when ``data`` is exactly a well-formed answer to a PUT of one block with
    ``request_id``; None for anything else (an error frame, a partial read, a broken frame)."""
    if len(data) != PUT_ONE_ANSWER_SIZE:
        return None
    magic, version, op, status, _, rid, meta_len, payload_len, count, key_status = _PUT_ANSWER.unpack(data)
    if op != _PUT_ANSWER_OP or status or rid != request_id or meta_len != _PUT_ANSWER_META or count != 1:
        return None
    try:
        rules.check_header(magic, version, op, meta_len, payload_len, limits)
        rules.check_count(count, limits)
        rules.check_payload(0, payload_len)
    except ProtocolError:
        return None
    return int(key_status)


# -- the head of a one-key request ---------------------------------------------------------------

_REQUEST_HEAD = struct.Struct("<2sBBHHQIQB")  # the header and ns_len


def _one_key_head(
    data: bytes | bytearray | memoryview, op: Op, limits: WireLimits
) -> tuple[int, int, str, bytes, int, int] | None:
    """(request id, payload length, namespace, hash, where the hash ends, where the head ends)
    when ``data`` starts with the whole head of an ``op`` request for one key, well-formed up to
    its hash; None otherwise."""
    if len(data) < _REQUEST_HEAD.size:
        return None
    magic, version, code, _, _, request_id, meta_len, payload_len, ns_len = _REQUEST_HEAD.unpack_from(data)
    tail = HEADER_SIZE + 1 + ns_len  # hash_size u8 | count u32
    end = HEADER_SIZE + meta_len
    if code != op or len(data) < end or end < tail + KEYS_TAIL.size:
        return None
    size, count = KEYS_TAIL.unpack_from(data, tail)
    after = tail + KEYS_TAIL.size + size
    if count != 1 or after > end:
        return None
    try:
        rules.check_header(magic, version, code, meta_len, payload_len, limits)
        namespace = rules.keys_namespace(data[HEADER_SIZE + 1 : tail], size, count, limits)
    except ProtocolError:
        return None
    return request_id, payload_len, namespace, bytes(data[after - size : after]), after, end
