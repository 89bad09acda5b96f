"""Admission control against hostile peers: what a request announces buys it nothing until its bytes arrive.

Each test speaks the wire protocol by hand to a real daemon, as a hostile client would.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from contextlib import ExitStack

import pytest

from kvpool_client import BlockKey, KVPoolClient
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.wire import PutRequest, StatusResponse, encode
from kvpool_server.data.admission import Admission, AdmissionLimits
from kvpool_server.stats import Counters
from tests.support.daemon import DaemonProcess
from tests.support.rawwire import RawConnection, put_frame

MiB = 1 << 20
NS = "admission@bf16@test@tp0of1"


def keys(tag: str, count: int) -> list[BlockKey]:
    """Keys of one hash size (a frame's hashes share one)."""
    return [BlockKey(NS, hashlib.sha256(f"{tag}-{i}".encode()).digest()) for i in range(count)]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def announce(request_id: int, tag: str, count: int, length: int) -> bytes:
    """A put's header and meta announcing ``count`` blocks of ``length`` bytes; no payload."""
    return encode(PutRequest(request_id, NS, [k.hash for k in keys(tag, count)], [length] * count))


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def small(daemon_factory: Callable[..., DaemonProcess]) -> DaemonProcess:
    """16 slots of 4 MiB: one stalled put could once empty it."""
    return daemon_factory("--dram-capacity", "64MiB", "--slab-size", "4MiB")


def test_a_stalled_oversized_put_evicts_nothing_and_blocks_no_writer(small: DaemonProcess) -> None:
    stored = keys("stored", 14)
    with KVPoolClient([small.address]) as client:
        assert client.put(stored, [bytes([i]) * (4 * MiB) for i in range(14)]).stored == 14
        with RawConnection(small.data_address) as hostile:
            hostile.send(announce(1, "hostile", 64, 4 * MiB))  # 256 MiB announced to a 64 MiB arena, nothing sent
            others = keys("other", 2)
            result = client.put(others, [b"o" * (4 * MiB)] * 2)
            assert result.statuses == (ErrorCode.OK,) * 2, f"another writer was blocked: {result.statuses}"
            assert client.exists(stored) == [True] * 14, "a put that sent nothing evicted stored blocks"
            got = client.get(stored[:1])
            assert got.ok and bytes(got.buffers[0]) == bytes([0]) * (4 * MiB)


def test_puts_beyond_the_budget_in_flight_are_refused_overloaded_then_admitted(
    daemon_factory: Callable[..., DaemonProcess],
) -> None:
    daemon = daemon_factory("--dram-capacity", "64MiB", "--slab-size", "4MiB", "--max-inflight-put-bytes", "4MiB")
    block = b"x" * (4 * MiB)
    frame = put_frame(7, NS, [(keys("slow", 1)[0].hash, block)])
    with RawConnection(daemon.data_address) as slow, KVPoolClient([daemon.address]) as client:
        slow.send(frame[: len(frame) - 2 * MiB])  # half a block: its slot holds the whole budget
        wait_until(lambda: _counter(client, daemon, "bytes_in") == 0 and _reserved(client, daemon))
        refused = client.put(keys("fast", 1), [block])
        assert refused.statuses == (ErrorCode.OVERLOADED,), refused.statuses
        slow.send(frame[len(frame) - 2 * MiB :])
        answer = slow.read_frame().message
        assert isinstance(answer, StatusResponse) and answer.statuses == [0], answer
        assert client.put(keys("fast", 1), [block]).statuses == (ErrorCode.OK,), "the budget came back"
        assert _counter(client, daemon, "puts_overloaded") == 1


def test_stalled_connections_claiming_large_payloads_cost_little_memory(small: DaemonProcess) -> None:
    """Refused payload is read through one shared sink: hundreds of stalled peers add no buffers."""
    stored = keys("stored", 2)
    with KVPoolClient([small.address]) as client:
        client.put(stored, [b"s" * (4 * MiB)] * 2).raise_for_errors()
        pid = small.process.pid
        before = rss_bytes(pid)
        with ExitStack() as stack:
            for i in range(200):
                conn = stack.enter_context(RawConnection(small.data_address))
                # blocks the node has: refused ALREADY_EXISTS, so their 8 MiB are to be drained; one byte comes
                request = PutRequest(i + 1, NS, [k.hash for k in stored], [4 * MiB] * 2)
                conn.send(encode(request) + b"\0")
            wait_until(lambda: _counter(client, small, "requests_put") >= 201)  # every one is being served
            during = rss_bytes(pid)
    grown = during - before
    assert grown < 40 * MiB, f"200 stalled connections grew the daemon by {grown / MiB:.0f} MiB"


def test_connections_over_the_per_peer_limit_are_closed(daemon_factory: Callable[..., DaemonProcess]) -> None:
    daemon = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--max-connections-per-peer", "3")
    with ExitStack() as stack:
        kept = [stack.enter_context(RawConnection(daemon.data_address)) for _ in range(3)]
        assert all(conn.ping(i + 1) for i, conn in enumerate(kept))
        extra = stack.enter_context(RawConnection(daemon.data_address))
        assert extra.closed_by_peer(within=10), "a fourth connection from one peer was served"
    with KVPoolClient([daemon.address]) as client:
        wait_until(lambda: _counter(client, daemon, "connections_refused") >= 1)
        assert client.put(keys("after", 1), [b"x"]).ok, "the slots of closed connections came back"


def _counter(client: KVPoolClient, daemon: DaemonProcess, name: str) -> int:
    return int(client.stats(daemon.address).counters[name])


def _reserved(client: KVPoolClient, daemon: DaemonProcess) -> bool:
    (dram,) = client.stats(daemon.address).tiers
    return dram.used_bytes > 0


def test_a_tenant_holds_at_most_its_share_of_the_put_budget() -> None:
    admission = Admission(AdmissionLimits(inflight_put_bytes=100, connections=8, connections_per_peer=8), Counters())
    assert admission.take(50, "hostile") and not admission.take(1, "hostile"), "half the budget, no more"
    assert admission.take(40, "other") and admission.take(10), "the rest is the others'"
    assert not admission.take(1), "the budget is whole"
    admission.give(50, "hostile")
    assert admission.take(30, "hostile") and admission.inflight_put_bytes == 80
