"""Sans-IO exchanges, h11-style: driven step by step with bytes from the real encoder, no sockets.

Each exchange is a generator: it yields the I/O it wants (Send, Receive, ReceiveInto)
and is resumed with the result. The tests play the server by hand, then run the same
exchanges through run_sync/run_async over an in-memory byte pipe that replays a script.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator

import pytest
import xxhash
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvpool_client import exchange
from kvpool_client.core.errors import (
    ErrorCode,
    KVPoolError,
    LimitExceeded,
    NodeUnavailable,
    ProtocolError,
    RequestTimeout,
    ServerError,
    UsageError,
    error_for_code,
)
from kvpool_client.core.wire import (
    HEADER_SIZE,
    DeleteRequest,
    ErrorResponse,
    ExistsRequest,
    GetRequest,
    GetResponse,
    Op,
    PingRequest,
    PingResponse,
    PutRequest,
    StatusResponse,
    WireLimits,
    encode,
)
from kvpool_client.exchange import Receive, ReceiveInto, ReceiveUpTo, Send, run_async, run_sync

LIMITS = WireLimits(max_keys=16, max_block_size=4 << 20, max_payload=16 << 20)
NS = "model@fp16@L2@tp0of1"
H = [bytes([i]) * 32 for i in range(8)]
OK, NOT_FOUND, EXISTS_ = ErrorCode.OK, ErrorCode.NOT_FOUND, ErrorCode.ALREADY_EXISTS


def xxh(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


def answer(gen: Generator, frame: bytes) -> object:
    """Feed one encoded response frame to an exchange that just sent its request.

    Returns the step after the frame (a ReceiveInto for a GET), or the exchange's
    return value once it finishes.
    """
    step = next_step(gen, None)
    assert isinstance(step, ReceiveUpTo) and step.nbytes >= HEADER_SIZE, step
    first = frame[: step.nbytes]  # what one receive hands over at most
    step = next_step(gen, first)
    if len(first) < len(frame):
        assert step == Receive(len(frame) - len(first)), step
        step = next_step(gen, bytearray(frame[len(first) :]))
    return step


class Done:
    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Done) and other.value == self.value

    def __repr__(self) -> str:
        return f"Done({self.value!r})"


def next_step(gen: Generator, reply: object) -> object:
    try:
        return gen.send(reply)
    except StopIteration as stop:
        return Done(stop.value)


def fill(targets: list[memoryview], payload: bytes) -> None:
    """What a transport does with ReceiveInto: the payload, in order, across the targets."""
    assert sum(len(t) for t in targets) == len(payload), ([len(t) for t in targets], len(payload))
    pos = 0
    for target in targets:
        target[:] = payload[pos : pos + len(target)]
        pos += len(target)


def start(gen: Generator) -> Send:
    step = next(gen)
    assert isinstance(step, Send), step
    return step


# -- put, exists, delete, ping step by step -----------------------------------------


def test_put_sends_header_then_the_callers_buffers_and_returns_statuses() -> None:
    blocks = [memoryview(b"abcd"), memoryview(bytearray(b"xyz"))]
    request = PutRequest(7, NS, H[:2], [4, 3])
    gen = exchange.put(request, blocks, LIMITS)
    sent = start(gen)
    assert sent.buffers[0] == encode(request)
    assert sent.buffers[1] is blocks[0] and sent.buffers[2] is blocks[1], "blocks must be sent zero-copy"
    result = answer(gen, encode(StatusResponse(7, Op.PUT, [OK, EXISTS_])))
    assert result == Done([OK, EXISTS_]), result


@pytest.mark.parametrize("prefix", [False, True])
def test_exists_step_by_step(prefix: bool) -> None:
    request = ExistsRequest(3, NS, H[:3], prefix=prefix)
    gen = exchange.exists(request, LIMITS)
    assert start(gen).buffers == [encode(request)]
    result = answer(gen, encode(StatusResponse(3, Op.EXISTS, [OK, OK, NOT_FOUND])))
    assert result == Done([OK, OK, NOT_FOUND]), result


def test_delete_step_by_step() -> None:
    request = DeleteRequest(4, NS, H[:2])
    gen = exchange.delete(request, LIMITS)
    assert start(gen).buffers == [encode(request)]
    assert answer(gen, encode(StatusResponse(4, Op.DELETE, [OK, NOT_FOUND]))) == Done([OK, NOT_FOUND])


def test_ping_reads_only_the_header() -> None:
    gen = exchange.ping(PingRequest(9), LIMITS)
    assert start(gen).buffers == [encode(PingRequest(9))]
    assert next_step(gen, None) == ReceiveUpTo(HEADER_SIZE)
    frame = encode(PingResponse(9))
    assert len(frame) == HEADER_SIZE, "a ping response has no meta"
    assert next_step(gen, bytearray(frame)) == Done(None)


def test_empty_batches_round_trip() -> None:
    gen = exchange.exists(ExistsRequest(1, NS, []), LIMITS)
    start(gen)
    assert answer(gen, encode(StatusResponse(1, Op.EXISTS, []))) == Done([])
    gen = exchange.get(GetRequest(2, NS, []), [], LIMITS, verify=True)
    start(gen)
    step = answer(gen, encode(GetResponse(2, [], [], [])))
    assert step == ReceiveInto([]), step
    assert next_step(gen, None) == Done(([], []))


# -- get ----------------------------------------------------------------------------


def test_get_lands_payload_in_the_callers_targets() -> None:
    a, c = bytearray(4), bytearray(5)
    targets = [memoryview(a), memoryview(bytearray(9)), memoryview(c)]
    request = GetRequest(11, NS, H[:3])
    gen = exchange.get(request, targets, LIMITS, verify=True)
    assert start(gen).buffers == [encode(request)]
    response = GetResponse(11, [OK, NOT_FOUND, OK], [4, 0, 5], [xxh(b"AAAA"), 0, xxh(b"CCCCC")])
    step = answer(gen, encode(response))
    assert isinstance(step, ReceiveInto), step
    assert [t.obj for t in step.targets] == [a, c], "payload must go straight into the caller's buffers"
    fill(step.targets, b"AAAA" + b"CCCCC")
    done = next_step(gen, None)
    assert isinstance(done, Done), done
    statuses, filled = done.value
    assert statuses == [OK, NOT_FOUND, OK], statuses
    assert filled[0] is targets[0] and filled[1] is None and filled[2] is targets[2], filled
    assert (bytes(a), bytes(c)) == (b"AAAA", b"CCCCC")


def test_get_allocates_when_the_target_is_none() -> None:
    gen = exchange.get(GetRequest(1, NS, H[:2]), [None, None], LIMITS, verify=False)
    start(gen)
    step = answer(gen, encode(GetResponse(1, [OK, OK], [3, 6], [0, 0])))
    assert isinstance(step, ReceiveInto) and [len(t) for t in step.targets] == [3, 6], step
    fill(step.targets, b"abc" + b"defghi")
    statuses, filled = next_step(gen, None).value  # type: ignore[attr-defined]
    assert statuses == [OK, OK] and [bytes(f) for f in filled] == [b"abc", b"defghi"], (statuses, filled)
    assert all(not f.readonly for f in filled), "allocated buffers belong to the caller: writable"


def test_size_mismatch_drains_into_scratch_and_later_keys_still_land() -> None:
    first, second, third = bytearray(4), bytearray(4), bytearray(2)
    targets = [memoryview(first), memoryview(second), memoryview(third)]
    gen = exchange.get(GetRequest(5, NS, H[:3]), targets, LIMITS, verify=True)
    start(gen)
    payload = b"1111" + b"22222222" + b"33"
    response = GetResponse(5, [OK, OK, OK], [4, 8, 2], [xxh(b"1111"), xxh(b"22222222"), xxh(b"33")])
    step = answer(gen, encode(response))
    assert isinstance(step, ReceiveInto), step
    sizes = [len(t) for t in step.targets]
    assert sizes == [4, 8, 2], f"the 8 stored bytes of key 1 must be drained, not skipped: {sizes}"
    assert step.targets[1].obj is not second, "a mismatched block must not touch the caller's buffer"
    fill(step.targets, payload)
    statuses, filled = next_step(gen, None).value  # type: ignore[attr-defined]
    assert statuses == [OK, ErrorCode.SIZE_MISMATCH, OK], statuses
    assert filled[1] is None and bytes(second) == b"\0" * 4, bytes(second)
    assert (bytes(first), bytes(third)) == (b"1111", b"33"), (bytes(first), bytes(third))


def test_a_large_mismatched_block_drains_in_scratch_sized_chunks() -> None:
    big = (1 << 20) + (1 << 19)  # more than the 1 MiB scratch
    gen = exchange.get(GetRequest(5, NS, H[:2]), [memoryview(bytearray(10)), None], LIMITS, verify=False)
    start(gen)
    step = answer(gen, encode(GetResponse(5, [OK, OK], [big, 3], [0, 0])))
    assert isinstance(step, ReceiveInto), step
    assert [len(t) for t in step.targets] == [1 << 20, 1 << 19, 3], [len(t) for t in step.targets]
    fill(step.targets, b"\x01" * big + b"end")
    statuses, filled = next_step(gen, None).value  # type: ignore[attr-defined]
    assert statuses == [ErrorCode.SIZE_MISMATCH, OK] and bytes(filled[1]) == b"end", (statuses, filled)


def test_verify_flags_a_bad_checksum() -> None:
    targets = [memoryview(bytearray(4)), memoryview(bytearray(4))]
    gen = exchange.get(GetRequest(6, NS, H[:2]), targets, LIMITS, verify=True)
    start(gen)
    step = answer(gen, encode(GetResponse(6, [OK, OK], [4, 4], [xxh(b"good"), xxh(b"good")])))
    fill(step.targets, b"good" + b"evil")  # type: ignore[attr-defined]
    statuses, filled = next_step(gen, None).value  # type: ignore[attr-defined]
    assert statuses == [OK, ErrorCode.CHECKSUM_MISMATCH], statuses
    assert filled[0] is targets[0] and filled[1] is None, filled


def test_without_verify_a_bad_checksum_is_not_checked() -> None:
    gen = exchange.get(GetRequest(6, NS, H[:1]), [None], LIMITS, verify=False)
    start(gen)
    step = answer(gen, encode(GetResponse(6, [OK], [4], [12345])))
    fill(step.targets, b"evil")  # type: ignore[attr-defined]
    statuses, filled = next_step(gen, None).value  # type: ignore[attr-defined]
    assert statuses == [OK] and bytes(filled[0]) == b"evil", (statuses, filled)


def test_get_with_a_wrong_number_of_results_is_a_protocol_error() -> None:
    gen = exchange.get(GetRequest(8, NS, H[:2]), [None, None], LIMITS, verify=False)
    start(gen)
    with pytest.raises(ProtocolError, match="expected 2 GET results"):
        answer(gen, encode(GetResponse(8, [OK], [1], [0])))


# -- failures -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (ErrorCode.PROTOCOL, ProtocolError),
        (ErrorCode.UNSUPPORTED_VERSION, ProtocolError),
        (ErrorCode.LIMIT_EXCEEDED, LimitExceeded),
        (ErrorCode.INVALID_ARGUMENT, UsageError),
        (ErrorCode.UNAVAILABLE, NodeUnavailable),
        (ErrorCode.SHUTTING_DOWN, NodeUnavailable),
        (ErrorCode.TIMEOUT, RequestTimeout),
        (ErrorCode.OUT_OF_SPACE, ServerError),
        (ErrorCode.INTERNAL, ServerError),
    ],
)
def test_an_error_response_raises_the_mapped_exception(code: ErrorCode, kind: type[KVPoolError]) -> None:
    gen = exchange.put(PutRequest(12, NS, H[:1], [2]), [memoryview(b"hi")], LIMITS)
    start(gen)
    with pytest.raises(kind) as raised:
        answer(gen, encode(ErrorResponse(12, Op.PUT, code, "node says no")))
    assert type(raised.value) is kind and raised.value.code is code, (type(raised.value), raised.value.code)
    assert "node says no" in str(raised.value), str(raised.value)
    assert next_step(gen, None) == Done(None), "the exchange is over after raising"


def test_an_unknown_error_code_is_an_internal_server_error() -> None:
    gen = exchange.get(GetRequest(13, NS, H[:1]), [None], LIMITS, verify=True)
    start(gen)
    with pytest.raises(ServerError) as raised:
        answer(gen, encode(ErrorResponse(13, Op.GET, 999, "")))
    assert raised.value.code is ErrorCode.INTERNAL and "999" in str(raised.value), str(raised.value)


def test_error_for_code_matches_what_exchanges_raise() -> None:
    for code in ErrorCode:
        if code is ErrorCode.OK:
            continue
        error = error_for_code(code, "m")
        assert error.code is code and isinstance(error, KVPoolError), (code, error)


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(encode(StatusResponse(99, Op.PUT, [OK])), id="wrong-request-id"),
        pytest.param(encode(StatusResponse(21, Op.DELETE, [OK])), id="wrong-op"),
        pytest.param(encode(ErrorResponse(99, Op.PUT, ErrorCode.INTERNAL, "x")), id="error-for-another-request"),
        pytest.param(encode(ErrorResponse(21, Op.GET, ErrorCode.INTERNAL, "x")), id="error-for-another-op"),
        pytest.param(encode(PutRequest(21, NS, H[:1], [0])), id="a-request-not-a-response"),
        pytest.param(encode(GetResponse(21, [OK], [0], [0])), id="get-response-to-a-put"),
    ],
)
def test_a_response_that_does_not_answer_the_request_is_a_protocol_error(frame: bytes) -> None:
    gen = exchange.put(PutRequest(21, NS, H[:1], [1]), [memoryview(b"x")], LIMITS)
    start(gen)
    with pytest.raises(ProtocolError) as raised:
        answer(gen, frame)
    assert type(raised.value) is ProtocolError, f"got {type(raised.value).__name__}: {raised.value}"


def test_a_status_count_mismatch_is_a_protocol_error() -> None:
    gen = exchange.delete(DeleteRequest(22, NS, H[:3]), LIMITS)
    start(gen)
    with pytest.raises(ProtocolError, match="expected 3 statuses"):
        answer(gen, encode(StatusResponse(22, Op.DELETE, [OK, OK])))


def test_a_ping_answered_with_another_op_is_a_protocol_error() -> None:
    gen = exchange.ping(PingRequest(23), LIMITS)
    start(gen)
    with pytest.raises(ProtocolError):
        answer(gen, encode(StatusResponse(23, Op.EXISTS, [])))


def test_a_garbled_header_is_a_protocol_error() -> None:
    gen = exchange.exists(ExistsRequest(24, NS, H[:1]), LIMITS)
    start(gen)
    assert next_step(gen, None) == ReceiveUpTo(HEADER_SIZE + 5)  # one status: count u32 + u8
    bad = b"XX" + encode(StatusResponse(24, Op.EXISTS, [OK]))[2:HEADER_SIZE]
    with pytest.raises(ProtocolError, match="magic"):
        gen.send(bytearray(bad))


def test_a_header_that_comes_in_pieces_is_put_together() -> None:
    gen = exchange.exists(ExistsRequest(25, NS, H[:1]), LIMITS)
    start(gen)
    frame = encode(StatusResponse(25, Op.EXISTS, [OK]))
    assert next_step(gen, None) == ReceiveUpTo(len(frame))
    assert next_step(gen, frame[:3]) == ReceiveUpTo(len(frame) - 3), "a short first receive asks for the rest"
    assert next_step(gen, frame[3:]) == Done([OK])


# -- through run_sync / run_async over an in-memory byte pipe -----------------------


class ScriptedConnection:
    """A byte pipe: replays scripted response bytes, records what was sent."""

    def __init__(self, *frames: bytes) -> None:
        self._incoming = b"".join(frames)
        self._pos = 0
        self.sent: list[bytes] = []

    @property
    def unread(self) -> int:
        return len(self._incoming) - self._pos

    def _take(self, n: int) -> bytes:
        if n > self.unread:
            raise EOFError(f"asked for {n} bytes, {self.unread} left in the script")
        chunk = self._incoming[self._pos : self._pos + n]
        self._pos += n
        return chunk

    def send(self, buffers: list[bytes | memoryview]) -> None:
        self.sent.append(b"".join(bytes(b) for b in buffers))

    def recv_exactly(self, nbytes: int) -> bytearray:
        return bytearray(self._take(nbytes))

    def recv_upto(self, nbytes: int) -> bytes:
        return bytes(self._take(min(nbytes, max(self.unread, 1))))  # at least a byte, as a socket's

    def recv_into(self, targets: list[memoryview]) -> None:
        for target in targets:
            target[:] = self._take(len(target))


class AsyncScriptedConnection:
    def __init__(self, *frames: bytes) -> None:
        self.sync = ScriptedConnection(*frames)

    async def send(self, buffers: list[bytes | memoryview]) -> None:
        self.sync.send(buffers)

    async def recv_exactly(self, nbytes: int) -> bytearray:
        return self.sync.recv_exactly(nbytes)

    async def recv_upto(self, nbytes: int) -> bytes:
        return self.sync.recv_upto(nbytes)

    async def recv_into(self, targets: list[memoryview]) -> None:
        self.sync.recv_into(targets)


def test_run_sync_put_then_get_on_one_connection() -> None:
    put_request = PutRequest(1, NS, H[:2], [3, 4])
    get_request = GetRequest(2, NS, H[:3])
    get_response = GetResponse(2, [OK, OK, NOT_FOUND], [3, 4, 0], [xxh(b"abc"), xxh(b"defg"), 0])
    conn = ScriptedConnection(
        encode(StatusResponse(1, Op.PUT, [OK, OK])),
        encode(get_response) + b"abc" + b"defg",
    )
    stored = run_sync(conn, exchange.put(put_request, [memoryview(b"abc"), memoryview(b"defg")], LIMITS))
    assert stored == [OK, OK], stored
    into = bytearray(4)
    statuses, filled = run_sync(conn, exchange.get(get_request, [None, memoryview(into), None], LIMITS, verify=True))
    assert statuses == [OK, OK, NOT_FOUND] and bytes(filled[0]) == b"abc" and filled[2] is None, (statuses, filled)
    assert bytes(into) == b"defg"
    assert conn.sent == [encode(put_request) + b"abcdefg", encode(get_request)], conn.sent
    assert conn.unread == 0, f"{conn.unread} response bytes left unread"


def test_run_sync_drains_a_mismatch_and_leaves_the_stream_aligned() -> None:
    conn = ScriptedConnection(
        encode(GetResponse(1, [OK, OK], [6, 2], [0, 0])) + b"xxxxxx" + b"ok",
        encode(PingResponse(2)),
    )
    statuses, filled = run_sync(
        conn, exchange.get(GetRequest(1, NS, H[:2]), [memoryview(bytearray(3)), None], LIMITS, verify=False)
    )
    assert statuses == [ErrorCode.SIZE_MISMATCH, OK] and bytes(filled[1]) == b"ok", (statuses, filled)
    assert run_sync(conn, exchange.ping(PingRequest(2), LIMITS)) is None
    assert conn.unread == 0


def test_run_sync_exists_delete_and_errors() -> None:
    conn = ScriptedConnection(
        encode(StatusResponse(1, Op.EXISTS, [OK, NOT_FOUND])),
        encode(StatusResponse(2, Op.DELETE, [NOT_FOUND])),
        encode(ErrorResponse(3, Op.GET, ErrorCode.SHUTTING_DOWN, "draining")),
    )
    assert run_sync(conn, exchange.exists(ExistsRequest(1, NS, H[:2], prefix=True), LIMITS)) == [OK, NOT_FOUND]
    assert run_sync(conn, exchange.delete(DeleteRequest(2, NS, H[:1]), LIMITS)) == [NOT_FOUND]
    with pytest.raises(NodeUnavailable, match="draining"):
        run_sync(conn, exchange.get(GetRequest(3, NS, H[:1]), [None], LIMITS, verify=True))
    assert conn.unread == 0
    assert len(conn.sent) == 3


ONE_KEY_CASES = {  # (status, stored bytes, checksum sent, target size or None, verify)
    "hit": (OK, b"hello", xxh(b"hello"), 5, True),
    "hit-allocated": (OK, b"hello", xxh(b"hello"), None, True),
    "size-mismatch": (OK, b"hello", xxh(b"hello"), 3, True),
    "bad-checksum": (OK, b"hello", 1, 5, True),
    "bad-checksum-unverified": (OK, b"hello", 1, 5, False),
    "miss": (NOT_FOUND, b"", 0, 5, True),
}


def _read(case: tuple, batch: bool) -> tuple[int, bytes | None, bytes | None]:
    """One key's (status, bytes returned, caller's buffer after) from a get of it alone, or with a
    missing key after it (the general path); the stream must end aligned either way."""
    status, stored, checksum, size, verify = case
    statuses, lengths, sums = [status] + [NOT_FOUND] * batch, [len(stored)] + [0] * batch, [checksum] + [0] * batch
    conn = ScriptedConnection(encode(GetResponse(1, statuses, lengths, sums)) + stored, encode(PingResponse(2)))
    target = None if size is None else bytearray(size)
    targets = [None if target is None else memoryview(target)] + [None] * batch
    codes, filled = run_sync(conn, exchange.get(GetRequest(1, NS, H[: 1 + batch]), targets, LIMITS, verify))
    assert run_sync(conn, exchange.ping(PingRequest(2), LIMITS)) is None and conn.unread == 0, conn.unread
    assert len(codes) == len(filled) == 1 + batch, (codes, filled)
    return codes[0], None if filled[0] is None else bytes(filled[0]), None if target is None else bytes(target)


@pytest.mark.parametrize("case", ONE_KEY_CASES.values(), ids=ONE_KEY_CASES.keys())
def test_a_one_key_get_answers_as_that_key_does_in_a_batch(case: tuple) -> None:
    alone, in_batch = _read(case, batch=False), _read(case, batch=True)
    assert alone == in_batch, f"alone {alone}, in a batch {in_batch}"


def test_a_one_key_get_reads_header_and_meta_in_one_receive_into_the_callers_buffer() -> None:
    target = bytearray(5)
    gen = exchange.get(GetRequest(9, NS, H[:1]), [memoryview(target)], LIMITS, verify=True)
    start(gen)
    frame = encode(GetResponse(9, [OK], [5], [xxh(b"hello")]))
    assert next_step(gen, None) == ReceiveUpTo(len(frame))
    step = next_step(gen, frame)
    assert isinstance(step, ReceiveInto) and [t.obj for t in step.targets] == [target], step
    fill(step.targets, b"hello")
    assert next_step(gen, None) == Done(([OK], [step.targets[0]])) and target == b"hello"


def test_run_async_get() -> None:
    conn = AsyncScriptedConnection(encode(GetResponse(4, [OK], [5], [xxh(b"hello")])) + b"hello")
    statuses, filled = asyncio.run(
        run_async(conn, exchange.get(GetRequest(4, NS, H[:1]), [None], LIMITS, verify=True))  # type: ignore[arg-type]
    )
    assert statuses == [OK] and bytes(filled[0]) == b"hello", (statuses, filled)
    assert conn.sync.sent == [encode(GetRequest(4, NS, H[:1]))] and conn.sync.unread == 0


# -- a single get run in line against the same get run as steps ---------------------------


def _answer(kind: str, data: bytes, code: ErrorCode) -> bytes:
    """What a node may answer a one-key GET of request 7 (``kind``): its block ``data``, the block
    with a wrong checksum, a miss, an error frame, an answer to another request, a batch's answer."""
    if kind == "block":
        return encode(GetResponse(7, [OK], [len(data)], [xxh(data)])) + data
    if kind == "bad checksum":
        return encode(GetResponse(7, [OK], [len(data)], [xxh(data) ^ 1])) + data
    if kind == "miss":
        return encode(GetResponse(7, [code], [0], [0]))
    if kind == "error":
        return encode(ErrorResponse(7, Op.GET, code, "no"))
    if kind == "another request":
        return encode(GetResponse(8, [OK], [len(data)], [xxh(data)])) + data
    return encode(GetResponse(7, [OK, OK], [len(data)] * 2, [xxh(data)] * 2)) + data * 2


def _outcome(run: Callable[[ScriptedConnection], object], frame: bytes) -> tuple[object, list[bytes], int]:
    """What ``run`` returned (or the type and message it raised), what it sent, and the bytes it left unread."""
    connection = ScriptedConnection(frame)
    try:
        returned: object = run(connection)
    except (KVPoolError, EOFError) as exc:
        returned = (type(exc), str(exc))
    if isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[1], list):
        returned = (returned[0], [None if v is None else bytes(v) for v in returned[1]])
    return returned, connection.sent, connection.unread


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["block", "block", "block", "bad checksum", "miss", "error", "another request", "two"]),
    data=st.binary(max_size=64),
    code=st.sampled_from(list(ErrorCode)[1:]),
    size=st.one_of(st.none(), st.integers(0, 64)),  # None: the block's own size
    cut=st.one_of(st.none(), st.integers(0, 80)),  # the connection ends after this many bytes
    verify=st.booleans(),
)
def test_a_single_get_run_in_line_answers_as_its_steps_do(
    kind: str, data: bytes, code: ErrorCode, size: int | None, cut: int | None, verify: bool
) -> None:
    frame = _answer(kind, data, code)[:cut]
    size = len(data) if size is None else size

    def single(target: bytearray) -> exchange.SingleGet:
        return exchange.SingleGet(7, NS, H[0], memoryview(target), LIMITS, verify)

    in_line, as_steps = bytearray(size), bytearray(size)
    fused = _outcome(lambda c: single(in_line).run_sync(c), frame)
    stepped = _outcome(lambda c: run_sync(c, single(as_steps).steps()), frame)
    event(f"{fused[0][0].__name__} raised" if isinstance(fused[0][0], type) else f"status {fused[0][0]}")  # type: ignore[index]
    assert fused == stepped, f"in line {fused}, as steps {stepped}"
    assert in_line == as_steps, (bytes(in_line), bytes(as_steps))
