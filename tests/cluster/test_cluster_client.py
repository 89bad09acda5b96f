"""Clients that take their nodes from etcd: real etcd, real daemons registering themselves.

The client follows the membership live: it places keys over the active nodes it
sees, drops a killed node once its lease expires (and before that, skips it at
once by its circuit breaker), stops writing to a draining node while still reading
from it, writes to a node that joins, and keeps working through an etcd outage.
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence

import grpc
import numpy as np
import pytest

from kvpool_client import AsyncKVPoolClient, BlockKey, ClientConfig, ErrorCode, KVPoolClient
from kvpool_client.core.membership.records import NodeState
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.placement_source import Placement
from tests.support.daemon import DaemonProcess, LocalCluster
from tests.support.etcd import requires_etcd

pytestmark = [pytest.mark.integration, requires_etcd]

LEASE_TTL_S = 2
DAEMON_ARGS = (
    "--dram-capacity", "64MiB", "--slab-size", "1MiB", "--no-prefault-arena", "--lease-ttl-s", str(LEASE_TTL_S),
)  # fmt: skip
BLOCK = 8 << 10
OK = ErrorCode.OK


@pytest.fixture
def pool() -> Iterator[LocalCluster]:
    """etcd and three daemons registered in it; killed daemons' arenas are removed at teardown."""
    cluster = LocalCluster(3, *DAEMON_ARGS, cluster=f"c{os.urandom(3).hex()}")
    try:
        yield cluster
    finally:
        for daemon in cluster.daemons:
            if daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGCONT)
            else:
                for path in glob.glob(f"/dev/shm/kvpool-{daemon.process.pid}-*"):
                    os.unlink(path)
        cluster.stop()


def config_for(cluster: LocalCluster, **settings: object) -> ClientConfig:
    return ClientConfig(etcd_endpoints=cluster.etcd_endpoints, cluster=cluster.cluster, **settings)  # type: ignore[arg-type]


def new_keys(count: int = 40) -> list[BlockKey]:
    ns = f"cl-{os.urandom(4).hex()}@fp16@L2@tp0of1"
    return [BlockKey(ns, os.urandom(32)) for _ in range(count)]


def pattern(key: BlockKey) -> bytes:
    rng = np.random.default_rng(int.from_bytes(key.hash[:8], "little"))
    return rng.integers(0, 256, BLOCK, dtype=np.uint8).tobytes()


def states(placement: Placement) -> dict[str, NodeState]:
    return {m.node_id: m.state for m in placement.router.members()}


def active(*node_ids: str) -> Callable[[Placement], bool]:
    return lambda p: states(p) == {n: NodeState.ACTIVE for n in node_ids}


def eventually(read: Callable[[], Placement], check: Callable[[Placement], bool], timeout_s: float) -> float:
    """Poll until ``check(read())``; returns the seconds it took."""
    start = time.monotonic()
    while not check(read()):
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"placement never matched; last members: {states(read())}")
        time.sleep(0.05)
    return time.monotonic() - start


def assert_all_read(statuses: Sequence[ErrorCode], buffers: Sequence[memoryview | None], keys: list[BlockKey]) -> None:
    assert list(statuses) == [OK] * len(keys), [(i, s.name) for i, s in enumerate(statuses) if s is not OK]
    assert all(b is not None and bytes(b) == pattern(k) for k, b in zip(keys, buffers, strict=True)), "wrong bytes"


def set_state(daemon: DaemonProcess, state: str) -> None:
    with grpc.insecure_channel(daemon.address) as channel:
        kvpool_pb2_grpc.KVPoolStub(channel).SetState(pb.SetStateRequest(state=state), timeout=5)


def written(client: KVPoolClient, daemon: DaemonProcess) -> int:
    return dict(client.stats(daemon.address).counters).get("dram_blocks_written", 0)


def test_client_follows_etcd_and_rides_through_a_kill(pool: LocalCluster) -> None:
    ids = [d.node_id for d in pool.daemons]
    with KVPoolClient(config=config_for(pool, replicas=2, write_quorum=2, request_timeout_s=1.0)) as client:
        eventually(client.placement, active(*ids), 10)
        assert client.placement().write_quorum == 2
        keys = new_keys()
        put = client.put(keys, [pattern(k) for k in keys])
        addresses = {d.address for d in pool.daemons}  # stored_on names addresses, with etcd as without
        assert put.ok and all(len(n) == 2 and set(n) <= addresses for n in put.stored_on), put.stored_on
        assert client.get(keys).ok
        victim = pool.daemons[0]
        victim.process.kill()
        victim.process.wait(5)
        killed = time.monotonic()
        got = client.get(keys)
        assert time.monotonic() - killed < 1.0, "the first read after the kill must not wait for the lease"
        assert_all_read(got.statuses, got.buffers, keys)
        # The lease expires and the membership drops the node: new writes go to the two left.
        eventually(client.placement, active(*ids[1:]), LEASE_TTL_S + 3)
        left = time.monotonic() - killed
        assert left <= LEASE_TTL_S + 1.5, f"the dead node left the client's membership {left:.1f}s after the kill"
        fresh = new_keys(16)
        after = client.put(fresh, [pattern(k) for k in fresh])
        survivors = {d.address for d in pool.daemons[1:]}
        assert after.ok and all(set(n) == survivors for n in after.stored_on), after.stored_on
        got = client.get(keys)
        assert_all_read(got.statuses, got.buffers, keys)
        # Restarted under the same id (on new ports), it rejoins and takes writes again.
        reborn = pool.add_daemon(*DAEMON_ARGS, node_id=victim.node_id)
        eventually(client.placement, active(*ids), 10)
        rejoined = new_keys(40)
        put = client.put(rejoined, [pattern(k) for k in rejoined])
        assert put.ok and any(reborn.address in n for n in put.stored_on), put.stored_on
        got = client.get(rejoined)
        assert_all_read(got.statuses, got.buffers, rejoined)


def test_drain_and_join_follow_the_membership(pool: LocalCluster) -> None:
    ids = [d.node_id for d in pool.daemons]
    drained = pool.daemons[1]
    with KVPoolClient(config=config_for(pool, replicas=2)) as client:
        eventually(client.placement, active(*ids), 10)
        old = new_keys()
        before = client.put(old, [pattern(k) for k in old])
        assert any(drained.address in n for n in before.stored_on), before.stored_on
        set_state(drained, "draining")
        eventually(client.placement, lambda p: states(p).get(drained.node_id) == NodeState.DRAINING, 5)
        count = written(client, drained)
        fresh = new_keys()
        put = client.put(fresh, [pattern(k) for k in fresh])
        assert put.ok and all(drained.address not in n and len(n) == 2 for n in put.stored_on), put.stored_on
        assert written(client, drained) == count, "no write may land on a draining node"
        got = client.get(old)
        assert_all_read(got.statuses, got.buffers, old)  # its blocks stay readable while it drains

        joined = pool.add_daemon(*DAEMON_ARGS, node_id="node-new")
        eventually(client.placement, lambda p: states(p).get("node-new") == NodeState.ACTIVE, 10)
        more = new_keys(60)
        put = client.put(more, [pattern(k) for k in more])
        landed = sum(joined.address in n for n in put.stored_on)
        assert put.ok and 0 < landed < len(more), f"{landed} of {len(more)} keys on the new node"


def test_client_keeps_the_membership_through_an_etcd_outage(pool: LocalCluster) -> None:
    ids = [d.node_id for d in pool.daemons]
    assert pool.etcd is not None
    with KVPoolClient(config=config_for(pool, replicas=2, request_timeout_s=1.0)) as client:
        eventually(client.placement, active(*ids), 10)
        pool.etcd.stop()
        keys = new_keys()
        put = client.put(keys, [pattern(k) for k in keys])
        assert put.ok and all(len(n) == 2 for n in put.stored_on), "the last membership must still place keys"
        got = client.get(keys)
        assert_all_read(got.statuses, got.buffers, keys)
        pool.etcd.start()
        set_state(pool.daemons[2], "draining")  # published once the daemon's registration reconnects
        eventually(client.placement, lambda p: states(p).get(ids[2]) == NodeState.DRAINING, 15)


def test_async_client_follows_etcd_and_fails_over(pool: LocalCluster) -> None:
    ids = [d.node_id for d in pool.daemons]

    async def scenario() -> None:
        async with AsyncKVPoolClient(config=config_for(pool, replicas=2, write_quorum=2)) as client:
            deadline = time.monotonic() + 10
            while not active(*ids)(await client.placement()):
                assert time.monotonic() < deadline, states(await client.placement())
                await asyncio.sleep(0.05)
            keys = new_keys()
            put = await client.put(keys, [pattern(k) for k in keys])
            addresses = {d.address for d in pool.daemons}
            assert put.ok and all(len(n) == 2 and set(n) <= addresses for n in put.stored_on), put.stored_on
            victim = pool.daemons[2]
            victim.process.kill()
            victim.process.wait(5)
            killed = time.monotonic()
            got = await client.get(keys)
            assert time.monotonic() - killed < 1.0
            assert_all_read(got.statuses, got.buffers, keys)
            assert await client.lookup(keys) == len(keys)

    asyncio.run(scenario())
