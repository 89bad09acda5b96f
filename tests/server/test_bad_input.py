"""A real daemon fed broken, hostile or stalled input on both planes.

Every test ends by reading back blocks stored before the abuse: bad input must
never cost a client its data, and the daemon must keep serving everyone else.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from kvpool_client import AsyncKVPoolClient, BlockKey, ErrorCode, KVPoolClient, UsageError
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.core.wire import (
    DeleteRequest,
    ErrorResponse,
    ExistsRequest,
    GetRequest,
    GetResponse,
    Op,
    PingRequest,
    PutRequest,
    StatusResponse,
    WireLimits,
    encode,
)
from kvpool_client.core.wire.frames import RESPONSE_BIT
from tests.support.daemon import DaemonProcess, start_daemon
from tests.support.rawwire import RawConnection, put_frame, raw_header

pytestmark = pytest.mark.integration

MAX_KEYS = 8
NODE_LIMITS = WireLimits(max_keys=MAX_KEYS, max_block_size=1 << 20, max_payload=1 << 30)
NS = "bad-input@fp16@L1@tp0of1"


def _block(seed: int, size: int) -> bytes:
    return (seed.to_bytes(4, "little") * (size // 4 + 1))[:size]


# Stored once per module, re-read after every test. Sizes: tiny, odd, exactly one slab.
REFERENCE = {BlockKey(NS, bytes([0xA0 + i]) * 32): _block(0xA0 + i, n) for i, n in enumerate((4096, 12345, 1 << 20))}


@pytest.fixture(scope="module")
def node() -> Iterator[DaemonProcess]:
    """One daemon for the module: 64 MiB in 1 MiB slabs, at most 8 keys per request."""
    daemon = start_daemon("--dram-capacity", "64MiB", "--slab-size", "1MiB", "--max-keys-per-request", str(MAX_KEYS))
    try:
        with KVPoolClient([daemon.address]) as client:
            result = client.put(list(REFERENCE), list(REFERENCE.values()))
            assert result.stored == len(REFERENCE), f"{result.statuses}\n{daemon.log()}"
        yield daemon
    finally:
        daemon.stop()
        daemon.remove_files()


def assert_intact(daemon: DaemonProcess) -> None:
    """The daemon is alive, and a fresh client reads every reference block back exactly."""
    assert daemon.process.poll() is None, f"daemon exited with {daemon.process.returncode}:\n{daemon.log()}"
    with KVPoolClient([daemon.address]) as client:
        got = client.get(list(REFERENCE))
    assert got.statuses == (ErrorCode.OK,) * len(REFERENCE), f"{got.statuses}\n{daemon.log()}"
    for (key, data), view in zip(REFERENCE.items(), got.buffers, strict=True):
        assert bytes(view) == data, f"{key} came back with wrong bytes\n{daemon.log()}"


def counters(daemon: DaemonProcess) -> dict[str, int]:
    with KVPoolClient([daemon.address]) as client:
        return dict(client.stats(daemon.address).counters)


def wait_for_counter(daemon: DaemonProcess, name: str, at_least: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while (value := counters(daemon).get(name, 0)) < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def usage(daemon: DaemonProcess) -> tuple[int, int]:
    """(blocks in the index, bytes allocated) of the DRAM tier: a leak check after bad input."""
    with KVPoolClient([daemon.address]) as client:
        (tier,) = [t for t in client.stats(daemon.address).tiers if t.name == "dram"]
    return tier.blocks, tier.used_bytes


def exists(daemon: DaemonProcess, keys: list[BlockKey]) -> list[bool]:
    with KVPoolClient([daemon.address]) as client:
        return client.exists(keys)


def fresh_keys(n: int) -> list[BlockKey]:
    return [BlockKey(NS, os.urandom(32)) for _ in range(n)]


def expect_error(frame_message: object, code: ErrorCode, request_id: int | None = None) -> ErrorResponse:
    assert isinstance(frame_message, ErrorResponse), f"expected an error frame, got {frame_message!r}"
    assert frame_message.code == code, f"expected {code.name}, got {frame_message!r}"
    if request_id is not None:
        assert frame_message.request_id == request_id, f"error does not echo request {request_id}: {frame_message!r}"
    return frame_message


# -- headers that cannot be trusted: error frame, then the connection closes ---------------


BROKEN_HEADERS = {
    "bad-magic": (raw_header(Op.PING, magic=b"XX"), ErrorCode.PROTOCOL),
    "bad-version": (raw_header(Op.PING, version=2), ErrorCode.UNSUPPORTED_VERSION),
    "version-zero": (raw_header(Op.PING, version=0), ErrorCode.UNSUPPORTED_VERSION),
    "unknown-op": (raw_header(0x1F), ErrorCode.PROTOCOL),
    "op-zero": (raw_header(0), ErrorCode.PROTOCOL),
    "meta-over-limit": (raw_header(Op.GET, meta_len=NODE_LIMITS.max_meta + 1), ErrorCode.LIMIT_EXCEEDED),
    "payload-over-limit": (raw_header(Op.PUT, meta_len=64, payload_len=(1 << 30) + 1), ErrorCode.LIMIT_EXCEEDED),
}


@pytest.mark.parametrize("case", list(BROKEN_HEADERS))
def test_untrusted_header_gets_error_frame_then_close(node: DaemonProcess, case: str) -> None:
    header, code = BROKEN_HEADERS[case]
    with RawConnection(node.data_address) as bystander, RawConnection(node.data_address) as bad:
        assert bystander.ping(1)
        bad.send(header)
        frame = bad.read_frame()
        error = expect_error(frame.message, code)
        assert error.message, f"error frame without an explanation: {error!r}"
        assert bad.closed_by_peer(within=3.0), f"connection stayed open after {case}\n{node.log()}"
        assert bystander.ping(2), "another client's connection stopped being served"
    assert_intact(node)


def test_limits_announced_match_what_is_enforced(node: DaemonProcess) -> None:
    with KVPoolClient([node.address]) as client:
        limits = client.server_info(node.address).limits
    assert limits == NODE_LIMITS, limits
    with RawConnection(node.data_address) as conn:  # exactly at the meta limit is still a frame
        conn.send(raw_header(Op.GET, request_id=5, meta_len=limits.max_meta) + bytes(limits.max_meta))
        expect_error(conn.read_frame().message, ErrorCode.PROTOCOL, request_id=5)
        assert conn.ping()


# -- well-framed but wrong requests: error frame, the connection goes on ---------------------


def _too_many_keys() -> bytes:
    blocks = [(os.urandom(32), _block(i, 4096)) for i in range(MAX_KEYS + 1)]
    return put_frame(41, NS, blocks)


def _oversized_block() -> bytes:
    return put_frame(41, NS, [(os.urandom(32), _block(7, 2 << 20))])


def _lengths_disagree_with_header() -> bytes:
    meta = encode(PutRequest(41, NS, [os.urandom(32)], [4096]))[28:]
    return raw_header(Op.PUT, request_id=41, meta_len=len(meta), payload_len=8192) + meta + bytes(8192)


def _empty_namespace() -> bytes:
    meta = b"\x00" + b"\x20" + (1).to_bytes(4, "little") + os.urandom(32)
    return raw_header(Op.GET, request_id=41, meta_len=len(meta)) + meta


def _hash_size(size: int) -> bytes:
    ns = NS.encode()
    meta = bytes([len(ns)]) + ns + bytes([size]) + (1).to_bytes(4, "little") + os.urandom(size)
    return raw_header(Op.EXISTS, request_id=41, meta_len=len(meta) + 1) + b"\x00" + meta


def _client_sends_response() -> bytes:
    meta = encode(StatusResponse(41, Op.PUT, [0]))[28:]
    return raw_header(Op.PUT | RESPONSE_BIT, request_id=41, meta_len=len(meta)) + meta


def _trailing_meta() -> bytes:
    meta = encode(DeleteRequest(41, NS, [os.urandom(32)]))[28:] + b"junk"
    return raw_header(Op.DELETE, request_id=41, meta_len=len(meta)) + meta


def _ping_with_payload() -> bytes:
    return raw_header(Op.PING, request_id=41, payload_len=100) + bytes(100)


WRONG_REQUESTS: dict[str, tuple[Callable[[], bytes], ErrorCode]] = {
    "put-too-many-keys": (_too_many_keys, ErrorCode.LIMIT_EXCEEDED),
    "put-block-over-slab": (_oversized_block, ErrorCode.LIMIT_EXCEEDED),
    "put-lengths-disagree": (_lengths_disagree_with_header, ErrorCode.PROTOCOL),
    "empty-namespace": (_empty_namespace, ErrorCode.PROTOCOL),
    "hash-size-0": (lambda: _hash_size(0), ErrorCode.PROTOCOL),
    "hash-size-65": (lambda: _hash_size(65), ErrorCode.PROTOCOL),
    "response-bit-from-client": (_client_sends_response, ErrorCode.PROTOCOL),
    "trailing-meta": (_trailing_meta, ErrorCode.PROTOCOL),
    "ping-with-payload": (_ping_with_payload, ErrorCode.PROTOCOL),
}


@pytest.mark.parametrize("case", list(WRONG_REQUESTS))
def test_wrong_request_gets_error_and_connection_stays_usable(node: DaemonProcess, case: str) -> None:
    build, code = WRONG_REQUESTS[case]
    with RawConnection(node.data_address) as conn:
        conn.send(build())
        expect_error(conn.read_frame().message, code, request_id=41)
        assert conn.ping(42), f"connection unusable after {case}\n{node.log()}"
        # A valid request on the same stream proves the rejected payload was drained exactly.
        data = next(iter(REFERENCE.values()))
        frame = conn.request(GetRequest(43, NS, [next(iter(REFERENCE)).hash]))
        assert isinstance(frame.message, GetResponse) and frame.message.statuses == [0], frame.message
        assert frame.payload == data
    assert_intact(node)


def test_refused_put_stores_nothing(node: DaemonProcess) -> None:
    baseline = usage(node)
    hashes = [os.urandom(32) for _ in range(MAX_KEYS + 1)]
    with RawConnection(node.data_address) as conn:
        conn.send(put_frame(3, NS, [(h, _block(i, 4096)) for i, h in enumerate(hashes)]))
        expect_error(conn.read_frame().message, ErrorCode.LIMIT_EXCEEDED, request_id=3)
        big = os.urandom(32)
        conn.send(put_frame(4, NS, [(big, _block(9, 2 << 20))]))
        expect_error(conn.read_frame().message, ErrorCode.LIMIT_EXCEEDED, request_id=4)
    assert exists(node, [BlockKey(NS, h) for h in [*hashes, big]]) == [False] * (MAX_KEYS + 2)
    assert usage(node) == baseline, "a refused put left blocks or memory behind"
    assert_intact(node)


def test_block_larger_than_slab_is_refused_by_sdk_and_daemon(node: DaemonProcess) -> None:
    key, data = fresh_keys(1)[0], _block(5, 2 << 20)
    before = counters(node).get("requests_put", 0)
    with KVPoolClient([node.address]) as client, pytest.raises(UsageError) as raised:
        client.put([key], [data])
    assert raised.value.code is ErrorCode.BLOCK_TOO_LARGE, raised.value

    async def async_put() -> None:
        async with AsyncKVPoolClient([node.address]) as client:
            await client.put([key], [data])

    with pytest.raises(UsageError):
        asyncio.run(async_put())
    assert counters(node).get("requests_put", 0) == before, "the SDK sent a block it knew was too large"
    with RawConnection(node.data_address) as conn:
        conn.send(put_frame(8, NS, [(key.hash, data)]))
        error = conn.read_frame().message
        assert isinstance(error, ErrorResponse), error
        assert error.code in (ErrorCode.BLOCK_TOO_LARGE, ErrorCode.LIMIT_EXCEEDED), error
        assert conn.ping()
    assert exists(node, [key]) == [False]
    assert_intact(node)


# -- peers that vanish mid-frame: nothing half-written becomes readable ----------------------


def _cut_put(cut: str) -> tuple[bytes, list[bytes]]:
    """A two-block PUT frame and the bytes of it sent before the peer disappears."""
    hashes = [os.urandom(32), os.urandom(32)]
    frame = put_frame(11, NS, [(h, _block(i + 1, 64 << 10)) for i, h in enumerate(hashes)])
    meta_end = len(frame) - (128 << 10)
    cut_at = {"mid-header": 10, "mid-meta": meta_end - 20, "mid-payload": meta_end + (96 << 10)}[cut]
    return frame[:cut_at], hashes


@pytest.mark.parametrize("cut", ["mid-header", "mid-meta", "mid-payload"])
def test_disconnect_mid_put_leaves_nothing_readable(node: DaemonProcess, cut: str) -> None:
    sent, hashes = _cut_put(cut)
    keys = [BlockKey(NS, h) for h in hashes]
    baseline = usage(node)
    dropped = counters(node).get("connections_dropped_mid_frame", 0)
    with RawConnection(node.data_address) as conn:
        conn.send(sent)
    if cut != "mid-header":  # a frame was begun: wait until the daemon has given up on it
        seen = wait_for_counter(node, "connections_dropped_mid_frame", dropped + 1)
        assert seen > dropped, f"daemon never noticed the peer left\n{node.log()}"
    assert exists(node, keys) == [False, False], "a block of an unfinished put became readable"
    assert usage(node) == baseline, "the aborted reservations were not freed"
    # The aborted reservations are gone: the same keys store normally now.
    blocks = [_block(i + 1, 64 << 10) for i in range(2)]
    with KVPoolClient([node.address]) as client:
        put = client.put(keys, blocks)
        assert put.statuses == (ErrorCode.OK, ErrorCode.OK), put.statuses
        got = client.get(keys)
        assert [bytes(b) for b in got.buffers] == blocks, got.statuses
        assert client.delete(keys) == [True, True]
    assert_intact(node)


# -- peers that stall: dropped after --io-timeout-s, others served meanwhile ---------------------

IO_TIMEOUT_S = 0.5


@pytest.fixture
def impatient(daemon_factory: Callable[..., DaemonProcess]) -> DaemonProcess:
    daemon = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--io-timeout-s", str(IO_TIMEOUT_S))
    with KVPoolClient([daemon.address]) as client:
        assert client.put(list(REFERENCE), list(REFERENCE.values())).stored == len(REFERENCE)
    return daemon


def _serve_others_while_stalled(daemon: DaemonProcess) -> None:
    """During a stall another client writes and reads, and a long GET completes."""
    key, data = fresh_keys(1)[0], os.urandom(256 << 10)
    with KVPoolClient([daemon.address]) as client:
        assert client.put([key], [data]).stored == 1
        assert bytes(client.get([key]).buffers[0]) == data
        assert client.delete([key]) == [True]


def _stall_and_expect_drop(daemon: DaemonProcess, partial: bytes) -> None:
    baseline = usage(daemon)
    with RawConnection(daemon.data_address) as staller:
        staller.send(partial)
        started = time.monotonic()
        _serve_others_while_stalled(daemon)
        closed = staller.closed_by_peer(within=IO_TIMEOUT_S * 4)
        waited = time.monotonic() - started
    assert closed, f"a peer stalled for {waited:.1f}s (io timeout {IO_TIMEOUT_S}s) was not dropped\n{daemon.log()}"
    assert waited >= IO_TIMEOUT_S * 0.8, f"dropped after {waited:.2f}s, before the io timeout"
    assert usage(daemon) == baseline, "the dropped peer's reservations were not freed"
    assert_intact(daemon)


@pytest.mark.parametrize("where", ["mid-meta", "mid-payload"])
def test_stalled_peer_mid_frame_is_dropped(impatient: DaemonProcess, where: str) -> None:
    sent, hashes = _cut_put(where)
    _stall_and_expect_drop(impatient, sent)
    assert exists(impatient, [BlockKey(NS, h) for h in hashes]) == [False, False]


def test_stalled_peer_mid_header_is_dropped(impatient: DaemonProcess) -> None:
    _stall_and_expect_drop(impatient, raw_header(Op.PING)[:5])


def test_idle_connection_between_frames_is_kept(impatient: DaemonProcess) -> None:
    """Pooled client connections sit idle between requests: that is not a stall."""
    with RawConnection(impatient.data_address) as conn:
        assert conn.ping(1)
        assert not conn.closed_by_peer(within=IO_TIMEOUT_S * 2)
        assert conn.ping(2)


def test_slow_but_steady_peer_is_not_dropped(impatient: DaemonProcess) -> None:
    """The stall timeout bounds each wait, not the frame: steady progress for longer than it is fine
    (within the payload's deadline: the io timeout plus 1 s per MiB)."""
    keys = fresh_keys(2)
    blocks = [_block(3, 1 << 20), _block(4, 1 << 20)]
    frame = put_frame(21, NS, [(key.hash, block) for key, block in zip(keys, blocks, strict=True)])
    step = len(frame) // 16
    started = time.monotonic()
    with RawConnection(impatient.data_address) as conn:
        try:
            for start in range(0, len(frame), step):  # 16+ slices, 0.1 s apart: about 1.6 s in all
                conn.send(frame[start : start + step])
                time.sleep(0.1)
            answer = conn.read_frame().message
        except OSError as exc:
            dropped = time.monotonic() - started
            pytest.fail(f"dropped after {dropped:.2f}s though it never paused over 0.1s: {exc!r}\n{impatient.log()}")
    assert isinstance(answer, StatusResponse) and answer.statuses == [0, 0], answer
    assert exists(impatient, keys) == [True, True]


def test_trickling_peer_is_dropped_at_its_payload_deadline(impatient: DaemonProcess) -> None:
    """A byte now and then, each within the stall timeout, must not hold reserved slots for ever."""
    keys = fresh_keys(8)
    frame = put_frame(22, NS, [(key.hash, _block(i, 1 << 20)) for i, key in enumerate(keys)])
    head = len(frame) - 8 * (1 << 20)
    baseline = usage(impatient)
    deadline = IO_TIMEOUT_S + 8.0  # the io timeout, plus 1 s per MiB of payload
    with RawConnection(impatient.data_address) as staller:
        staller.send(frame[: head + 1])
        started, sent, closed = time.monotonic(), head + 1, False
        while not closed and time.monotonic() - started < deadline + 3:
            closed = staller.closed_by_peer(within=IO_TIMEOUT_S * 0.6)
            if not closed:
                staller.send(frame[sent : sent + 1])
                sent += 1
        waited = time.monotonic() - started
    assert closed, f"a peer trickling one byte per {IO_TIMEOUT_S * 0.6}s was kept {waited:.1f}s\n{impatient.log()}"
    assert waited >= deadline * 0.9, f"dropped after {waited:.1f}s, before its payload deadline of {deadline}s"
    assert usage(impatient) == baseline, "the dropped peer's reservations were not freed"
    assert exists(impatient, keys) == [False] * 8
    assert_intact(impatient)


def test_empty_block_is_an_invalid_argument(node: DaemonProcess) -> None:
    key = fresh_keys(1)[0]
    with RawConnection(node.data_address) as conn:
        conn.send(put_frame(23, NS, [(key.hash, b"")]))
        answer = conn.read_frame().message
    assert isinstance(answer, StatusResponse) and answer.statuses == [int(ErrorCode.INVALID_ARGUMENT)], answer
    assert exists(node, [key]) == [False]


# -- gRPC control plane: invalid arguments and unknown keys ----------------------------------


@pytest.fixture
def stub(node: DaemonProcess) -> Iterator[kvpool_pb2_grpc.KVPoolStub]:
    with grpc.insecure_channel(node.address) as channel:
        yield kvpool_pb2_grpc.KVPoolStub(channel)


BAD_KEYS = {
    "empty-namespace": pb.KeysRequest(namespace="", hashes=[b"\x01" * 32]),
    "long-namespace": pb.KeysRequest(namespace="n" * 256, hashes=[b"\x01" * 32]),
    "hash-65-bytes": pb.KeysRequest(namespace=NS, hashes=[b"\x01" * 32, b"\x02" * 65]),
    "hash-empty": pb.KeysRequest(namespace=NS, hashes=[b""]),
    "too-many-keys": pb.KeysRequest(namespace=NS, hashes=[bytes([i]) * 32 for i in range(MAX_KEYS + 1)]),
}


@pytest.mark.parametrize("method", ["Exists", "Lookup", "Delete"])
@pytest.mark.parametrize("case", list(BAD_KEYS))
def test_grpc_rejects_bad_keys(node: DaemonProcess, stub: kvpool_pb2_grpc.KVPoolStub, method: str, case: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        getattr(stub, method)(BAD_KEYS[case], timeout=5)
    error = raised.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    trailing = dict(error.trailing_metadata() or ())
    assert trailing.get("kvpool-error-code") == str(int(ErrorCode.INVALID_ARGUMENT)), trailing
    assert error.details(), "INVALID_ARGUMENT without an explanation"
    assert_intact(node)


@pytest.mark.parametrize(
    "body", [b"\xff\xff\xff", b"\x0a\x80", b"\x12\x05ab"], ids=["garbage", "truncated-varint", "short-field"]
)
@pytest.mark.parametrize("method", ["Exists", "Lookup", "Delete", "GetStats", "SetState"])
def test_grpc_rejects_unparsable_bodies(node: DaemonProcess, method: str, body: bytes) -> None:
    with grpc.insecure_channel(node.address) as channel:
        call = channel.unary_unary(f"/kvpool.v1.KVPool/{method}", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as raised:
            call(body, timeout=5)
    error = raised.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    trailing = dict(error.trailing_metadata() or ())
    assert trailing.get("kvpool-error-code") == str(int(ErrorCode.PROTOCOL)), trailing
    assert method in (error.details() or ""), error.details()
    assert_intact(node)


def test_grpc_unknown_keys(node: DaemonProcess, stub: kvpool_pb2_grpc.KVPoolStub) -> None:
    stored = [k.hash for k in REFERENCE]
    unknown = [os.urandom(32) for _ in range(3)]
    mixed = pb.KeysRequest(namespace=NS, hashes=[stored[0], unknown[0], stored[1]])
    assert list(stub.Exists(mixed, timeout=5).present) == [True, False, True]
    assert stub.Lookup(mixed, timeout=5).prefix_hits == 1
    assert stub.Lookup(pb.KeysRequest(namespace=NS, hashes=unknown), timeout=5).prefix_hits == 0
    other_ns = stub.Exists(pb.KeysRequest(namespace=NS + "x", hashes=stored), timeout=5).present
    assert list(other_ns) == [False] * len(stored), "a key matched in another namespace"
    assert list(stub.Delete(pb.KeysRequest(namespace=NS, hashes=unknown), timeout=5).deleted) == [False] * 3
    assert list(stub.Delete(pb.KeysRequest(namespace=NS + "x", hashes=stored), timeout=5).deleted) == [False] * 3
    assert list(stub.Exists(pb.KeysRequest(namespace=NS, hashes=[]), timeout=5).present) == []
    assert_intact(node)


def test_data_plane_unknown_keys(node: DaemonProcess) -> None:
    keys = [next(iter(REFERENCE)), *fresh_keys(2)]
    with KVPoolClient([node.address]) as client:
        got = client.get(keys)
        assert got.statuses == (ErrorCode.OK, ErrorCode.NOT_FOUND, ErrorCode.NOT_FOUND), got.statuses
        assert got.buffers[1:] == (None, None)
        assert got.prefix_hits == 1 and got.hits == 1 and not got.ok
        assert client.delete(keys[1:]) == [False, False]
        assert client.exists(keys) == [True, False, False]
        assert client.lookup(keys[1:]) == 0
    with RawConnection(node.data_address) as conn:
        frame = conn.request(ExistsRequest(5, NS, [k.hash for k in keys[1:]]))
        assert frame.message == StatusResponse(5, Op.EXISTS, [ErrorCode.NOT_FOUND] * 2), frame.message
        frame = conn.request(DeleteRequest(6, NS, [k.hash for k in keys[1:]]))
        assert frame.message == StatusResponse(6, Op.DELETE, [ErrorCode.NOT_FOUND] * 2), frame.message
        assert conn.request(PingRequest(7)).header.request_id == 7
    assert_intact(node)
