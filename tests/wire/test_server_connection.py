"""The daemon's connection state machine, fed bytes by hand: no sockets, no daemon."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_client.core.errors import AuthenticationError, ProtocolError
from kvpool_client.core.wire import (
    HEADER_SIZE,
    DeleteRequest,
    ExistsRequest,
    GetRequest,
    GetResponse,
    HelloRequest,
    LocateRequest,
    Op,
    PingRequest,
    PutRequest,
    WireLimits,
    encode,
)
from kvpool_client.core.wire.connection import (
    NEED_DATA,
    GetOne,
    Hello,
    LocalProtocolError,
    Refusal,
    ServerConnection,
    State,
)

LIMITS = WireLimits(max_keys=8, max_block_size=1 << 16)
TOKEN = b"s3cret-token"
H = [bytes([i]) * 16 for i in range(8)]


def put(request_id: int, blocks: list[bytes]) -> bytes:
    return encode(PutRequest(request_id, "ns", H[: len(blocks)], [len(b) for b in blocks])) + b"".join(blocks)


def events_of(machine: ServerConnection, pieces: list[bytes], *, take_gets: bool = False) -> list[object]:
    """Feed ``pieces`` one at a time and collect every event, payload bytes included as bytes;
    with ``take_gets``, through :meth:`~ServerConnection.receive_get_one`, as the daemon's callback does."""
    seen: list[object] = []
    for piece in pieces:
        if take_gets and (get := machine.receive_get_one(memoryview(piece))) is not None:
            seen.append(get)
            assert not machine.buffered, f"a GET taken whole left {machine.buffered} bytes buffered"
            continue
        if not take_gets:
            machine.receive_data(piece)
        while machine.state is not State.CLOSED:
            if machine.state is State.PAYLOAD:
                target = bytearray(machine.payload_buffered)
                if not target:
                    break
                machine.take_payload(memoryview(target))
                seen.append(bytes(target))
                continue
            event = machine.next_event()
            if event is NEED_DATA:
                break
            seen.append(event)
    return seen


def joined_payload(events: list[object]) -> list[object]:
    """Merge consecutive payload pieces: how a stream was split must not show."""
    merged: list[object] = []
    for event in events:
        if isinstance(event, bytes) and merged and isinstance(merged[-1], bytes):
            merged[-1] += event
        else:
            merged.append(event)
    return merged


FRAMES = [
    encode(GetRequest(1, "ns", [H[0]])),
    put(2, [b"a" * 700, b"b" * 3]),
    encode(GetRequest(3, "ns", H[:3])),
    encode(LocateRequest(4, "ns", H[:2])),
    encode(ExistsRequest(5, "ns", H[:2], prefix=True)),
    encode(DeleteRequest(6, "ns", [H[1]])),
    encode(PingRequest(7)),
    put(8, [b"c" * 5]),
]
STREAM = b"".join(FRAMES)
EXPECTED = [
    GetOne(1, "ns", H[0]),
    PutRequest(2, "ns", H[:2], [700, 3]),
    b"a" * 700 + b"b" * 3,
    GetRequest(3, "ns", H[:3]),
    LocateRequest(4, "ns", H[:2]),
    ExistsRequest(5, "ns", H[:2], prefix=True),
    DeleteRequest(6, "ns", [H[1]]),
    PingRequest(7),
    PutRequest(8, "ns", H[:1], [5]),
    b"c" * 5,
]


def test_a_stream_in_one_piece_gives_every_request_in_order() -> None:
    assert joined_payload(events_of(ServerConnection(LIMITS), [STREAM])) == EXPECTED


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=40), st.booleans())
def test_any_split_of_the_stream_gives_the_same_events(cuts: list[int], take_gets: bool) -> None:
    bounds = [0, *sorted(set(cuts)), len(STREAM)]
    pieces = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    assert joined_payload(events_of(ServerConnection(LIMITS), pieces, take_gets=take_gets)) == EXPECTED


def test_a_one_key_get_arriving_alone_is_taken_whole_and_nothing_else_is() -> None:
    machine = ServerConnection(LIMITS)
    assert joined_payload(events_of(machine, FRAMES, take_gets=True)) == EXPECTED
    assert machine.receive_get_one(FRAMES[0][:-1]) is None, "a GET missing its last byte was taken"
    assert machine.receive_get_one(FRAMES[0][-1:]) is None, "with bytes buffered, a GET must come by next_event"
    assert machine.next_event() == GetOne(1, "ns", H[0])
    assert machine.receive_get_one(FRAMES[0] + FRAMES[0]) is None, "two GETs in one piece were taken as one"
    assert [machine.next_event(), machine.next_event(), machine.buffered] == [EXPECTED[0], EXPECTED[0], 0]


def test_a_one_key_get_before_the_hello_is_not_taken() -> None:
    machine = ServerConnection(LIMITS, {TOKEN: "tenant"}.get)
    assert machine.receive_get_one(FRAMES[0]) is None
    refusal = machine.next_event()
    assert isinstance(refusal, Refusal) and refusal.close, refusal


def test_a_head_arriving_byte_by_byte_needs_data_until_whole() -> None:
    machine = ServerConnection(LIMITS)
    frame = encode(GetRequest(9, "ns", H[:2]))
    for byte in frame[:-1]:
        machine.receive_data(bytes([byte]))
        assert machine.next_event() is NEED_DATA
    assert machine.head_size == len(frame)
    machine.receive_data(frame[-1:])
    assert machine.next_event() == GetRequest(9, "ns", H[:2])
    assert machine.buffered == 0 and machine.state is State.READY


def test_payload_received_past_the_buffer_ends_the_frame() -> None:
    machine = ServerConnection(LIMITS)
    machine.receive_data(put(1, [b"x" * 100])[: -100 + 10])  # the head and 10 payload bytes
    assert machine.next_event() == PutRequest(1, "ns", H[:1], [100])
    slot = bytearray(100)
    taken = machine.take_payload(memoryview(slot))
    assert (taken, machine.payload_left) == (10, 90)
    machine.payload_received(90)  # the transport filled slot[10:] from the socket
    assert machine.state is State.READY and machine.payload_left == 0
    with pytest.raises(LocalProtocolError):
        machine.payload_received(1)


def test_misuse_is_the_daemon_s_bug_not_the_peer_s() -> None:
    machine = ServerConnection(LIMITS)
    machine.receive_data(put(1, [b"x" * 10]))
    machine.next_event()
    with pytest.raises(LocalProtocolError, match="inside a frame's payload"):
        machine.next_event()
    with pytest.raises(LocalProtocolError, match="take_payload first"):
        machine.payload_received(10)  # 10 bytes are still buffered here


# -- HELLO first ---------------------------------------------------------------


def test_a_node_with_a_token_accepts_a_hello_with_it_then_requests() -> None:
    machine = ServerConnection(LIMITS, {TOKEN: "tenant"}.get)
    assert machine.state is State.HELLO
    machine.receive_data(encode(HelloRequest(1, TOKEN)) + encode(GetRequest(2, "ns", [H[0]])))
    assert machine.next_event() == Hello(1, "tenant", TOKEN), "the HELLO says who the token proved, and the token"
    assert machine.state is State.READY
    assert machine.next_event() == GetOne(2, "ns", H[0])


@pytest.mark.parametrize(
    "first",
    [
        encode(GetRequest(2, "ns", [H[0]])),  # the one-key fast path must not skip the check
        encode(PingRequest(2)),
        put(2, [b"x"]),
    ],
)
def test_a_request_before_the_hello_closes_the_connection(first: bytes) -> None:
    machine = ServerConnection(LIMITS, {TOKEN: "tenant"}.get)
    machine.receive_data(first)
    event = machine.next_event()
    assert isinstance(event, Refusal) and event.close and isinstance(event.error, AuthenticationError), event
    assert event.request_id == 2
    assert machine.state is State.CLOSED


def test_a_wrong_token_closes_the_connection() -> None:
    machine = ServerConnection(LIMITS, {TOKEN: "tenant"}.get)
    machine.receive_data(encode(HelloRequest(1, b"guess")))
    event = machine.next_event()
    assert isinstance(event, Refusal) and event.close and "wrong token" in str(event.error)
    assert machine.state is State.CLOSED


def test_an_oversized_hello_is_refused_before_its_meta_arrives() -> None:
    machine = ServerConnection(LIMITS, {TOKEN: "tenant"}.get)
    header = bytearray(encode(HelloRequest(1, b"t"))[:HEADER_SIZE])
    struct.pack_into("<I", header, 16, 1500)  # meta_len: a token past MAX_TOKEN_BYTES announced
    machine.receive_data(bytes(header))
    event = machine.next_event()
    assert isinstance(event, Refusal) and event.close and "only a token" in str(event.error)


def test_a_node_without_a_token_answers_a_hello_too() -> None:
    machine = ServerConnection(LIMITS)
    machine.receive_data(encode(HelloRequest(1, b"anything")))
    assert machine.next_event() == Hello(1)


# -- bad frames ----------------------------------------------------------------


def test_a_broken_header_closes_the_stream() -> None:
    machine = ServerConnection(LIMITS)
    machine.receive_data(b"\x00" * HEADER_SIZE)
    event = machine.next_event()
    assert isinstance(event, Refusal) and event.close and isinstance(event.error, ProtocolError)
    assert machine.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        machine.next_event()


def test_a_well_framed_but_wrong_request_drops_its_payload_and_goes_on() -> None:
    machine = ServerConnection(LIMITS)
    too_many = encode(PutRequest(1, "ns", [bytes([i]) * 16 for i in range(9)], [1] * 9))  # 9 keys > 8
    machine.receive_data(too_many + b"p" * 9 + encode(PingRequest(2)))
    event = machine.next_event()
    assert isinstance(event, Refusal) and not event.close and event.op is Op.PUT, event
    assert machine.payload_left == 9
    assert machine.take_payload(memoryview(bytearray(9))) == 9
    assert machine.next_event() == PingRequest(2)


def test_a_response_frame_from_a_client_is_refused_and_the_stream_goes_on() -> None:
    machine = ServerConnection(LIMITS)
    machine.receive_data(encode(GetResponse(1, [0], [3], [0])) + b"abc" + encode(PingRequest(2)))
    event = machine.next_event()
    assert isinstance(event, Refusal) and not event.close and "response frame" in str(event.error)
    assert machine.take_payload(memoryview(bytearray(3))) == 3
    assert machine.next_event() == PingRequest(2)


def test_a_header_announcing_meta_over_the_limit_is_refused_before_reading_it() -> None:
    machine = ServerConnection(LIMITS)
    header = bytearray(encode(PingRequest(1)))
    struct.pack_into("<I", header, 16, LIMITS.max_meta + 1)  # meta_len: after magic, version, op, status, flags, id
    machine.receive_data(bytes(header[:HEADER_SIZE]))
    event = machine.next_event()
    assert isinstance(event, Refusal) and event.close, event


frames = st.one_of(
    st.builds(lambda i: encode(GetRequest(i, "ns", [H[0]])), st.integers(0, 1 << 32)),
    st.builds(lambda i: encode(PingRequest(i)), st.integers(0, 1 << 32)),
    st.builds(lambda i, n: put(i, [b"x" * n]), st.integers(0, 1 << 32), st.integers(0, 300)),
    st.builds(lambda tok: encode(HelloRequest(1, tok)), st.binary(max_size=40).filter(lambda b: b != TOKEN)),
    st.binary(min_size=1, max_size=80),  # garbage
)


@settings(max_examples=300, deadline=None)
@given(st.lists(frames, min_size=1, max_size=6), st.integers(1, 64))
def test_without_the_token_no_stream_gets_past_hello(stream: list[bytes], piece: int) -> None:
    machine = ServerConnection(LIMITS, {TOKEN: "tenant"}.get)
    data = b"".join(stream)
    seen = []
    for start in range(0, len(data), piece):
        machine.receive_data(data[start : start + piece])
        while machine.state is State.HELLO and (event := machine.next_event()) is not NEED_DATA:
            seen.append(event)
    assert machine.state in (State.HELLO, State.CLOSED), (machine.state, seen)
    assert all(isinstance(e, Refusal) and e.close for e in seen) and len(seen) <= 1, seen
