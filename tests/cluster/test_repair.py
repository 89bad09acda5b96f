"""Re-replication against real daemons registered in a real etcd, on loopback.

A join moves ownership and the new owner gets copies of exactly the blocks it owns
(and nobody gets a block it already has); a node restarted empty under its old id is
refilled by the nodes that still hold its blocks; a daemon stopped in the middle of a
repair exits cleanly. A block the new owner refuses (over its block limit) fails alone,
and one another writer is still storing there is not taken as stored: the run fails
and is retried until the owner holds it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvpool_client import BlockKey, ClientConfig, ErrorCode, KVPoolClient
from kvpool_client.core.membership.cluster import update_config
from kvpool_client.core.membership.etcd import EtcdStore
from kvpool_client.core.membership.records import ClusterConfig, NodeState
from kvpool_client.core.wire import PutRequest, encode
from tests.support.daemon import DaemonProcess, LocalCluster, start_daemon
from tests.support.etcd import requires_etcd
from tests.support.rawwire import RawConnection
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, requires_etcd]

BLOCK = 16 << 10
COUNT = 96
WAIT_S = 15.0


@pytest.fixture
def shm() -> Iterator[Path]:
    """A private arena directory, so a killed daemon's arena is removed with it."""
    path = Path(tempfile.mkdtemp(prefix="kvrepair-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def flags(shm: Path, *extra: str) -> tuple[str, ...]:
    return ("--dram-capacity", "32MiB", "--slab-size", "1MiB", "--no-prefault-arena", "--lease-ttl-s", "3",
            "--shm-dir", str(shm), "--metrics-port", "-1", "--repair-settle-s", "0.3", *extra)  # fmt: skip


@pytest.fixture
def pool(shm: Path) -> Iterator[Callable[..., LocalCluster]]:
    """An etcd whose cluster config says R=2, then ``size`` daemons registered in it; all stopped at teardown."""
    clusters: list[LocalCluster] = []

    def start(size: int, *extra: str) -> LocalCluster:
        cluster = LocalCluster(0)
        clusters.append(cluster)
        assert cluster.etcd is not None
        asyncio.run(set_replicas(cluster.etcd.endpoint, cluster.cluster, 2))
        for index in range(size):
            cluster.add_daemon(*flags(shm, *extra), node_id=f"node-{index}")
        return cluster

    yield start
    for cluster in clusters:
        cluster.stop()


async def set_replicas(endpoint: str, cluster: str, replicas: int) -> None:
    """The cluster config every daemon's repair reads its replica count from."""
    async with EtcdStore(endpoint) as store:
        await update_config(store, cluster, lambda _: ClusterConfig(replicas=replicas, write_quorum=replicas))


def members(client: KVPoolClient) -> list[str]:
    """The active nodes the client places over (a joining node is listed, but owns nothing yet)."""
    return sorted(m.node_id for m in client.placement().router.members() if m.state is NodeState.ACTIVE)


def wait_members(client: KVPoolClient, want: list[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while members(client) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    assert members(client) == want


def new_blocks(count: int = COUNT) -> tuple[list[BlockKey], list[bytes]]:
    ns = f"repair-{os.urandom(4).hex()}@u8"
    keys = [BlockKey(ns, os.urandom(32)) for _ in range(count)]
    return keys, [os.urandom(BLOCK) for _ in keys]


def owned_by(client: KVPoolClient, keys: list[BlockKey], node_id: str) -> list[BlockKey]:
    """The keys whose write owners include ``node_id`` under the client's current placement."""
    router = client.placement().router
    return [k for k in keys if node_id in {m.node_id for m in router.placement(k).write_owners}]


def held_by(daemon: DaemonProcess, keys: list[BlockKey]) -> list[BlockKey]:
    """The keys the daemon itself stores (asked alone, not through the placement)."""
    with KVPoolClient(config=ClientConfig(nodes=(daemon.address,))) as alone:
        return [k for k, held in zip(keys, alone.exists(keys), strict=True) if held]


def wait_held(daemon: DaemonProcess, keys: list[BlockKey]) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(held_by(daemon, keys)) < len(keys) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(held_by(daemon, keys)) == len(keys), f"{daemon.node_id} holds {len(held_by(daemon, keys))}/{len(keys)}"


def counter(client: KVPoolClient, daemon: DaemonProcess, name: str) -> int:
    return dict(client.stats(daemon.address).counters).get(name, 0)


def cluster_client(cluster: LocalCluster) -> KVPoolClient:
    return KVPoolClient(config=ClientConfig(etcd_endpoints=cluster.etcd_endpoints, cluster=cluster.cluster,
                                            replicas=2, write_quorum=2, request_timeout_s=2.0))  # fmt: skip


def repaired_totals(
    client: KVPoolClient, daemons: list[DaemonProcess], nodes: int, names: tuple[str, ...]
) -> dict[str, int]:
    """The named counters summed over ``daemons``, once each has logged the end of a repair run over
    ``nodes`` active nodes: the run the last membership change caused. A copy it failed (BUSY: the
    other holder was storing the same block) was made by that holder, so a retry copies nothing."""
    wait_until(
        lambda: {d.node_id: len(repair_summaries(d, nodes)) for d in daemons},
        lambda runs: all(runs.values()),
        f"a repair over {nodes} nodes to end on every daemon (runs by node)",
        WAIT_S,
    )
    return {n: sum(counter(client, d, n) for d in daemons) for n in names}


@pytest.mark.timeout(90)
def test_a_join_copies_to_the_new_owner_exactly_what_it_owns(pool: Callable[..., LocalCluster], shm: Path) -> None:
    cluster = pool(3)
    with cluster_client(cluster) as client:
        wait_members(client, ["node-0", "node-1", "node-2"])
        keys, blocks = new_blocks()
        put = client.put(keys, blocks)
        assert put.ok and all(len(nodes) == 2 for nodes in put.stored_on), put.stored_on
        old = list(cluster.daemons)
        names = ("requests_put", "repair_copies", "repair_runs")
        before = repaired_totals(client, old, 3, names)
        holders = {d.node_id: held_by(d, keys) for d in old}

        joined = cluster.add_daemon(*flags(shm), node_id="node-3")
        wait_members(client, ["node-0", "node-1", "node-2", "node-3"])
        owned = owned_by(client, keys, "node-3")
        assert 0 < len(owned) < len(keys)
        wait_held(joined, owned)
        after = repaired_totals(client, old, 4, names)

        assert held_by(joined, keys) == owned, "a node gets copies only of the blocks it owns"
        assert after["requests_put"] == before["requests_put"], "no copy went to an owner that had the block"
        assert after["repair_copies"] - before["repair_copies"] == len(owned), "each missing block stored once"
        assert after["repair_runs"] > before["repair_runs"]
        assert {d.node_id: held_by(d, keys) for d in old} == holders, "former owners keep their copies"
        got = client.get(keys)
        assert got.statuses == tuple([ErrorCode.OK] * len(keys))
        assert [bytes(b or b"") for b in got.buffers] == blocks


@pytest.mark.timeout(90)
def test_an_owner_restarted_empty_under_its_id_is_refilled(pool: Callable[..., LocalCluster], shm: Path) -> None:
    cluster = pool(3)
    with cluster_client(cluster) as client:
        wait_members(client, ["node-0", "node-1", "node-2"])
        keys, blocks = new_blocks()
        assert client.put(keys, blocks).ok
        victim = cluster.daemons[0]
        owned = owned_by(client, keys, victim.node_id)
        assert owned and held_by(victim, keys) == owned

        # Back within its lease TTL: the membership never loses node-0, only its incarnation changes.
        victim.stop(signal.SIGKILL)
        assert cluster.etcd is not None
        restart = ("--node-id", victim.node_id, "--etcd-endpoints", cluster.etcd.endpoint, "--cluster", cluster.cluster,
                   "--grpc-port", str(victim.grpc_port), "--data-port", str(victim.data_port))  # fmt: skip
        cluster.daemons[0] = start_daemon(*restart, *flags(shm))
        victim.remove_files(str(shm))

        wait_held(cluster.daemons[0], owned)
        copied = sum(counter(client, d, "repair_copies") for d in cluster.daemons[1:])
        assert copied >= len(owned)
        assert any("repair done" in d.log() for d in cluster.daemons[1:]), "each run logs a summary"
        assert held_by(cluster.daemons[0], keys) == owned
        got = client.get(keys)
        assert [bytes(b or b"") for b in got.buffers] == blocks


@pytest.mark.timeout(90)
def test_a_daemon_stopped_in_the_middle_of_a_repair_exits_cleanly(pool: Callable[..., LocalCluster], shm: Path) -> None:
    # 64 KiB/s: the 2-node repair of 96 x 16 KiB blocks would take about 12 s.
    cluster = pool(1, "--repair-bandwidth", "64KiB")
    source = cluster.daemons[0]
    with cluster_client(cluster) as client:
        wait_members(client, ["node-0"])
        keys, blocks = new_blocks()
        with KVPoolClient(config=ClientConfig(nodes=(source.address,))) as alone:
            assert alone.put(keys, blocks).ok
        target = cluster.add_daemon(*flags(shm), node_id="node-1")
        deadline = time.monotonic() + WAIT_S
        while counter(client, source, "repair_copies") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0 < counter(client, source, "repair_copies") < len(keys), "the test needs a repair in progress"

        started = time.monotonic()
        code = source.stop(signal.SIGTERM)
        elapsed = time.monotonic() - started
        assert code == 0, source.log()[-3000:]
        assert elapsed < 5.0, f"shutdown took {elapsed:.1f}s"
        assert "repair cancelled" in source.log()
        assert len(held_by(target, keys)) < len(keys)


def repair_summaries(daemon: DaemonProcess, nodes: int) -> list[dict[str, int]]:
    """The numbers of each ``repair done`` line the daemon logged for a topology of ``nodes`` active nodes."""
    lines = [line for line in daemon.log().splitlines() if f"repair done nodes={nodes} " in line]
    return [{k: int(float(v)) for k, v in re.findall(r"(\w+)=([\d.]+)", line)} for line in lines]


@pytest.mark.timeout(90)
def test_a_block_over_the_new_owners_limit_fails_alone_and_the_rest_is_copied(
    pool: Callable[..., LocalCluster], shm: Path
) -> None:
    cluster = pool(1, "--repair-bandwidth", "0")
    source = cluster.daemons[0]
    keys, blocks = new_blocks()
    big = BlockKey(keys[0].namespace, os.urandom(32))
    with KVPoolClient(config=ClientConfig(nodes=(source.address,))) as alone:
        assert alone.put([big], [os.urandom(512 << 10)]).ok  # one slab here: 1 MiB
        assert alone.put(keys, blocks).ok
    owner = cluster.add_daemon(*flags(shm, "--slab-size", "256KiB", "--repair-bandwidth", "0"), node_id="node-1")

    wait_held(owner, keys)  # R=2 over two nodes: node-1 owns every block
    deadline = time.monotonic() + WAIT_S
    while len(repair_summaries(source, 2)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    runs = repair_summaries(source, 2)
    assert len(runs) >= 2, "a run that failed a block is retried"
    assert held_by(owner, [big]) == []
    assert all(run["failed"] == 1 for run in runs), runs
    assert [run["copies"] for run in runs] == [len(keys)] + [0] * (len(runs) - 1), "the first run copies the rest"
    assert all(run["bytes"] == run["copies"] * BLOCK for run in runs), "a block not sent is not counted"


@pytest.mark.timeout(90)
def test_a_block_another_writer_is_still_storing_is_retried_until_the_owner_holds_it(
    pool: Callable[..., LocalCluster], shm: Path
) -> None:
    cluster = pool(1, "--repair-settle-s", "1.5")
    source = cluster.daemons[0]
    keys, blocks = new_blocks(1)
    with KVPoolClient(config=ClientConfig(nodes=(source.address,))) as alone:
        assert alone.put(keys, blocks).ok
    owner = cluster.add_daemon(*flags(shm, "--repair-settle-s", "1.5"), node_id="node-1")
    with KVPoolClient(config=ClientConfig(nodes=(owner.address,))) as client:
        with RawConnection(owner.data_address) as writer:
            # Another client's put of the same block, stalled half way: the owner reserved the key.
            half = len(blocks[0]) // 2
            writer.send(encode(PutRequest(1, keys[0].namespace, [keys[0].hash], [len(blocks[0])])) + blocks[0][:half])
            assert client.put(keys, blocks).statuses == (ErrorCode.BUSY,), "the test needs the key reserved"
            deadline = time.monotonic() + WAIT_S
            while counter(client, source, "repair_failed") == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert counter(client, source, "repair_failed") == 1, "BUSY is not a stored copy"
            assert counter(client, source, "repair_copies") == 0
        # The other writer died: its reservation is dropped, and only the retry stores the block.
        wait_held(owner, keys)
        assert counter(client, source, "repair_copies") == 1
