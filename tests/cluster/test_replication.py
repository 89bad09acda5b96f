"""Replication and failover against real daemons with a static node list (no etcd).

Three daemons, R=2 or 3: kill -9 one and every block is still readable, at once;
SIGSTOP one and clients time out, fail over, and use it again after SIGCONT; puts
meet their quorum without a dead node and say where each key went; a draining
node's writes go to the next node. Both clients.
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import time
from collections.abc import Iterator, Sequence

import grpc
import numpy as np
import pytest

from kvpool_client import AsyncKVPoolClient, BlockKey, ClientConfig, ErrorCode, KVPoolClient, NodeUnavailable
from kvpool_client.breaker import CircuitBreaker, CircuitState
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from tests.support.clock import FakeClock
from tests.support.daemon import DaemonProcess, LocalCluster
from tests.support.stopping import pause

pytestmark = pytest.mark.integration

DAEMON_ARGS = ("--dram-capacity", "64MiB", "--slab-size", "1MiB", "--no-prefault-arena")
BLOCK = 16 << 10
COUNT = 48
OK = ErrorCode.OK


@pytest.fixture
def trio() -> Iterator[LocalCluster]:
    """Three standalone daemons; stopped ones are continued and killed ones' arenas removed at teardown."""
    cluster = LocalCluster(3, *DAEMON_ARGS, with_etcd=False)
    try:
        yield cluster
    finally:
        release(cluster.daemons)
        cluster.stop()


def release(daemons: Sequence[DaemonProcess]) -> None:
    """SIGCONT every daemon (a stopped one cannot handle SIGTERM) and remove arenas of killed ones."""
    for daemon in daemons:
        if daemon.process.poll() is None:
            daemon.process.send_signal(signal.SIGCONT)
        elif daemon.process.returncode == -signal.SIGKILL:
            for path in glob.glob(f"/dev/shm/kvpool-{daemon.process.pid}-*"):
                os.unlink(path)


def kill(daemon: DaemonProcess) -> None:
    daemon.process.kill()
    daemon.process.wait(5)


def new_keys(count: int = COUNT) -> list[BlockKey]:
    ns = f"repl-{os.urandom(4).hex()}@fp16@L2@tp0of1"
    return [BlockKey(ns, os.urandom(32)) for _ in range(count)]


def pattern(key: BlockKey) -> bytes:
    """Bytes determined by the key, so any reader can check any block."""
    rng = np.random.default_rng(int.from_bytes(key.hash[:8], "little"))
    return rng.integers(0, 256, BLOCK, dtype=np.uint8).tobytes()


def config_for(cluster: LocalCluster, **settings: object) -> ClientConfig:
    return ClientConfig(nodes=tuple(cluster.addresses), **settings)  # type: ignore[arg-type]


def assert_all_read(statuses: Sequence[ErrorCode], buffers: Sequence[memoryview | None], keys: list[BlockKey]) -> None:
    assert list(statuses) == [OK] * len(keys), [(i, s.name) for i, s in enumerate(statuses) if s is not OK]
    wrong = [i for i, (k, b) in enumerate(zip(keys, buffers, strict=True)) if b is None or bytes(b) != pattern(k)]
    assert not wrong, f"wrong bytes for keys {wrong}"


def first_readers(client: KVPoolClient, keys: list[BlockKey]) -> list[str]:
    router = client.placement().router
    return [router.placement(k).read_order[0].node_id for k in keys]


def counter(client: KVPoolClient, daemon: DaemonProcess, name: str) -> int:
    return dict(client.stats(daemon.address).counters).get(name, 0)


def reads_served(client: KVPoolClient, daemon: DaemonProcess) -> int:
    """Reads over TCP (GET) plus reads a same-node client copied itself (LOCATE)."""
    return counter(client, daemon, "requests_get") + counter(client, daemon, "requests_locate")


def set_state(daemon: DaemonProcess, state: str) -> None:
    with grpc.insecure_channel(daemon.address) as channel:
        kvpool_pb2_grpc.KVPoolStub(channel).SetState(pb.SetStateRequest(state=state), timeout=5)


# -- blocking client ------------------------------------------------------------------------------


def test_kill_nine_loses_no_block_and_the_first_read_fails_over_at_once(trio: LocalCluster) -> None:
    keys = new_keys()
    with KVPoolClient(config=config_for(trio, replicas=2, write_quorum=2)) as client:
        put = client.put(keys, [pattern(k) for k in keys])
        assert put.ok and all(len(nodes) == 2 for nodes in put.stored_on), put.stored_on
        warm = client.get(keys)  # pooled connections to every node, as in steady state
        assert_all_read(warm.statuses, warm.buffers, keys)
        victim = trio.daemons[0]
        led = first_readers(client, keys).count(victim.address)
        assert led > 0, "the test needs keys whose first reader is the victim"
        kill(victim)
        started = time.monotonic()
        got = client.get(keys)
        elapsed = time.monotonic() - started
        assert_all_read(got.statuses, got.buffers, keys)
        assert elapsed < 1.0, f"first read after kill -9 took {elapsed:.2f}s ({led} keys failed over)"
        assert client.breaker.state(victim.address) is CircuitState.OPEN
        assert client.exists(keys) == [True] * len(keys)
        assert client.lookup(keys) == len(keys)
        again = client.get(keys)
        assert_all_read(again.statuses, again.buffers, keys)


# Every get asks its node: a same-node client would go on copying blocks it read before out of
# a stopped daemon's arena (still the right bytes) without noticing the hang.
# The timeout is long enough that a loaded machine does not hit it on a live node (a timeout
# before the SIGSTOP opens the breaker early and the hung get then skips the node at once).
HUNG_TIMEOUT_S = 2.0
HUNG_NODE_SETTINGS = {
    "replicas": 2,
    "request_timeout_s": HUNG_TIMEOUT_S,
    "connect_timeout_s": HUNG_TIMEOUT_S,
    "location_ttl_s": 0.0,
}
BACKOFF_PASSED_S = 0.6  # past the breaker's first back-off (at most 0.5 s): the next request probes the node


def breaker_on(clock: FakeClock, config: ClientConfig) -> CircuitBreaker:
    """The client's breaker on a clock the test moves: a back-off passes when the test says so."""
    return CircuitBreaker(clock, probe_timeout_s=config.probe_timeout_s)


def test_sigstop_times_out_fails_over_and_sigcont_brings_the_node_back(trio: LocalCluster) -> None:
    keys = new_keys()
    config, clock = config_for(trio, **HUNG_NODE_SETTINGS), FakeClock()
    with KVPoolClient(config=config, breaker=breaker_on(clock, config)) as client:
        assert client.put(keys, [pattern(k) for k in keys]).ok
        assert client.get(keys).ok
        victim = trio.daemons[1]
        assert victim.address in first_readers(client, keys)
        pause(victim.process)
        started = time.monotonic()
        hung = client.get(keys)
        elapsed = time.monotonic() - started
        assert_all_read(hung.statuses, hung.buffers, keys)
        assert HUNG_TIMEOUT_S - 0.1 <= elapsed < HUNG_TIMEOUT_S + 1.5, (
            f"a hung node should cost one request timeout ({HUNG_TIMEOUT_S} s), took {elapsed:.2f}s"
        )
        assert client.breaker.state(victim.address) is CircuitState.OPEN
        started = time.monotonic()
        skipped = client.get(keys)
        assert_all_read(skipped.statuses, skipped.buffers, keys)
        assert time.monotonic() - started < HUNG_TIMEOUT_S / 2, "an open circuit must skip the hung node"

        victim.process.send_signal(signal.SIGCONT)
        clock.advance(BACKOFF_PASSED_S)
        before = reads_served(client, victim)
        back = client.get(keys)
        assert_all_read(back.statuses, back.buffers, keys)
        assert client.breaker.state(victim.address) is CircuitState.CLOSED
        assert reads_served(client, victim) > before, "the resumed node must serve reads again"


def test_quorum_two_of_three_with_a_dead_node_reports_where_keys_went(trio: LocalCluster) -> None:
    dead = trio.daemons[2]
    kill(dead)
    live = {d.address for d in trio.daemons[:2]}
    keys = new_keys()
    with KVPoolClient(config=config_for(trio, replicas=3, write_quorum=2, request_timeout_s=2.0)) as client:
        put = client.put(keys, [pattern(k) for k in keys])
        assert put.ok, put.failures()
        assert put.statuses == (OK,) * len(keys)
        assert all(set(nodes) == live for nodes in put.stored_on), put.stored_on
        got = client.get(keys)
        assert_all_read(got.statuses, got.buffers, keys)
    strict_keys = new_keys(8)
    with KVPoolClient(config=config_for(trio, replicas=3, write_quorum=3)) as strict:
        below = strict.put(strict_keys, [pattern(k) for k in strict_keys])
        assert not below.ok and below.statuses == (ErrorCode.UNAVAILABLE,) * 8, below.statuses
        assert all(set(nodes) == live for nodes in below.stored_on), "stored where it could be, and said so"
        with pytest.raises(NodeUnavailable):
            below.raise_for_errors()


def test_a_draining_node_takes_no_writes_and_keeps_serving_reads(trio: LocalCluster) -> None:
    drained = trio.daemons[0]
    old_keys, new = new_keys(), new_keys()
    # location_ttl_s 0: every get asks its node (none reads a same-node shared index), so the node counts it.
    with KVPoolClient(config=config_for(trio, replicas=2, write_quorum=2, location_ttl_s=0.0)) as client:
        before = client.put(old_keys, [pattern(k) for k in old_keys])
        held = [k for k, nodes in zip(old_keys, before.stored_on, strict=True) if drained.address in nodes]
        assert held and before.ok
        set_state(drained, "draining")
        written = counter(client, drained, "dram_blocks_written")
        put = client.put(new, [pattern(k) for k in new])
        assert put.ok and all(len(n) == 2 and drained.address not in n for n in put.stored_on), put.stored_on
        assert counter(client, drained, "dram_blocks_written") == written, "a write landed on a draining node"
        got = client.get(old_keys)
        assert_all_read(got.statuses, got.buffers, old_keys)
        assert reads_served(client, drained) > 0, "the draining node still serves its blocks"
        set_state(drained, "active")


def test_one_key_puts_to_a_draining_owner_go_to_the_next_node(trio: LocalCluster) -> None:
    drained = trio.daemons[0]
    with KVPoolClient(config=config_for(trio, replicas=1)) as client:
        keys = new_keys()
        first = [client.put([k], [pattern(k)]) for k in keys]  # one exchange each, the node's limits known
        mine = [k for k, r in zip(keys, first, strict=True) if r.stored_on == ((drained.address,),)]
        assert mine and all(r.ok for r in first), [r.statuses for r in first]
        set_state(drained, "draining")
        again = new_keys()
        owned = [k for k in again if client.placement().router.placement(k).write_owners[0].address == drained.address]
        assert owned, "the static node list still places keys on the draining node"
        written = counter(client, drained, "dram_blocks_written")
        puts = [client.put([k], [pattern(k)]) for k in owned]
        assert all(r.ok and len(r.stored_on[0]) == 1 and drained.address not in r.stored_on[0] for r in puts), puts
        assert counter(client, drained, "dram_blocks_written") == written, "a write landed on a draining node"
        set_state(drained, "active")
    for address in {r.stored_on[0][0] for r in puts}:  # a static list does not know the owner drained: ask the node
        there = [k for k, r in zip(owned, puts, strict=True) if r.stored_on[0][0] == address]
        with KVPoolClient(config=ClientConfig(nodes=(address,))) as reader:
            got = reader.get(there)
            assert_all_read(got.statuses, got.buffers, there)


def test_delete_removes_every_copy(trio: LocalCluster) -> None:
    keys = new_keys(12)
    with KVPoolClient(config=config_for(trio, replicas=2)) as client:
        assert client.put(keys, [pattern(k) for k in keys]).ok
        assert client.delete(keys) == [True] * len(keys)
        assert client.exists(keys) == [False] * len(keys), "a copy survived on the second replica"
        assert client.get(keys).statuses == (ErrorCode.NOT_FOUND,) * len(keys)


# -- asyncio client -------------------------------------------------------------------------------


def test_async_client_kill_nine_failover_and_quorum(trio: LocalCluster) -> None:
    keys = new_keys()

    async def scenario() -> None:
        async with AsyncKVPoolClient(config=config_for(trio, replicas=3, write_quorum=2)) as client:
            put = await client.put(keys, [pattern(k) for k in keys])
            assert put.ok and all(len(n) == 3 for n in put.stored_on)
            assert (await client.get(keys)).ok
            victim = trio.daemons[0]
            kill(victim)
            started = time.monotonic()
            got = await client.get(keys)
            elapsed = time.monotonic() - started
            assert_all_read(got.statuses, got.buffers, keys)
            assert elapsed < 1.0, f"first async read after kill -9 took {elapsed:.2f}s"
            assert client.breaker.state(victim.address) is CircuitState.OPEN
            fresh = new_keys(16)
            after = await client.put(fresh, [pattern(k) for k in fresh])
            live = {d.address for d in trio.daemons[1:]}
            assert after.ok and all(set(n) == live for n in after.stored_on), after.stored_on
            assert await client.lookup(fresh) == len(fresh)
            assert await client.exists(fresh) == [True] * len(fresh)

    asyncio.run(scenario())


def test_async_client_sigstop_times_out_and_fails_over(trio: LocalCluster) -> None:
    keys = new_keys()

    async def scenario() -> None:
        config, clock = config_for(trio, **HUNG_NODE_SETTINGS), FakeClock()
        async with AsyncKVPoolClient(config=config, breaker=breaker_on(clock, config)) as client:
            assert (await client.put(keys, [pattern(k) for k in keys])).ok
            assert (await client.get(keys)).ok
            victim = trio.daemons[2]
            assert client.breaker.state(victim.address) is CircuitState.CLOSED, "opened before the SIGSTOP"
            pause(victim.process)
            started = time.monotonic()
            got = await client.get(keys)
            elapsed = time.monotonic() - started
            assert_all_read(got.statuses, got.buffers, keys)
            assert HUNG_TIMEOUT_S - 0.1 <= elapsed < HUNG_TIMEOUT_S + 1.5, f"took {elapsed:.2f}s"
            assert client.breaker.state(victim.address) is CircuitState.OPEN
            victim.process.send_signal(signal.SIGCONT)
            clock.advance(BACKOFF_PASSED_S)
            back = await client.get(keys)
            assert_all_read(back.statuses, back.buffers, keys)
            assert client.breaker.state(victim.address) is CircuitState.CLOSED

    asyncio.run(scenario())
