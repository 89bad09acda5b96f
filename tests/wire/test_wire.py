"""The data-plane codec, tested h11-style: every encoder by its decoder, bytes only, no sockets."""

from __future__ import annotations

import contextlib
import struct
import tracemalloc
from datetime import timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvpool_client.core.errors import ErrorCode, LimitExceeded, ProtocolError
from kvpool_client.core.wire.codec import decode_header, decode_message, encode, payload_length, payload_lengths
from kvpool_client.core.wire.frames import (
    MAX_HASH_BYTES,
    MAX_NAMESPACE_BYTES,
    MAX_TOKEN_BYTES,
    RESPONSE_BIT,
    CommitRequest,
    DeleteRequest,
    ErrorResponse,
    ExistsRequest,
    GetRequest,
    GetResponse,
    HelloRequest,
    HelloResponse,
    LocateRequest,
    LocateResponse,
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
from kvpool_client.core.wire.layout import HEADER_SIZE
from kvpool_client.core.wire.one_key import (
    decode_get_one,
    decode_get_one_request,
    decode_put_one_answer,
    decode_put_one_request,
    encode_get_one,
    encode_get_one_request,
    encode_put_one_answer,
    encode_put_one_request,
)

LIMITS = WireLimits(max_keys=8, max_block_size=1024, max_payload=1 << 20)
FUZZ = settings(max_examples=300, deadline=timedelta(milliseconds=500))
U64 = (1 << 64) - 1

# -- strategies ---------------------------------------------------------------


def _clip_utf8(text: str) -> str:
    """Longest prefix of ``text`` whose UTF-8 fits a namespace (cut on a character boundary)."""
    return text.encode()[:MAX_NAMESPACE_BYTES].decode("utf-8", "ignore")


request_ids = st.integers(0, U64)
namespaces = st.text(min_size=1, max_size=MAX_NAMESPACE_BYTES).map(_clip_utf8)
statuses = st.one_of(st.just(0), st.integers(0, 255))


@st.composite
def hash_lists(draw) -> list[bytes]:
    """Hashes of one frame share one size."""
    size = draw(st.integers(1, MAX_HASH_BYTES))
    return draw(st.lists(st.binary(min_size=size, max_size=size), max_size=LIMITS.max_keys))


@st.composite
def put_requests(draw) -> PutRequest:
    hashes = draw(hash_lists())
    lengths = [draw(st.integers(0, LIMITS.max_block_size)) for _ in hashes]
    depths = [draw(st.integers(0, 2**32 - 1)) for _ in hashes] if draw(st.booleans()) else None
    return PutRequest(draw(request_ids), draw(namespaces), hashes, lengths, depths)


@st.composite
def get_responses(draw) -> GetResponse:
    codes = draw(st.lists(statuses, max_size=LIMITS.max_keys))
    lengths = [draw(st.integers(0, LIMITS.max_block_size)) if s == ErrorCode.OK else 0 for s in codes]
    checksums = [draw(st.integers(0, U64)) for _ in codes]
    return GetResponse(draw(request_ids), codes, lengths, checksums)


@st.composite
def locate_responses(draw) -> LocateResponse:
    codes = draw(st.lists(statuses, max_size=LIMITS.max_keys))

    def per_key(values: st.SearchStrategy[int]) -> list[int]:
        return [draw(values) if s == ErrorCode.OK else 0 for s in codes]

    offsets, lengths = per_key(st.integers(0, U64)), per_key(st.integers(0, LIMITS.max_block_size))
    checksums, generations = per_key(st.integers(0, U64)), per_key(st.integers(0, U64))
    return LocateResponse(draw(request_ids), draw(st.integers(0, U64)), codes, offsets, lengths, checksums, generations)


@st.composite
def reserve_requests(draw) -> ReserveRequest:
    put = draw(put_requests())
    return ReserveRequest(put.request_id, put.namespace, put.hashes, [max(n, 1) for n in put.lengths], put.depths)


@st.composite
def reserve_responses(draw) -> ReserveResponse:
    codes = draw(st.lists(statuses, max_size=LIMITS.max_keys))
    offsets = [draw(st.integers(0, U64)) if s == ErrorCode.OK else 0 for s in codes]
    return ReserveResponse(draw(request_ids), draw(st.integers(0, U64)), draw(st.integers(0, U64)), codes, offsets)


u64s = st.integers(0, U64)
messages = st.one_of(
    put_requests(),
    reserve_requests(),
    reserve_responses(),
    st.builds(CommitRequest, request_ids, u64s, st.lists(u64s, max_size=LIMITS.max_keys)),
    st.builds(PeerRequest, request_ids),
    st.builds(PeerResponse, request_ids, u64s, u64s, u64s, u64s, st.binary(max_size=600)),
    st.builds(GetRequest, request_ids, namespaces, hash_lists()),
    st.builds(ExistsRequest, request_ids, namespaces, hash_lists(), prefix=st.booleans()),
    st.builds(DeleteRequest, request_ids, namespaces, hash_lists()),
    st.builds(PingRequest, request_ids),
    st.builds(
        StatusResponse,
        request_ids,
        st.sampled_from([Op.PUT, Op.EXISTS, Op.DELETE, Op.COMMIT]),
        st.lists(statuses, max_size=LIMITS.max_keys),
    ),
    get_responses(),
    st.builds(PingResponse, request_ids),
    st.builds(LocateRequest, request_ids, namespaces, hash_lists()),
    locate_responses(),
    st.builds(HelloRequest, request_ids, st.binary(max_size=MAX_TOKEN_BYTES)),
    st.builds(HelloResponse, request_ids),
    st.builds(ErrorResponse, request_ids, st.sampled_from(Op), st.integers(1, 0xFFFF), st.text(max_size=200)),
)

# -- helpers ------------------------------------------------------------------


def decode_frame(frame: bytes, limits: WireLimits = LIMITS):
    """Decode header + meta of one frame, as a reader would: header first, then exactly meta_len bytes."""
    header = decode_header(frame[:HEADER_SIZE], limits)
    return decode_message(header, frame[HEADER_SIZE : HEADER_SIZE + header.meta_len], limits)


def raw_header(
    op: int = Op.GET,
    *,
    magic: bytes = b"KV",
    version: int = 1,
    status: int = 0,
    request_id: int = 7,
    meta_len: int = 0,
    payload_len: int = 0,
) -> bytes:
    """A header packed from the documented layout, independent of the codec's own struct."""
    return struct.pack("<2sBBHHQIQ", magic, version, op, status, 0, request_id, meta_len, payload_len)


def raw_keys(ns: bytes, hash_size: int, count: int, hashes: bytes = b"") -> bytes:
    return bytes([len(ns)]) + ns + bytes([hash_size]) + struct.pack("<I", count) + hashes


def split(frame: bytes):
    """Encoded frame -> (header, meta bytes)."""
    return decode_header(frame[:HEADER_SIZE], LIMITS), frame[HEADER_SIZE:]


def payload_for(message, tag: int) -> bytes:
    return bytes((tag + i) % 256 for i in range(payload_length(message)))


def send(messages_and_payloads) -> bytes:
    """Client side of the pair: frames back to back, each followed by its payload."""
    return b"".join(encode(m) + p for m, p in messages_and_payloads)


def receive(chunks, limits: WireLimits = LIMITS) -> list:
    """Server side of the pair, a tiny pure reader: header once 28 bytes are in, then meta, then payload."""
    buf, frames, header, pending = bytearray(), [], None, None  # pending: payload bytes still to move
    for chunk in chunks:
        buf += chunk
        while True:
            if header is None and len(buf) >= HEADER_SIZE:
                header = decode_header(bytes(buf[:HEADER_SIZE]), limits)
                del buf[:HEADER_SIZE]
            elif header is not None and pending is None and len(buf) >= header.meta_len:
                frames.append((decode_message(header, bytes(buf[: header.meta_len]), limits), bytearray()))
                del buf[: header.meta_len]
                pending = header.payload_len
            elif pending is not None and (buf or not pending):
                moved = buf[:pending]
                frames[-1][1].extend(moved)
                del buf[:pending]
                pending -= len(moved)
                if pending == 0:
                    header = pending = None
            else:
                break
    assert header is None and not buf, f"stream ended mid-frame: header={header}, {len(buf)} bytes left"
    return [(message, bytes(payload)) for message, payload in frames]


# -- round trips and framing --------------------------------------------------


@given(messages)
@settings(max_examples=400)
def test_every_message_round_trips(message):
    frame = encode(message)
    header, meta = split(frame)
    decoded = decode_message(header, meta, LIMITS)
    assert decoded == message, f"sent {message!r}, decoded {decoded!r}"
    assert header.request_id == message.request_id, f"header {header}"
    assert header.payload_len == payload_length(message) == sum(payload_lengths(message)), (
        f"header {header}, payload_length {payload_length(message)}, blocks {payload_lengths(message)}"
    )
    responses = (
        StatusResponse,
        GetResponse,
        PingResponse,
        ErrorResponse,
        LocateResponse,
        HelloResponse,
        PeerResponse,
        ReserveResponse,
    )
    is_response = isinstance(message, responses)
    assert header.is_response == is_response, f"header {header} for {message!r}"


@pytest.mark.parametrize("namespace", ["a" * 255, "é" * 127 + "a", "😀" * 63 + "abc", "\x00"])
@pytest.mark.parametrize("size", [1, MAX_HASH_BYTES])
def test_boundary_values_round_trip(namespace, size):
    assert len(namespace.encode()) <= MAX_NAMESPACE_BYTES, f"{len(namespace.encode())} bytes"
    keys = [bytes([i]) * size for i in range(LIMITS.max_keys)]
    full = [LIMITS.max_block_size] * LIMITS.max_keys
    for message in (
        PutRequest(U64, namespace, keys, full),
        ExistsRequest(0, namespace, keys, prefix=True),
        GetResponse(U64, [0] * LIMITS.max_keys, full, [U64] * LIMITS.max_keys),
    ):
        decoded = decode_frame(encode(message))
        assert decoded == message, f"sent {message!r}, decoded {decoded!r}"


@given(st.lists(messages, min_size=1, max_size=5), st.data())
@settings(max_examples=150)
def test_frames_are_self_delimiting_in_a_chunked_stream(batch, data):
    sent = [(m, payload_for(m, tag)) for tag, m in enumerate(batch)]
    stream = send(sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20), label="cuts"))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    received = receive(chunks)
    assert received == sent, f"cuts {cuts}: sent {sent!r}, received {received!r}"


def test_stream_fed_one_byte_at_a_time():
    sent = [
        (PutRequest(1, "ns", [b"ab", b"cd"], [3, 0]), b"xyz"),
        (PingRequest(2), b""),
        (GetResponse(3, [0, 1], [5, 0], [9, 0]), b"hello"),
        (ErrorResponse(4, Op.GET, 30, "boom"), b""),
    ]
    stream = send(sent)
    received = receive(stream[i : i + 1] for i in range(len(stream)))
    assert received == sent, f"received {received!r}"


# -- limits and malformed frames ----------------------------------------------

TOO_MANY = [b"h"] * (LIMITS.max_keys + 1)


@pytest.mark.parametrize(
    "message",
    [
        GetRequest(1, "ns", TOO_MANY),
        DeleteRequest(1, "ns", TOO_MANY),
        ExistsRequest(1, "ns", TOO_MANY),
        PutRequest(1, "ns", TOO_MANY, [0] * len(TOO_MANY)),
        StatusResponse(1, Op.PUT, [0] * len(TOO_MANY)),
        GetResponse(1, [0] * len(TOO_MANY), [0] * len(TOO_MANY), [0] * len(TOO_MANY)),
        PutRequest(1, "ns", [b"h"], [LIMITS.max_block_size + 1]),
        GetResponse(1, [0], [LIMITS.max_block_size + 1], [0]),
    ],
    ids=lambda m: type(m).__name__,
)
def test_decoder_enforces_key_and_block_limits(message):
    with pytest.raises(LimitExceeded) as info:
        decode_frame(encode(message))
    assert info.value.code == ErrorCode.LIMIT_EXCEEDED, f"raised {info.value}"


@pytest.mark.parametrize(
    "header, code",
    [
        (raw_header(magic=b"VK"), ErrorCode.PROTOCOL),
        (raw_header(version=0), ErrorCode.UNSUPPORTED_VERSION),
        (raw_header(version=2), ErrorCode.UNSUPPORTED_VERSION),
        (raw_header(op=0), ErrorCode.PROTOCOL),
        (raw_header(op=max(Op) + 1), ErrorCode.PROTOCOL),
        (raw_header(op=RESPONSE_BIT), ErrorCode.PROTOCOL),
        (raw_header(op=0xFF), ErrorCode.PROTOCOL),
        (raw_header()[:-1], ErrorCode.PROTOCOL),
        (raw_header() + b"\0", ErrorCode.PROTOCOL),
        # Oversized sections are refused from the 28 header bytes alone, before any meta is read.
        (raw_header(meta_len=LIMITS.max_meta + 1), ErrorCode.LIMIT_EXCEEDED),
        (raw_header(meta_len=0xFFFFFFFF), ErrorCode.LIMIT_EXCEEDED),
        (raw_header(payload_len=LIMITS.max_payload + 1), ErrorCode.LIMIT_EXCEEDED),
        (raw_header(payload_len=U64), ErrorCode.LIMIT_EXCEEDED),
    ],
)
def test_header_rejects_bad_magic_version_op_size_and_limits(header, code):
    with pytest.raises(ProtocolError) as info:
        decode_header(header, LIMITS)
    assert info.value.code == code, f"expected {code.name}, raised {info.value}"


def test_header_at_the_limits_is_accepted():
    header = decode_header(raw_header(meta_len=LIMITS.max_meta, payload_len=LIMITS.max_payload), LIMITS)
    assert (header.meta_len, header.payload_len) == (LIMITS.max_meta, LIMITS.max_payload), f"{header}"


def test_the_meta_limit_follows_the_key_limit():
    small, large = WireLimits(max_keys=16), WireLimits(max_keys=4096)
    assert small.max_meta < large.max_meta, (small.max_meta, large.max_meta)
    assert small == WireLimits(max_keys=16) and small != large, "limits compare by their settings"
    assert decode_header(raw_header(meta_len=large.max_meta), large).meta_len == large.max_meta
    with pytest.raises(ProtocolError):
        decode_header(raw_header(meta_len=large.max_meta), small)


# Error text, tokens and agent metadata are free-form (any cut is valid); pings, hello answers and
# peer requests have no meta to cut.
FREE_FORM = (ErrorResponse, PingRequest, PingResponse, HelloRequest, HelloResponse, PeerRequest, PeerResponse)


@given(messages.filter(lambda m: not isinstance(m, FREE_FORM)))
@settings(max_examples=100)
def test_truncated_meta_is_rejected_at_every_cut_point(message):
    header, meta = split(encode(message))
    for cut in range(len(meta)):
        for claimed in (header, header._replace(meta_len=cut)):
            with pytest.raises(ProtocolError):
                decode_message(claimed, meta[:cut], LIMITS)
                pytest.fail(f"{message!r} cut at {cut}/{len(meta)} (meta_len {claimed.meta_len}) decoded")


@given(
    messages.filter(lambda m: not isinstance(m, (ErrorResponse, HelloRequest, PeerResponse))),
    st.binary(min_size=1, max_size=8),
)
def test_trailing_meta_bytes_are_rejected(message, extra):
    header, meta = split(encode(message))
    with pytest.raises(ProtocolError, match="trailing"):
        decode_message(header._replace(meta_len=len(meta) + len(extra)), meta + extra, LIMITS)


@pytest.mark.parametrize(
    "message, claimed",
    [
        (PutRequest(1, "ns", [b"a", b"b"], [3, 4]), 6),
        (PutRequest(1, "ns", [b"a"], [3]), 4),
        (GetRequest(1, "ns", [b"a"]), 1),
        (PingRequest(1), 1),
        (StatusResponse(1, Op.PUT, [0]), 1),
        (GetResponse(1, [0, 1], [5, 0], [0, 0]), 0),
        (ErrorResponse(1, Op.GET, 30, "x"), 2),
    ],
)
def test_payload_len_must_match_the_lengths_in_meta(message, claimed):
    header, meta = split(encode(message))
    with pytest.raises(ProtocolError, match="header says"):
        decode_message(header._replace(payload_len=claimed), meta, LIMITS)


@pytest.mark.parametrize(
    "meta, reason",
    [
        (raw_keys(b"\xff\xfe", 1, 0), "not UTF-8"),
        (raw_keys(b"\xc3", 1, 0), "not UTF-8"),
        (raw_keys(b"", 1, 0), "empty namespace"),
        (raw_keys(b"ns", 0, 0), "hash size"),
        (raw_keys(b"ns", MAX_HASH_BYTES + 1, 0), "hash size"),
    ],
)
def test_malformed_keys_section_is_rejected(meta, reason):
    with pytest.raises(ProtocolError, match=reason):
        decode_frame(raw_header(Op.GET, meta_len=len(meta)) + meta)


def test_get_response_with_payload_for_a_missing_key_is_rejected():
    with pytest.raises(ProtocolError, match="not OK"):
        decode_frame(encode(GetResponse(1, [ErrorCode.NOT_FOUND], [3], [0])))


@pytest.mark.parametrize(
    "message",
    [
        GetRequest(1, "ns", [b"a", b"bb"]),
        DeleteRequest(1, "", [b"a"]),
        GetRequest(1, "é" * 128, [b"a"]),
        ExistsRequest(1, "ns", [b"x" * (MAX_HASH_BYTES + 1)]),
        GetRequest(1, "ns", [b""]),
        PutRequest(1, "ns", [b"a", b"b"], [1]),
        PutRequest(1, "ns", [b"a"], [-1]),
        PutRequest(1, "ns", [b"a"], [1 << 32]),
        GetResponse(1, [0, 0], [1], [0, 0]),
        GetResponse(1, [0], [1], [0, 0]),
        GetResponse(1, [0], [1 << 32], [0]),
        GetResponse(1, [0], [1], [1 << 64]),
    ],
    ids=lambda m: repr(m)[:60],
)
def test_encode_rejects_unrepresentable_messages(message):
    with pytest.raises(ProtocolError):
        frame = encode(message)
        pytest.fail(f"encoded {message!r} as {frame!r}")


@pytest.mark.parametrize(
    "message",
    [
        StatusResponse(1, Op.PUT, [256]),
        PingRequest(-1),
        PingRequest(1 << 64),
        ErrorResponse(1, Op.GET, 1 << 16, "x"),
        GetRequest(1, "ns\ud800", [b"a"]),
        ErrorResponse(1, Op.PING, ErrorCode.OK, ""),
        StatusResponse(1, Op.PING, [0]),
        GetResponse(1, [1], [3], [0]),
    ],
    ids=lambda m: repr(m)[:60],
)
def test_encode_raises_protocol_error_or_round_trips(message):
    try:
        frame = encode(message)
    except ProtocolError:
        return
    decoded = decode_frame(frame, WireLimits())
    assert decoded == message, f"encoded {message!r}, decoded {decoded!r}"


# -- fuzzing and bounded allocation -------------------------------------------


def decodes_or_rejects(frame: bytes, limits: WireLimits = LIMITS) -> None:
    """A frame either decodes or raises ProtocolError (LimitExceeded included); anything else escapes."""
    with contextlib.suppress(ProtocolError):
        decode_frame(frame, limits)


@given(st.binary(max_size=400))
@FUZZ
def test_random_bytes_never_crash_the_decoder(data):
    decodes_or_rejects(data)
    decodes_or_rejects(raw_header(meta_len=len(data))[:4] + data)  # past magic and version


@given(
    st.integers(0, 255),
    st.one_of(st.just(0), st.integers(0, 0xFFFF)),
    st.binary(max_size=600),
    st.one_of(st.just(0), st.integers(0, LIMITS.max_payload)),
)
@FUZZ
def test_random_meta_behind_a_valid_header_never_crashes(op, status, meta, payload_len):
    decodes_or_rejects(raw_header(op, status=status, meta_len=len(meta), payload_len=payload_len) + meta)


mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6)),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=16)),
)


def mutate(frame: bytes, mutation) -> bytes:
    kind, *args = mutation
    if kind == "flip" and frame:
        at = args[0] % len(frame)
        return frame[:at] + bytes([frame[at] ^ args[1]]) + frame[at + 1 :]
    if kind == "truncate":
        return frame[: args[0] % (len(frame) + 1)]
    return frame + args[0] if kind == "extend" else frame


@given(messages, st.lists(mutations, min_size=1, max_size=4))
@FUZZ
def test_mutated_frames_decode_or_raise_protocol_error(message, changes):
    frame = encode(message)
    for change in changes:
        frame = mutate(frame, change)
    decodes_or_rejects(frame)


def peak_allocation_while_rejecting(frame: bytes, limits: WireLimits) -> tuple[int, ProtocolError]:
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as info:
            decode_frame(frame, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, info.value


BIG = WireLimits(max_keys=1 << 20)  # a lying count of 1 Mi keys would cost 64 MiB of hashes if trusted


@pytest.mark.parametrize(
    "op, meta",
    [
        (Op.GET, raw_keys(b"ns", MAX_HASH_BYTES, BIG.max_keys)),
        (Op.PUT, raw_keys(b"ns", MAX_HASH_BYTES, BIG.max_keys, b"\0" * 4096)),
        (Op.EXISTS, b"\1" + raw_keys(b"ns", MAX_HASH_BYTES, BIG.max_keys)),
        (Op.PUT | RESPONSE_BIT, struct.pack("<I", BIG.max_keys)),
        (Op.GET | RESPONSE_BIT, struct.pack("<I", BIG.max_keys) + b"\0" * 4096),
    ],
    ids=["get", "put", "exists", "status", "get-response"],
)
def test_a_lying_key_count_is_rejected_without_allocating_for_it(op, meta):
    peak, error = peak_allocation_while_rejecting(raw_header(op, meta_len=len(meta)) + meta, BIG)
    assert "truncated" in str(error), f"raised {error}"
    assert peak < 1 << 20, f"peak allocation {peak} bytes for a {len(meta)}-byte meta"


def test_huge_announced_sections_fail_in_the_header_with_small_allocation():
    header = raw_header(Op.PUT, meta_len=0xFFFFFFFF, payload_len=U64)
    peak, error = peak_allocation_while_rejecting(header, BIG)
    assert isinstance(error, LimitExceeded), f"raised {error!r}"
    assert peak < 1 << 20, f"peak allocation {peak} bytes"


# -- LOCATE (the shm transport's request) ------------------------------------------


@given(locate_responses())
@FUZZ
def test_locate_response_meta_size_is_what_the_client_expects(message):
    frame = encode(message)
    assert len(frame) - HEADER_SIZE == 12 + 29 * len(message.statuses)
    assert payload_length(message) == 0 and decode_frame(frame) == message


@pytest.mark.parametrize("field", ["offsets", "lengths", "checksums", "generations"])
def test_a_key_that_is_not_ok_cannot_carry_a_location(field):
    message = LocateResponse(7, 1, [ErrorCode.NOT_FOUND], [0], [0], [0], [0])
    getattr(message, field)[0] = 4096
    with pytest.raises(ProtocolError):
        encode(message)
    valid = LocateResponse(7, 1, [ErrorCode.OK], [0], [0], [0], [0])
    getattr(valid, field)[0] = 4096
    frame = bytearray(encode(valid))
    frame[HEADER_SIZE + 12] = ErrorCode.NOT_FOUND  # the first status byte
    with pytest.raises(ProtocolError):
        decode_frame(bytes(frame))


def test_locate_response_block_over_the_limit_is_rejected():
    frame = encode(LocateResponse(7, 1, [ErrorCode.OK], [0], [LIMITS.max_block_size + 1], [0], [0]))
    with pytest.raises(LimitExceeded):
        decode_frame(frame)


@pytest.mark.parametrize("field", ["offsets", "lengths", "checksums", "generations"])
def test_locate_response_lists_must_match_the_statuses(field):
    message = LocateResponse(7, 1, [ErrorCode.OK, ErrorCode.OK], [0, 0], [1, 1], [0, 0], [0, 0])
    getattr(message, field).pop()
    with pytest.raises(ProtocolError):
        encode(message)


# -- the one-key GET and PUT, read and written in one step (decode_*_one*, encode_*_one*) --------

# Limits around the frames the strategies draw, down to none at all: a one-key decoder applies
# every rule the general decoder applies, whatever the limits (it once ignored max_keys).
limit_sets = st.builds(
    WireLimits,
    max_keys=st.integers(0, 2),
    max_block_size=st.integers(0, LIMITS.max_block_size + 1),
    max_payload=st.integers(0, LIMITS.max_payload),
)


def general_or_none(frame: bytes, limits: WireLimits = LIMITS):
    """What the general decoder makes of one whole frame, or None when it rejects it."""
    try:
        return decode_frame(frame, limits) if len(frame) >= HEADER_SIZE else None
    except ProtocolError:
        return None


one_key_answers = st.builds(
    GetResponse,
    request_ids,
    st.lists(statuses, min_size=1, max_size=1),
    st.lists(st.integers(0, LIMITS.max_block_size + 1), min_size=1, max_size=1),
    st.lists(st.integers(0, U64), min_size=1, max_size=1),
)


@given(one_key_answers, st.lists(mutations, max_size=3), st.one_of(st.just(LIMITS), limit_sets))
@example(GetResponse(7, [ErrorCode.OK], [4], [1]), [], WireLimits(max_keys=0))
@FUZZ
def test_a_one_key_answer_reads_as_the_general_decoder_reads_it(message, changes, limits):
    message.lengths[0] *= message.statuses[0] == ErrorCode.OK  # else encode refuses it
    frame = encode(message)
    for change in changes:
        frame = mutate(frame, change)
    fast = decode_get_one(frame, message.request_id, limits)
    general = general_or_none(frame, limits)
    if fast is not None:  # never accepts what the general path rejects, and reads the same
        assert general is not None, (fast, frame)
        expected = (general.request_id, general.statuses, general.lengths, general.checksums)
        assert (message.request_id, [fast[0]], [fast[1]], [fast[2]]) == expected, (fast, general)
    elif not changes:  # a well-formed answer is read here unless the general path rejects it too
        assert general is None, (message, general)


@pytest.mark.parametrize(
    "frame",
    [
        encode(ErrorResponse(7, Op.GET, ErrorCode.NOT_FOUND, "gone")),
        encode(GetResponse(8, [ErrorCode.OK], [4], [1])),  # another request's answer
        encode(GetResponse(7, [ErrorCode.OK, ErrorCode.OK], [4, 4], [1, 2])),
        encode(StatusResponse(7, Op.DELETE, [ErrorCode.OK])),
        encode(GetResponse(7, [ErrorCode.OK], [4], [1]))[:-1],
    ],
    ids=["error", "other-id", "two-keys", "other-op", "short"],
)
def test_a_frame_that_is_not_a_one_key_answer_is_left_to_the_general_path(frame):
    assert decode_get_one(frame, 7, LIMITS) is None


@given(request_ids, statuses, st.integers(0, LIMITS.max_block_size), st.integers(0, U64))
@FUZZ
def test_encode_get_one_writes_what_encode_writes(request_id, status, length, checksum):
    message = GetResponse(request_id, [status], [length], [checksum])
    try:
        expected = encode(message)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            encode_get_one(request_id, status, length, checksum)
        return
    assert encode_get_one(request_id, status, length, checksum) == expected
    assert decode_get_one(expected, request_id, LIMITS) == (status, length, checksum)


def _read_get_one(data: bytearray, limits: WireLimits) -> tuple[GetRequest, int] | None:
    fast = decode_get_one_request(data, limits)
    return None if fast is None else (GetRequest(fast[0], fast[1], [fast[2]]), fast[3])


def _read_put_one(data: bytearray, limits: WireLimits) -> tuple[PutRequest, int] | None:
    return decode_put_one_request(data, limits)


one_key_requests = st.one_of(
    st.builds(GetRequest, request_ids, namespaces, hash_lists().filter(lambda h: len(h) == 1)),
    put_requests().filter(lambda m: len(m.hashes) == 1),
)


@pytest.mark.parametrize(("read_one", "kind"), [(_read_get_one, GetRequest), (_read_put_one, PutRequest)])
@given(
    st.one_of(messages, one_key_requests),
    st.lists(mutations, max_size=3),
    st.binary(max_size=40),
    st.one_of(st.just(LIMITS), limit_sets),
)
# A cut frame that the following byte completes: the one-key reader reads the whole head.
@example(GetRequest(0, "00000\x80\U00010000\U00010000", [b"\x00" * 20]), [("truncate", 488)], b"\x00", LIMITS)
@FUZZ
def test_a_one_key_request_reads_as_the_general_decoder_reads_it(read_one, kind, message, changes, after, limits):
    frame = encode(message)
    for change in changes:
        frame = mutate(frame, change)
    stream = frame + after  # a put's payload or the next frame may follow the head
    fast = read_one(bytearray(stream), limits)
    general = general_or_none(frame, limits)
    if fast is not None:
        request, size = fast
        # The head ends where its header says: the general decoder reads the same bytes of the
        # stream (which a cut mutation may have completed with bytes of ``after``).
        alone = general_or_none(stream[:size], limits)
        assert alone == request and general in (alone, None), (fast, general)
    elif isinstance(general, kind) and len(general.hashes) == 1:
        raise AssertionError(f"a one-key {kind.__name__} was left to the general path: {general}")


def test_a_one_key_get_request_not_all_here_waits():
    frame = encode(GetRequest(3, "ns", [b"h" * 32]))
    assert decode_get_one_request(bytearray(frame), LIMITS) == (3, "ns", b"h" * 32, len(frame))
    assert all(decode_get_one_request(bytearray(frame[:cut]), LIMITS) is None for cut in range(len(frame)))


@given(request_ids, st.one_of(namespaces, st.text(max_size=300)), st.binary(max_size=MAX_HASH_BYTES + 2))
@FUZZ
def test_encode_get_one_request_writes_what_encode_writes(request_id, namespace, block):
    try:
        expected = encode(GetRequest(request_id, namespace, [block]))
    except ProtocolError:
        with pytest.raises(ProtocolError):
            encode_get_one_request(request_id, namespace, block)
        return
    assert encode_get_one_request(request_id, namespace, block) == expected
    assert decode_get_one_request(bytearray(expected), LIMITS) == (request_id, namespace, block, len(expected))


def test_a_one_block_put_request_not_all_here_waits():
    request = PutRequest(3, "ns", [b"h" * 32], [100], [7])
    frame = encode(request)
    assert decode_put_one_request(bytearray(frame + b"x" * 100), LIMITS) == (request, len(frame))
    assert all(decode_put_one_request(bytearray(frame[:cut]), LIMITS) is None for cut in range(len(frame)))


@given(
    request_ids,
    st.one_of(namespaces, st.text(max_size=300)),
    st.binary(max_size=MAX_HASH_BYTES + 2),
    st.integers(0, 2**32),
    st.one_of(st.none(), st.integers(0, 2**32)),
)
@FUZZ
def test_encode_put_one_request_writes_what_encode_writes(request_id, namespace, block, length, depth):
    message = PutRequest(request_id, namespace, [block], [length], None if depth is None else [depth])
    try:
        expected = encode(message)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            encode_put_one_request(request_id, namespace, block, length, depth)
        return
    assert encode_put_one_request(request_id, namespace, block, length, depth) == expected
    if length <= LIMITS.max_block_size:
        assert decode_put_one_request(bytearray(expected), LIMITS) == (message, len(expected))


@given(request_ids, st.integers(-1, 256))
@FUZZ
def test_encode_put_one_answer_writes_what_encode_writes(request_id, status):
    try:
        expected = encode(StatusResponse(request_id, Op.PUT, [status]))
    except ProtocolError:
        with pytest.raises(ProtocolError):
            encode_put_one_answer(request_id, status)
        return
    assert encode_put_one_answer(request_id, status) == expected
    assert decode_put_one_answer(expected, request_id, LIMITS) == status


@given(
    st.builds(StatusResponse, request_ids, st.just(Op.PUT), st.lists(statuses, min_size=1, max_size=1)),
    st.lists(mutations, max_size=3),
    st.one_of(st.just(LIMITS), limit_sets),
)
@example(StatusResponse(7, Op.PUT, [ErrorCode.OK]), [], WireLimits(max_keys=0))
@FUZZ
def test_a_one_block_put_answer_reads_as_the_general_decoder_reads_it(message, changes, limits):
    frame = encode(message)
    for change in changes:
        frame = mutate(frame, change)
    fast = decode_put_one_answer(frame, message.request_id, limits)
    general = general_or_none(frame, limits)
    if fast is not None:
        assert general == StatusResponse(message.request_id, Op.PUT, [fast]), (fast, general)
    elif not changes:
        assert general is None, (message, general)


@pytest.mark.parametrize(
    "frame",
    [
        encode(ErrorResponse(7, Op.PUT, ErrorCode.OVERLOADED, "busy")),
        encode(StatusResponse(8, Op.PUT, [ErrorCode.OK])),  # another request's answer
        encode(StatusResponse(7, Op.PUT, [ErrorCode.OK, ErrorCode.OK])),
        encode(StatusResponse(7, Op.DELETE, [ErrorCode.OK])),
        encode(StatusResponse(7, Op.PUT, [ErrorCode.OK]))[:-1],
    ],
    ids=["error", "other-id", "two-keys", "other-op", "short"],
)
def test_a_frame_that_is_not_a_one_block_put_answer_is_left_to_the_general_path(frame):
    assert decode_put_one_answer(frame, 7, LIMITS) is None
