"""One contract for every data-plane transport: the same puts, gets, errors and races on each.

Each test runs once per transport the client can use against a daemon on this
node (``tcp``; ``shm``: gets copied out of the daemon's arena; ``ucx``: UCX over
shared memory and TCP, skipped only where ucxx cannot be imported). A transport
that drifts from the others fails here. The races check one thing above all:
a get never returns wrong bytes, whatever eviction or a dying daemon does.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from kvpool_client import AsyncKVPoolClient, BlockKey, CircuitState, ClientConfig, ErrorCode, KVPoolClient
from kvpool_client.core.channels.nixl_agent import import_error as nixl_import_error
from kvpool_client.transport.ucx import import_error as ucx_import_error
from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.etcd import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

OK, NOT_FOUND = ErrorCode.OK, ErrorCode.NOT_FOUND
KiB, MiB = 1 << 10, 1 << 20
# Asked when a ucx test is set up, not at import: once ucxx is imported, NIXL cannot work in
# this process (the nixl tests run in one of their own, which imports this module).
needs_ucx = pytest.mark.skipif("ucx_import_error() is not None", reason="ucxx cannot be imported here")
NIXL_MISSING = nixl_import_error()
TRANSPORTS = [
    "tcp",
    "shm",
    pytest.param("ucx", marks=needs_ucx),
    pytest.param(
        "nixl",
        marks=[
            pytest.mark.nixl,
            pytest.mark.skipif(NIXL_MISSING is not None, reason=f"nixl cannot be imported: {NIXL_MISSING}"),
        ],
    ),
]
NIXL = ("--nixl-enabled",)


def ucx_flags() -> tuple[str, ...]:
    """Every daemon here offers ucx when ucxx imports."""
    return ("--ucx-port", "0") if ucx_import_error() is None else ()


def offering(transport: str) -> tuple[str, ...]:
    """A daemon's flags that offer ``transport``: ucx where it can, or nixl (ucxx's UCX and NIXL's
    cannot share the daemon's process)."""
    return NIXL if transport == "nixl" else ucx_flags()


NODE_DOWN = {ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT}


@pytest.fixture(scope="module")
def wire_node() -> Iterator[DaemonProcess]:
    with running_daemon("--dram-capacity", "32MiB", "--slab-size", "1MiB", *ucx_flags()) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def nixl_node() -> Iterator[DaemonProcess]:
    with running_daemon("--dram-capacity", "32MiB", "--slab-size", "1MiB", *NIXL) as daemon:
        yield daemon


@pytest.fixture
def node(request: pytest.FixtureRequest) -> DaemonProcess:
    """The module's daemon that offers the test's transport."""
    nixl = "transport" in request.fixturenames and request.getfixturevalue("transport") == "nixl"
    return request.getfixturevalue("nixl_node" if nixl else "wire_node")  # type: ignore[no-any-return]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def connect(daemon: DaemonProcess, transport: str, **settings: object) -> KVPoolClient:
    """A client whose gets use ``transport``; fails unless that is what it negotiated."""
    client = KVPoolClient(config=ClientConfig(nodes=(daemon.address,), transport=transport, **settings))  # type: ignore[arg-type]
    assert client.transport(daemon.address) == transport
    return client


@pytest.fixture
def client(node: DaemonProcess, transport: str) -> Iterator[KVPoolClient]:
    with connect(node, transport) as c:
        yield c


def new_keys(n: int) -> list[BlockKey]:
    ns = f"tr-{uuid.uuid4().hex[:12]}@u8@raw@tp0of1"
    return [BlockKey(ns, os.urandom(32)) for _ in range(n)]


def pattern(key: BlockKey, size: int) -> bytes:
    """Bytes determined by the key, so any reader can check any block it got."""
    return random.Random(key.hash).randbytes(size)


# -- round trips ---------------------------------------------------------------------------


def test_gets_into_every_kind_of_buffer(client: KVPoolClient) -> None:
    keys = new_keys(4)
    sizes = [4 * KiB, 64 * KiB, 384 * KiB, MiB]
    blocks = [pattern(k, n) for k, n in zip(keys, sizes, strict=True)]
    assert client.put(keys, blocks).stored == 4
    into_bytearrays = [bytearray(n) for n in sizes]
    assert client.get(keys, into_bytearrays).ok
    assert [bytes(b) for b in into_bytearrays] == blocks
    into_numpy = [np.empty(n // 2, dtype=np.float16) for n in sizes]
    assert client.get(keys, into_numpy).ok
    assert [a.tobytes() for a in into_numpy] == blocks
    into_torch = [torch.empty(n // 2, dtype=torch.bfloat16) for n in sizes]
    got = client.get(keys, into_torch)
    assert got.ok and [t.view(torch.uint8).numpy().tobytes() for t in into_torch] == blocks
    allocated = client.get(keys)
    assert [bytes(b) for b in allocated.buffers] == blocks


def test_misses_and_hits_mix_in_one_batch(client: KVPoolClient) -> None:
    keys = new_keys(6)
    stored = keys[1::2]
    assert client.put(stored, [pattern(k, 8 * KiB) for k in stored]).stored == 3
    got = client.get(keys)
    assert got.statuses == (NOT_FOUND, OK) * 3 and got.hits == 3 and got.prefix_hits == 0
    assert [bytes(got.buffers[i]) for i in (1, 3, 5)] == [pattern(k, 8 * KiB) for k in stored]
    assert [got.buffers[i] for i in (0, 2, 4)] == [None] * 3


def test_a_wrong_size_fails_that_key_only_and_leaves_its_buffer_alone(client: KVPoolClient) -> None:
    keys = new_keys(3)
    assert client.put(keys, [pattern(k, 16 * KiB) for k in keys]).stored == 3
    targets = [bytearray(16 * KiB), bytearray(b"\xab" * (8 * KiB)), bytearray(16 * KiB)]
    got = client.get(keys, targets)
    assert got.statuses == (OK, ErrorCode.SIZE_MISMATCH, OK)
    assert targets[1] == b"\xab" * (8 * KiB), "a refused block must not touch the caller's buffer"
    assert bytes(targets[2]) == pattern(keys[2], 16 * KiB)
    assert client.get(keys[2:], [bytearray(16 * KiB)]).ok, "the connection goes on after a mismatch"


def test_checksums_verified_on_the_client(node: DaemonProcess, transport: str) -> None:
    keys = new_keys(2)
    with connect(node, transport, verify_checksums=True) as c:
        assert c.put(keys, [pattern(k, 32 * KiB) for k in keys]).stored == 2
        got = c.get(keys)
        assert got.ok and [bytes(b) for b in got.buffers] == [pattern(k, 32 * KiB) for k in keys]


def test_async_client_gets_over_the_same_transport(node: DaemonProcess, transport: str) -> None:
    keys = new_keys(8)
    blocks = [pattern(k, 64 * KiB) for k in keys]

    async def scenario() -> list[bytes]:
        config = ClientConfig(nodes=(node.address,), transport=transport)
        async with AsyncKVPoolClient(config=config) as c:
            assert (await c.put(keys, blocks)).stored == 8
            assert await c.transport(node.address) == transport
            got = await c.get(keys + new_keys(1))
            assert got.statuses == (OK,) * 8 + (NOT_FOUND,)
            return [bytes(b) for b in got.buffers[:8]]

    assert asyncio.run(scenario()) == blocks


def test_concurrent_clients_each_read_their_own_and_shared_blocks(node: DaemonProcess, transport: str) -> None:
    shared = new_keys(8)
    with connect(node, transport) as c:
        assert c.put(shared, [pattern(k, 64 * KiB) for k in shared]).stored == 8
    failures: list[str] = []

    def work(index: int) -> None:
        with connect(node, transport) as c:
            own = new_keys(16)
            if c.put(own, [pattern(k, 32 * KiB) for k in own]).stored != 16:
                failures.append(f"client {index}: put failed")
            for _ in range(10):
                keys = own + shared
                got = c.get(keys)
                if not got.ok or any(bytes(b) != pattern(k, len(b)) for k, b in zip(keys, got.buffers, strict=True)):
                    failures.append(f"client {index}: {got.statuses}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures, failures[:3]


# -- races -----------------------------------------------------------------------------------


RACED_READS = 200  # keys read OK and keys found missing, each, before the race stops


def test_eviction_racing_reads_never_returns_wrong_bytes(
    daemon_factory: Callable[..., DaemonProcess], transport: str
) -> None:
    """A writer keeps the tiny arena evicting while readers fetch blocks that may vanish meanwhile."""
    daemon = daemon_factory(
        "--dram-capacity", "4MiB", "--slab-size", "1MiB", *offering(transport)
    )  # 64 slots of 64 KiB
    written: list[BlockKey] = []
    stop = threading.Event()
    seen = {"ok": 0, "missing": 0}
    wrong: list[str] = []

    def writer() -> None:
        with connect(daemon, transport) as c:
            while not stop.is_set():
                keys = new_keys(8)
                c.put(keys, [pattern(k, 64 * KiB) for k in keys])
                written.extend(keys)

    def reader() -> None:
        with connect(daemon, transport) as c:
            while not stop.is_set():
                if len(written) < 80:
                    time.sleep(0.001)
                    continue
                keys = written[-80:][::5]  # recent ones: some still there, some being evicted
                got = c.get(keys, [bytearray(64 * KiB) for _ in keys])
                for key, status, buffer in zip(keys, got.statuses, got.buffers, strict=True):
                    if status is OK and bytes(buffer) != pattern(key, 64 * KiB):
                        wrong.append(key.hash.hex())
                    seen["ok" if status is OK else "missing"] += 1

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:  # until the race has really happened, many times over
        wait_until(lambda: dict(seen), lambda now: min(now.values()) >= RACED_READS, "reads of both outcomes", 60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not wrong, f"{len(wrong)} gets returned bytes of another block"


def test_shm_rereads_copy_known_locations_until_a_block_goes(node: DaemonProcess) -> None:
    """Blocks read once are read again without a LOCATE; one deleted by another client is a miss at once."""
    keys = new_keys(4)
    with connect(node, "shm", location_ttl_s=30.0) as reader, connect(node, "tcp") as other:
        assert reader.put(keys, [pattern(k, 64 * KiB) for k in keys]).stored == len(keys)

        def locates() -> int:
            return int(reader.stats(node.address).counters["requests_locate"])

        reader.get(keys)
        before = locates()
        for _ in range(5):
            got = reader.get(keys, [bytearray(64 * KiB) for _ in keys])
            assert got.statuses == (OK,) * 4 and [bytes(b) for b in got.buffers] == [pattern(k, 64 * KiB) for k in keys]
        assert locates() == before, "re-reads asked the node"
        assert other.delete(keys[:1]) == [True]
        got = reader.get(keys)
        assert got.statuses == (NOT_FOUND, OK, OK, OK), got.statuses
        assert locates() == before + 1, "the deleted block's location was not trusted"


def test_shm_rereads_stop_once_a_dead_node_stops_beating(daemon_factory: Callable[..., DaemonProcess]) -> None:
    """Blocks whose locations a same-node client knows are copied without a connection while the
    node's heartbeat vouches for it. Killed, it stops beating: until the beat limit the bytes read
    are still the right ones (the arena outlives the process), after it the keys fail over and the
    breaker opens, however long the locations would still be kept."""
    daemon = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB")
    keys = new_keys(4)
    blocks = [pattern(k, 64 * KiB) for k in keys]
    with connect(daemon, "shm", location_ttl_s=30.0) as c:
        assert c.put(keys, blocks).stored == len(keys)
        assert c.get(keys).ok  # learns where the blocks lie
        daemon.stop(signal.SIGKILL)
        wrong: list[int] = []

        def read() -> tuple[ErrorCode, ...]:
            got = c.get(keys)
            wrong.extend(i for i, view in enumerate(got.buffers) if view is not None and bytes(view) != blocks[i])
            return got.statuses

        statuses = wait_until(read, lambda s: ErrorCode.OK not in s, "gets from the killed node to fail over")
        assert set(statuses) <= NODE_DOWN and not wrong, (statuses, wrong)
        assert c.breaker.state(daemon.address) is CircuitState.OPEN


def test_a_planned_get_from_a_killed_node_leaves_the_buffers_as_they_were(
    daemon_factory: Callable[..., DaemonProcess],
) -> None:
    """Two namespaces make a batch the plan's, which takes a connection before it copies a block:
    a node killed before the get fails every key and writes into no buffer (an engine may reuse
    the pages of a failed load), however fresh its heartbeat still is."""
    daemon = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB")
    keys = new_keys(2) + new_keys(2)
    with connect(daemon, "shm", request_timeout_s=2.0, connect_timeout_s=1.0) as c:
        assert c.put(keys, [pattern(k, 64 * KiB) for k in keys]).stored == len(keys)
        assert c.get(keys[:1]).ok and c.get(keys[2:3]).ok  # connections and limits known
        daemon.stop(signal.SIGKILL)
        into = [bytearray(b"\xee" * (64 * KiB)) for _ in keys]
        got = c.get(keys, into)
        assert set(got.statuses) <= NODE_DOWN, got
        touched = [i for i, buffer in enumerate(into) if buffer != b"\xee" * (64 * KiB)]
        assert not touched, f"a failed load wrote into buffers {touched}: {got.statuses}"


def test_a_daemon_killed_mid_batch_fails_keys_never_with_wrong_bytes(
    daemon_factory: Callable[..., DaemonProcess], transport: str
) -> None:
    daemon = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", *offering(transport))
    keys = new_keys(32)
    blocks = [pattern(k, 256 * KiB) for k in keys]
    outcomes: list[tuple[ErrorCode, ...]] = []
    wrong: list[int] = []
    with connect(daemon, transport, request_timeout_s=2.0) as c:
        assert c.put(keys, blocks).stored == 32

        def read() -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                got = c.get(keys, [bytearray(256 * KiB) for _ in keys])
                outcomes.append(got.statuses)
                wrong.extend(
                    i
                    for i, (s, b) in enumerate(zip(got.statuses, got.buffers, strict=True))
                    if s is OK and bytes(b) != blocks[i]
                )
                if all(s in NODE_DOWN for s in got.statuses):
                    return

        reader = threading.Thread(target=read)
        reader.start()
        wait_until(
            lambda: list(outcomes), lambda done: len(done) >= 2 or not reader.is_alive(), "the reader's first gets"
        )
        daemon.stop(signal.SIGKILL)  # the reader is in its loop of gets: one is in flight
        reader.join(15)
        assert not wrong, f"keys {wrong[:5]} came back with wrong bytes"
        assert outcomes and outcomes[0] == (OK,) * 32
        assert set(outcomes[-1]) <= NODE_DOWN, outcomes[-1]
        assert set(c.get(keys[:1]).statuses) <= NODE_DOWN


# -- ucx traps ---------------------------------------------------------------------------------

_PENDING_AT_EXIT = """
import os, sys, threading, time
from kvpool_client import BlockKey, ClientConfig, KVPoolClient
client = KVPoolClient(config=ClientConfig(nodes=(sys.argv[1],), transport="ucx", request_timeout_s=30.0))
keys = [BlockKey("exit@u8@raw", os.urandom(32)) for _ in range(8)]
assert client.put(keys, [os.urandom(256 << 10) for _ in keys]).stored == 8
print("ready", flush=True)
sys.stdin.readline()  # the daemon is stopped now: the next get cannot finish
threading.Thread(target=client.get, args=(keys,), daemon=True).start()
time.sleep(0.5)
print("exiting", flush=True)
"""  # exits without closing the client, with its get still posted

_FORKED = """
import os, sys
from kvpool_client import BlockKey, ClientConfig, KVPoolClient
client = KVPoolClient(config=ClientConfig(nodes=(sys.argv[1],), transport="ucx"))
keys = [BlockKey("fork@u8@raw", os.urandom(32)) for _ in range(4)]
assert client.put(keys, [os.urandom(64 << 10) for _ in keys]).stored == 4
pid = os.fork()
if pid == 0:  # a forked child cannot use the parent's UCX worker: it must refuse, and exit normally
    print("child", sorted({s.name for s in client.get(keys).statuses}), flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print("child status", status, flush=True)
print("parent ok", client.get(keys).ok, flush=True)
"""


def run_script(source: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", source, *args], text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


@needs_ucx
def test_ucx_client_exits_with_a_request_pending(daemon_factory: Callable[..., DaemonProcess]) -> None:
    """A process may exit while a ucx get waits on a stopped daemon: no hang, no crash, the daemon goes on."""
    daemon = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", *ucx_flags())
    child = run_script(_PENDING_AT_EXIT, daemon.address, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    os.kill(daemon.process.pid, signal.SIGSTOP)
    try:
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "exiting"
        assert child.wait(15) == 0
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    with connect(daemon, "ucx") as c:
        keys = new_keys(2)
        assert c.put(keys, [pattern(k, 64 * KiB) for k in keys]).stored == 2
        assert c.get(keys).ok
    assert "connection handler failed" not in daemon.log()


@needs_ucx
def test_ucx_in_a_forked_child_refuses_and_the_parent_survives(node: DaemonProcess) -> None:
    process = run_script(_FORKED, node.address, stdout=subprocess.PIPE)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert "child ['UNAVAILABLE']" in out and "child status 0" in out and "parent ok True" in out


@needs_ucx
def test_ucx_daemon_restarts_on_the_same_ports_and_clients_reconnect(
    daemon_factory: Callable[..., DaemonProcess],
) -> None:
    """Connections the daemon closed leave its ports in TIME_WAIT: a restart must still bind them."""
    # Below the ephemeral range: an outgoing connection cannot take a port while the daemon is down.
    grpc, data, ucx = (free_port() for _ in range(3))
    flags = (
        "--grpc-port",
        str(grpc),
        "--data-port",
        str(data),
        "--ucx-port",
        str(ucx),
        "--dram-capacity",
        "16MiB",
        "--slab-size",
        "1MiB",
    )
    first = daemon_factory(*flags)
    keys = new_keys(4)
    with connect(first, "ucx") as c:
        assert c.put(keys, [pattern(k, 128 * KiB) for k in keys]).stored == 4
        assert c.get(keys).ok  # a pooled connection stays open across the restart
        first.stop(signal.SIGTERM)
        second = daemon_factory(*flags)
        assert c.server_info(second.address).data_endpoints["ucx"] == f"127.0.0.1:{ucx}"
        deadline = time.monotonic() + 10
        while (
            stored := c.put(keys, [pattern(k, 128 * KiB) for k in keys]).stored
        ) != 4 and time.monotonic() < deadline:
            time.sleep(0.2)  # the breaker lets a probe through after the first failure
        assert stored == 4 and c.get(keys).ok and c.transport(second.address) == "ucx"
