"""The one-sided data plane (NIXL): what its leases, generations and peers promise, against real daemons.

The transports contract (tests/client/test_transports.py) runs its round trips and races over
``nixl`` too; these are the cases only a one-sided plane has: slots reserved and never
committed, a slot reused while a client reads it, a restarted node's stale agent, a node
lying about where blocks are. They run in a pytest process of their own (``-m nixl``, over
cma and again with ``UCX_TLS=tcp``): NIXL's UCX cannot share a process with ucxx's.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from kvpool_client import AsyncKVPoolClient, BlockKey, ClientConfig, ErrorCode, KVPoolClient
from kvpool_client.core.channels.nixl_agent import import_error
from kvpool_client.core.errors import ProtocolError
from kvpool_client.core.wire import (
    CommitRequest,
    ErrorResponse,
    LocateRequest,
    LocateResponse,
    Op,
    PeerRequest,
    PeerResponse,
    ReserveRequest,
    ReserveResponse,
    StatusResponse,
)
from kvpool_client.exchange import _copy_located
from kvpool_client.transport.nixl import LocalAgent, RemoteArena
from kvpool_client.transport.shm import SlotLocation
from tests.client.test_transports import new_keys, pattern
from tests.support.daemon import DaemonProcess
from tests.support.etcd import free_port
from tests.support.rawwire import RawConnection
from tests.support.waiting import wait_until

MISSING = import_error()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.nixl,
    pytest.mark.skipif(MISSING is not None, reason=f"nixl cannot be imported: {MISSING}"),
]

KiB = 1 << 10
CMA = "tcp" not in os.environ.get("UCX_TLS", "")  # else UCX emulates READ and WRITE on the node's progress thread
NIXL = ("--nixl-enabled", "--dram-capacity", "16MiB", "--slab-size", "1MiB")
OK = ErrorCode.OK


def connect(daemon: DaemonProcess, **settings: object) -> KVPoolClient:
    client = KVPoolClient(config=ClientConfig(nodes=(daemon.address,), transport="nixl", **settings))  # type: ignore[arg-type]
    assert client.transport(daemon.address) == "nixl"
    return client


def dram_used(client: KVPoolClient, daemon: DaemonProcess) -> int:
    (tier,) = [t for t in client.stats(daemon.address).tiers if t.name == "dram"]
    return int(tier.used_bytes)


def process_state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def reserve(raw: RawConnection, keys: list[BlockKey], size: int) -> ReserveResponse:
    request = ReserveRequest(1, keys[0].namespace, [k.hash for k in keys], [size] * len(keys))
    answer = raw.request(request).message
    assert isinstance(answer, ReserveResponse), answer
    return answer


# -- leases ------------------------------------------------------------------------------------


def test_a_lease_not_committed_in_time_publishes_nothing_and_gives_its_slots_back(
    daemon_factory: Callable[..., DaemonProcess],
) -> None:
    daemon = daemon_factory(*NIXL, "--io-timeout-s", "0.5")
    keys = new_keys(3)
    with connect(daemon) as client, RawConnection(daemon.data_address) as raw:
        lease = reserve(raw, keys, 64 * KiB)
        assert lease.statuses == [OK] * 3
        assert dram_used(client, daemon) > 0, "reserved slots are allocated"
        assert client.exists(keys) == [False] * 3, "reserved blocks are readable by nobody"
        wait_until(lambda: dram_used(client, daemon), lambda used: used == 0, "the expired lease's slots freed")
        assert client.stats(daemon.address).counters["leases_expired"] == 1
        late = raw.request(CommitRequest(2, lease.lease, [1, 2, 3])).message
        assert isinstance(late, StatusResponse) and late.statuses == [ErrorCode.TIMEOUT] * 3, late
        assert client.exists(keys) == [False] * 3
        assert client.put(keys, [pattern(k, 64 * KiB) for k in keys]).stored == 3, "the keys are free again"


_RESERVE_AND_WAIT = """
import sys
from kvpool_client.core.wire import ReserveRequest
from tests.support.rawwire import RawConnection
raw = RawConnection(sys.argv[1])
answer = raw.request(ReserveRequest(1, sys.argv[2], [bytes.fromhex(h) for h in sys.argv[3:]], [65536] * 2)).message
print("reserved", answer.statuses, flush=True)
sys.stdin.read()
"""


def test_a_client_killed_after_reserve_leaves_nothing_behind(daemon_factory: Callable[..., DaemonProcess]) -> None:
    daemon = daemon_factory(*NIXL)  # leases last 30 s: only the connection's end frees these slots
    keys = new_keys(2)
    argv = [
        sys.executable,
        "-c",
        _RESERVE_AND_WAIT,
        daemon.data_address,
        keys[0].namespace,
        *(k.hash.hex() for k in keys),
    ]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("reserved [0, 0]"), line
        with connect(daemon) as client:
            assert dram_used(client, daemon) == 128 * KiB
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            wait_until(lambda: dram_used(client, daemon), lambda used: used == 0, "the killed client's slots freed")
            assert client.exists(keys) == [False] * 2
            blocks = [pattern(k, 64 * KiB) for k in keys]
            assert client.put(keys, blocks).stored == 2
            assert [bytes(b) for b in client.get(keys).buffers] == blocks
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_a_commit_that_does_not_fit_its_lease_is_refused_and_stores_nothing(
    daemon_factory: Callable[..., DaemonProcess],
) -> None:
    daemon = daemon_factory(*NIXL)
    keys = new_keys(2)
    with connect(daemon) as client, RawConnection(daemon.data_address) as raw:
        lease = reserve(raw, keys, 64 * KiB)
        refused = raw.request(CommitRequest(2, lease.lease, [1])).message
        assert isinstance(refused, ErrorResponse) and refused.code == ErrorCode.INVALID_ARGUMENT, refused
        assert dram_used(client, daemon) == 0 and client.exists(keys) == [False] * 2
        aborted = reserve(raw, keys, 64 * KiB)
        assert raw.request(CommitRequest(3, aborted.lease, [])).message == StatusResponse(3, Op.COMMIT, [])
        assert dram_used(client, daemon) == 0, "a commit without checksums gives the slots back"
        unknown = raw.request(CommitRequest(4, 999, [1, 2])).message
        assert isinstance(unknown, StatusResponse) and unknown.statuses == [ErrorCode.TIMEOUT] * 2


def test_the_node_counts_what_it_hands_one_sided_readers_and_writers(
    daemon_factory: Callable[..., DaemonProcess],
) -> None:
    """A put of 512 KiB or more is written one-sided; a smaller one goes over the wire (RESERVE and
    COMMIT would cost the node more than receiving it)."""
    daemon = daemon_factory(*NIXL)
    keys, small = new_keys(4), new_keys(1)
    with connect(daemon, location_ttl_s=0.0) as client:
        assert client.put(keys, [pattern(k, 256 * KiB) for k in keys]).stored == 4
        assert client.put(small, [pattern(small[0], 64 * KiB)]).stored == 1
        assert client.get(keys).ok
        counters = client.stats(daemon.address).counters
    assert counters["bytes_in_nixl"] == counters["bytes_out_nixl"] == 4 * 256 * KiB, dict(counters)
    assert counters["bytes_in"] == 64 * KiB and counters["requests_put"] == 1, dict(counters)
    assert counters["bytes_out"] == counters["bytes_out_shm"] == 0, dict(counters)
    assert counters["requests_reserve"] == counters["requests_commit"] == counters["requests_locate"] == 1


def test_one_sided_requests_to_a_node_without_nixl_are_refused(daemon: DaemonProcess) -> None:
    keys = new_keys(1)
    with RawConnection(daemon.data_address) as raw:
        for request in (PeerRequest(1), ReserveRequest(2, keys[0].namespace, [keys[0].hash], [4096])):
            answer = raw.request(request).message
            assert isinstance(answer, ErrorResponse) and answer.code == ErrorCode.INVALID_ARGUMENT, answer
        assert raw.ping()


# -- generations ----------------------------------------------------------------------------------


def test_a_slot_reused_during_a_read_is_never_returned(daemon_factory: Callable[..., DaemonProcess]) -> None:
    """The race made deterministic: a block located, then deleted and its slot given to another
    block before the READ. The READ brings the new block's bytes (what a client without the
    generation check would return); the check after it sends the key to be read again."""
    daemon = daemon_factory(*NIXL)
    old, new = new_keys(1), new_keys(1)
    with connect(daemon) as client, RawConnection(daemon.data_address) as raw:
        assert client.put(old, [pattern(old[0], 64 * KiB)]).stored == 1
        located = raw.request(LocateRequest(1, old[0].namespace, [old[0].hash])).message
        assert isinstance(located, LocateResponse) and located.statuses == [OK]
        assert client.delete(old) == [True]
        # The LOCATE's pin may outlive its answer by a moment: the slot is freed once it goes.
        wait_until(lambda: dram_used(client, daemon), lambda used: used == 0, "the deleted block's slot freed")
        assert client.put(new, [pattern(new[0], 64 * KiB)]).stored == 1
        again = raw.request(LocateRequest(2, new[0].namespace, [new[0].hash])).message
        assert isinstance(again, LocateResponse) and again.offsets == located.offsets, "the slot was reused"
        arena = RemoteArena(LocalAgent(5.0))
        peer = raw.request(PeerRequest(3)).message
        assert isinstance(peer, PeerResponse)
        arena.connect(peer)
        target = memoryview(bytearray(64 * KiB))
        statuses, filled, retry = _copy_located(located, [target], arena, verify=False)
        assert bytes(target) == pattern(new[0], 64 * KiB), "the READ raced the reuse: these bytes are another block's"
        assert (statuses, filled, retry) == ([OK], [None], [0]), "the generation check caught it"
        arena.close()


# -- peers ---------------------------------------------------------------------------------------


def test_a_restarted_node_is_reached_through_its_new_agent(daemon_factory: Callable[..., DaemonProcess]) -> None:
    grpc, data = free_port(), free_port()
    flags = ("--grpc-port", str(grpc), "--data-port", str(data), *NIXL)
    first = daemon_factory(*flags)
    keys = new_keys(4)
    blocks = [pattern(k, 128 * KiB) for k in keys]
    with connect(first) as client:
        assert client.put(keys, blocks).stored == 4 and client.get(keys).ok
        first.stop()
        second = daemon_factory(*flags)
        stored = {ErrorCode.OK, ErrorCode.ALREADY_EXISTS}
        results = [client.put(keys, blocks)]  # may find a pooled connection to the old process gone
        while not set(results[-1].statuses) <= stored and len(results) < 3:
            results.append(client.put(keys, blocks))
        assert set(results[-1].statuses) <= stored, results
        got = client.get(keys)
        assert got.ok and [bytes(b) for b in got.buffers] == blocks
        assert client.transport(second.address) == "nixl"


def test_a_node_that_names_places_outside_its_arena_is_not_read(daemon_factory: Callable[..., DaemonProcess]) -> None:
    daemon = daemon_factory(*NIXL)
    with RawConnection(daemon.data_address) as raw:
        peer = raw.request(PeerRequest(1)).message
        assert isinstance(peer, PeerResponse)
        arena = RemoteArena(LocalAgent(5.0))
        arena.connect(peer)
        target = memoryview(bytearray(4 * KiB))
        for offset in (peer.generations_offset, peer.generations_offset - 1024, 1 << 62):
            with pytest.raises(ProtocolError, match="outside the arena"):
                arena.copy_all([(SlotLocation(offset, len(target), 0), target)])
        with pytest.raises(ProtocolError, match="slot boundary"):
            arena.unchanged_all([SlotLocation(100, 4 * KiB, 0)])
        lying = PeerResponse(2, peer.arena_id ^ 1, peer.base, peer.size, peer.generations_offset, peer.agent)
        with pytest.raises(ProtocolError, match="registered arena"):
            RemoteArena(LocalAgent(5.0)).connect(lying)
        arena.close()


def test_a_daemon_killed_mid_put_fails_the_puts_cleanly(daemon_factory: Callable[..., DaemonProcess]) -> None:
    daemon = daemon_factory(*NIXL)
    with connect(daemon, request_timeout_s=2.0) as client:
        codes: set[ErrorCode] = set()
        for round_ in range(40):
            keys = new_keys(8)
            if round_ == 5:
                daemon.process.send_signal(signal.SIGKILL)
            codes.update(client.put(keys, [pattern(k, 256 * KiB) for k in keys]).statuses)
        assert OK in codes and codes - {OK} <= {ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT}, codes


# -- the asyncio client ------------------------------------------------------------------------


def test_the_asyncio_client_transfers_off_its_event_loop(daemon_factory: Callable[..., DaemonProcess]) -> None:
    """A stopped daemon: its known blocks are read one-sided over cma (the node's CPU takes no part),
    and a READ UCX emulates over TCP (which needs the node) times out; either way the client's event
    loop goes on meanwhile: a transfer runs on a thread, not on the loop."""
    daemon = daemon_factory(*NIXL)
    keys = new_keys(8)
    blocks = [pattern(k, 128 * KiB) for k in keys]
    timeout = 2.0

    async def scenario() -> tuple[list[ErrorCode], list[bytes], float]:
        config = ClientConfig(nodes=(daemon.address,), transport="nixl", location_ttl_s=60.0, request_timeout_s=timeout)
        async with AsyncKVPoolClient(config=config) as client:
            assert (await client.put(keys, blocks)).stored == 8
            assert (await client.get(keys)).ok, "places now known"
            ticks: list[float] = []

            async def tick() -> None:
                while True:
                    ticks.append(time.monotonic())
                    await asyncio.sleep(0.005)

            daemon.process.send_signal(signal.SIGSTOP)
            try:
                wait_until(lambda: process_state(daemon.process.pid), lambda state: state == "T", "the daemon stopped")
                ticks.append(time.monotonic())
                ticker = asyncio.ensure_future(tick())
                got = await client.get(keys)
                ticks.append(time.monotonic())
                ticker.cancel()
            finally:
                daemon.process.send_signal(signal.SIGCONT)
            gap = max(b - a for a, b in itertools.pairwise(ticks))
            return list(got.statuses), [bytes(b) for b in got.buffers if b is not None], gap

    statuses, got, gap = asyncio.run(scenario())
    if CMA:
        assert statuses == [OK] * 8 and got == blocks, statuses
    else:
        assert OK not in statuses and set(statuses) <= {ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE}, statuses
    assert gap < timeout / 2, f"the event loop stood still for {gap:.3f} s during the get"
