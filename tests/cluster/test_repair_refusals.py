"""Repair of blocks the owner refuses: retried a few times, then left until the membership changes.

This process holds the blocks (a DRAM-only BlockStore under a :class:`MembershipRepair`
that retries within a tenth of a second); their only owner is a real daemon registered in
a real etcd, whose slab (its block limit) and namespace quota are too small for two of them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvpool_client.core.auth import Credentials
from kvpool_client.core.membership.cluster import update_config
from kvpool_client.core.membership.etcd import EtcdStore
from kvpool_client.core.membership.records import ClusterConfig
from kvpool_server.membership.repair import MembershipRepair, RepairSettings
from kvpool_server.stats import Counters
from kvpool_server.tiers.store import BlockStore
from tests.server.test_dram_tier import Harness
from tests.support.daemon import LocalCluster
from tests.support.etcd import requires_etcd

pytestmark = [pytest.mark.integration, requires_etcd]

KiB = 1024
NS = "refused@u8"
# node-0 takes blocks of up to 256 KiB, and 64 KiB per namespace.
FLAGS = ("--dram-capacity", "16MiB", "--slab-size", "256KiB", "--namespace-quota", "64KiB", "--no-prefault-arena",
         "--metrics-port", "-1", "--no-repair-enabled")  # fmt: skip
SETTINGS = RepairSettings(settle_s=0.05, bandwidth=0, retry_max_s=0.1)
WAIT_S = 10.0


async def until(condition: Callable[[], bool], what: Callable[[], object]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out; saw {what()}"
        await asyncio.sleep(0.02)


async def gives_up_after(repair: MembershipRepair, counters: Counters, runs: int) -> None:
    """Wait until the repair has made ``runs`` runs in all and then gave up: idle, it runs again
    only after a membership change, so no retry can follow."""
    await until(lambda: counters.get("repair_runs") >= runs and repair.idle, counters.snapshot)
    assert counters.get("repair_runs") == runs, counters.snapshot()


async def repair_against(cluster: LocalCluster, blocks: BlockStore, counters: Counters) -> dict[str, int]:
    """Run the repair until it gives up, change the membership (the replica count), and again."""
    assert cluster.etcd is not None
    async with EtcdStore(cluster.etcd.endpoint) as store:
        repair = MembershipRepair(blocks, store, cluster.cluster, "holder", counters, Credentials(), SETTINGS)
        await repair.start()
        try:
            await gives_up_after(repair, counters, 3)
            await update_config(store, cluster.cluster, lambda _: ClusterConfig(replicas=2))  # R=1 before
            await gives_up_after(repair, counters, 6)
        finally:
            await repair.close()
    return counters.snapshot()


@pytest.mark.timeout(60)
def test_copies_every_owner_refuses_are_retried_twice_then_wait_for_a_membership_change(tmp_path: Path) -> None:
    holder = Harness(str(tmp_path), "arena", capacity=4 << 20, slab=1 << 20)
    try:
        holder.put((NS, b"small".ljust(32, b"\0")), os.urandom(16 * KiB))
        holder.put((NS, b"over-the-quota".ljust(32, b"\0")), os.urandom(128 * KiB))
        holder.put((NS, b"over-the-limit".ljust(32, b"\0")), os.urandom(512 * KiB))
        with LocalCluster(1, *FLAGS) as cluster:
            blocks = BlockStore(holder.tier, None, holder.counters)
            counters = asyncio.run(repair_against(cluster, blocks, holder.counters))
    finally:
        holder.arena.close()
    assert counters["repair_copies"] == 1, counters
    assert counters["repair_failed"] == 6 * 2, "each run tries both refused blocks again"
    assert counters["repair_refused"] == 2 * 2, "counted once per membership the repair gave up on"
