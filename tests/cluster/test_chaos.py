"""A short soak under chaos (``bench/robustness/soak.py``): 3 daemons with SSD tiers, R=2 and a write
quorum of 2, clients checking every byte, while daemons are killed and restarted, stopped
and continued, etcd restarts and a disk fills.

Asserted: no wrong bytes, no acknowledged block lost (see ``bench/robustness/soak.py`` for the exact
definition), no daemon crash the driver did not cause, and no eviction (the definition of
lost relies on it). Last, re-replication: a block whose owners changed and then lost their
copies is copied back to them from the node that still holds it.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from bench.robustness.chaos.report import print_report
from bench.robustness.chaos.run import run_soak
from bench.robustness.chaos.settings import SoakSettings
from kvpool_client import BlockKey, ClientConfig, ErrorCode, GetResult, KVPoolClient
from tests.support.daemon import DaemonProcess, LocalCluster, start_daemon
from tests.support.etcd import requires_etcd

pytestmark = [pytest.mark.integration, requires_etcd]

SHORT = SoakSettings(
    seconds=30.0, workers=2, warmup_s=2.0, baseline_s=5.0,
    kill_down_s=1.5, stop_s=2.5, etcd_down_s=1.5, disk_full_s=3.0, gap_s=2.0,
)  # fmt: skip


@pytest.mark.timeout(110)
def test_chaos_loses_nothing_and_serves_no_wrong_bytes() -> None:
    report = run_soak(SHORT)
    print_report(report)
    faults = {w["fault"] for w in report["windows"]}
    assert {"kill -9 + restart", "SIGSTOP / SIGCONT", "etcd restart"} <= faults, faults
    if report["disk_fault"] == "applied":
        assert "disk full" in faults
    assert report["acked_blocks"] > 100 and report["final_check"]["checked"] > 0, report["final_check"]
    assert report["wrong_bytes"] == 0
    assert report["lost_blocks"] == 0, report["final_check"]["lost_samples"]
    assert report["unexpected_crashes"] == 0, report["crash_samples"]
    assert all(n == 0 for n in report["dram_evictions"].values()), report["dram_evictions"]
    assert report["client_exceptions"] == 0, report["client_exception_samples"]


# -- re-replication after membership changes -------------------------------------------------------

REPAIR_SETTLE_S = 0.3
# Reads may miss on every owner from a membership change until the repair copied the block:
# the settle delay plus the run (64 small blocks here), well under this.
READ_WINDOW_S = 5.0


def _members(client: KVPoolClient) -> list[str]:
    return sorted(m.node_id for m in client.placement().router.members())


def _wait_members(client: KVPoolClient, want: list[str], limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while _members(client) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _members(client) == want


def _kill_and_restart(cluster: LocalCluster, index: int, client: KVPoolClient, flags: tuple[str, ...]) -> None:
    """SIGKILL a daemon, wait until its lease expires, start it again with the same id and ports."""
    old = cluster.daemons[index]
    old.stop(signal.SIGKILL)
    _wait_members(client, sorted({d.node_id for d in cluster.daemons} - {old.node_id}))
    _restart(cluster, index, old, flags)
    _wait_members(client, sorted(d.node_id for d in cluster.daemons))


def _restart(cluster: LocalCluster, index: int, old: DaemonProcess, flags: tuple[str, ...]) -> None:
    """Start ``old``'s node again in its place: same id, same ports, same etcd."""
    assert cluster.etcd is not None
    membership = ("--etcd-endpoints", cluster.etcd.endpoint, "--cluster", cluster.cluster)
    ports = ("--grpc-port", str(old.grpc_port), "--data-port", str(old.data_port))
    cluster.daemons[index] = start_daemon("--node-id", old.node_id, *membership, *flags, *ports)
    old.remove_files()


def _read_within(client: KVPoolClient, keys: list[BlockKey], window_s: float) -> GetResult:
    """Read ``keys`` until all are found or ``window_s`` has passed; the last result."""
    deadline = time.monotonic() + window_s
    while True:
        got = client.get(keys)
        if all(s is ErrorCode.OK for s in got.statuses) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


@pytest.mark.timeout(90)
def test_block_written_while_a_node_was_out_survives_a_kill_of_one_holder() -> None:
    """node-0 is out while 64 blocks go to node-1 and node-2; it rejoins and takes over some of their
    ownership, then node-1 restarts empty: node-2, never killed, must copy them back to their owners."""
    shm = Path(tempfile.mkdtemp(prefix="kvchaos-", dir="/dev/shm"))
    flags = ("--dram-capacity", "32MiB", "--slab-size", "1MiB", "--no-prefault-arena", "--lease-ttl-s", "3",
             "--shm-dir", str(shm), "--metrics-port", "-1",
             "--repair-settle-s", str(REPAIR_SETTLE_S), "--repair-replicas", "2")  # fmt: skip
    try:
        with LocalCluster(3, *flags) as cluster:
            config = ClientConfig(etcd_endpoints=cluster.etcd_endpoints, cluster=cluster.cluster,
                                  replicas=2, write_quorum=2, request_timeout_s=1.0)  # fmt: skip
            with KVPoolClient(config=config) as client:
                _wait_members(client, ["node-0", "node-1", "node-2"])
                node0 = cluster.daemons[0]
                node0.stop(signal.SIGKILL)
                _wait_members(client, ["node-1", "node-2"])
                keys = [BlockKey("chaos@u8", os.urandom(32)) for _ in range(64)]
                blocks = [os.urandom(4096) for _ in keys]
                put = client.put(keys, blocks)
                holders = sorted(d.address for d in cluster.daemons[1:])
                assert put.ok and all(sorted(n) == holders for n in put.stored_on), (holders, put.stored_on)
                _restart(cluster, 0, node0, flags)
                _wait_members(client, ["node-0", "node-1", "node-2"])
                _kill_and_restart(cluster, 1, client, flags)  # node-2, the other holder, is never touched
                got = _read_within(client, keys, READ_WINDOW_S)
                missing = [i for i, s in enumerate(got.statuses) if s is not ErrorCode.OK]
                assert not missing, f"{len(missing)} of {len(keys)} acknowledged blocks unreadable; node-2 holds them"
                assert [bytes(b or b"") for b in got.buffers] == blocks
                copied = dict(client.stats(cluster.daemons[2].address).counters).get("repair_copies", 0)
                assert copied > 0, "node-2 should have copied blocks to the owners that lacked them"
    finally:
        shutil.rmtree(shm, ignore_errors=True)
