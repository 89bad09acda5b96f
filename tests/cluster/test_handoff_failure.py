"""A hand-off that fails part way still finishes: ``handoff_finished`` is what a drain waits for.

The draining node is this process: a BlockStore whose blocks lie on SSD, handed off to a
real daemon (the only other active node, the owner of every key) registered in a real
etcd. Its SSD reads fail with an error no copy step expects.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kvpool_client.core.membership.cluster import list_nodes
from kvpool_client.core.membership.etcd import EtcdStore
from kvpool_client.core.membership.records import NodeState
from kvpool_server.index import StoreKey
from kvpool_server.membership.handoff import HandoffReport, hand_off
from tests.server.test_block_store import Harness
from tests.support.daemon import LocalCluster
from tests.support.etcd import requires_etcd

pytestmark = [pytest.mark.integration, requires_etcd]

FLAGS = ("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--no-prefault-arena", "--metrics-port", "-1",
         "--no-repair-enabled")  # fmt: skip
BLOCKS = 4


async def wait_active(store: EtcdStore, cluster: str, node_id: str) -> None:
    deadline = time.monotonic() + 10.0
    while True:
        record = (await list_nodes(store, cluster)).nodes.get(node_id)
        if record is not None and record.state is NodeState.ACTIVE:
            return
        assert time.monotonic() < deadline, f"{node_id} never became active"
        await asyncio.sleep(0.05)


async def hand_off_to(cluster: LocalCluster, source: Harness) -> HandoffReport:
    """Hand off ``source``'s blocks as node ``leaving``, once the daemon is active."""
    assert cluster.etcd is not None
    async with EtcdStore(cluster.etcd.endpoint) as store:
        await wait_active(store, cluster.cluster, "node-0")
        return await hand_off(source.store, store, cluster.cluster, "leaving", source.counters)


@pytest.mark.timeout(60)
def test_a_hand_off_that_fails_with_an_unexpected_error_still_finishes(tmp_path: Path) -> None:
    source = Harness(tmp_path)
    try:
        for i in range(BLOCKS):
            source.put_ssd(i)

        def failing(keys: Sequence[StoreKey], targets: Sequence[memoryview], *, touch: bool = True) -> list[int | None]:
            raise OSError(errno.EIO, "Input/output error")

        source.ssd.read_many = failing  # type: ignore[method-assign]
        with LocalCluster(1, *FLAGS) as cluster:
            report = asyncio.run(hand_off_to(cluster, source))
    finally:
        source.close()
    counters = source.counters.snapshot()
    assert report == HandoffReport(blocks=BLOCKS, copies=0, failed=BLOCKS), report
    assert (counters.get("handoff_started"), counters.get("handoff_finished")) == (1, 1), counters
    assert counters.get("handoff_failures") == counters.get("handoff_planned") == BLOCKS, counters
