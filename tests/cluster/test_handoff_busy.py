"""A drain hand-off against real daemons in a real etcd: a block the new owner has only
reserved (another writer's put not committed) is not handed off.

That writer may still abort, and then no node but the draining one would hold the block:
the hand-off reports it as a failure, not as a copy. Repair is off here, so only the
hand-off moves blocks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from kvpool_client import BlockKey, ClientConfig, ErrorCode, KVPoolClient
from kvpool_client.core.wire import PutRequest, encode
from tests.client.test_cli import kvpoolctl
from tests.support.daemon import LocalCluster
from tests.support.etcd import requires_etcd
from tests.support.rawwire import RawConnection

pytestmark = [pytest.mark.integration, requires_etcd]

FLAGS = ("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--no-prefault-arena", "--metrics-port", "-1",
         "--no-repair-enabled")  # fmt: skip


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """node-0 (to be drained) and node-1 (the only other active node: it owns every key at R=1)."""
    with LocalCluster(2, *FLAGS) as pool:
        yield pool


def reserve(writer: RawConnection, key: BlockKey, data: bytes) -> None:
    """Start another client's put of ``key`` and stall half way: the node reserves the key."""
    writer.send(encode(PutRequest(1, key.namespace, [key.hash], [len(data)])) + data[: len(data) // 2])


@pytest.mark.timeout(60)
def test_a_block_the_owner_reports_busy_counts_as_a_hand_off_failure(cluster: LocalCluster) -> None:
    source, owner = cluster.daemons
    ns = f"handoff-{os.urandom(4).hex()}@u8"
    busy, free = BlockKey(ns, os.urandom(32)), BlockKey(ns, os.urandom(32))
    data = [os.urandom(16 << 10), os.urandom(16 << 10)]
    with KVPoolClient(config=ClientConfig(nodes=(source.address,))) as alone:
        assert alone.put([busy, free], data).ok
    with RawConnection(owner.data_address) as writer, KVPoolClient(config=ClientConfig(nodes=(owner.address,))) as o:
        reserve(writer, busy, data[0])
        assert o.put([busy], [data[0]]).statuses == (ErrorCode.BUSY,), "the test needs the key reserved"
        assert cluster.etcd is not None
        drain = kvpoolctl("--etcd", cluster.etcd.endpoint, "--cluster", cluster.cluster, "--json",
                          "drain", source.node_id, "--handoff", "--wait", "--wait-timeout", "20")  # fmt: skip
    assert drain.returncode == 1 and b"1 hand-off copies from node-0" in drain.stderr, drain.stderr
    report = json.loads(drain.stdout)
    assert report["state"] == "draining" and report["handoff_copies"] == 1 and report["handoff_failures"] == 1
    with KVPoolClient(config=ClientConfig(nodes=(owner.address,))) as o:
        assert o.exists([busy, free]) == [False, True], "the writer aborted: only the draining node holds it"
