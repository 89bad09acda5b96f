"""Cluster benchmark: aggregate get throughput of 3 nodes vs 1, and failover after kill -9.

Both parts run in one invocation, on loopback:

1. Throughput: the same 3 client processes (batches of 32 blocks of 384 KiB, every
   block checked by checksum outside the timed section) against a 1-node pool, then
   against a 3-node pool. Reported as GB/s and as the ratio 3-node / 1-node.
2. Failover: a 3-node pool in etcd with 2 replicas. One client reads single blocks
   in a loop; one daemon is killed with SIGKILL. Reported: read latency p50 before
   the kill, the latency of the first read whose first owner was the dead node,
   the longest read after the kill, failed reads (should be 0), and how long the
   dead node stayed in the client's membership (lease expiry).

Run: python bench/cluster.py [--seconds 3] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvpool_client import BlockKey, ClientConfig, ErrorCode, KVPoolClient
from tests.support.daemon import LocalCluster

BLOCK = 384 << 10
BATCH = 32
CLIENTS = 3
DAEMON_FLAGS = ("--dram-capacity", "768MiB", "--slab-size", "4MiB", "--log-level", "warning")


@dataclass(frozen=True, slots=True)
class ThroughputResult:
    nodes: int
    clients: int
    gb_per_s: float


@dataclass(frozen=True, slots=True)
class FailoverResult:
    p50_before_ms: float
    first_read_on_dead_owner_ms: float
    max_read_after_kill_ms: float
    failed_reads: int
    reads_after_kill: int
    membership_removal_s: float


def _blocks(worker: int, count: int) -> tuple[list[BlockKey], list[np.ndarray]]:
    rng = np.random.default_rng(worker)
    keys = [BlockKey("bench@u8@raw@tp0of1", xxhash.xxh3_128_digest(f"{worker}/{i}".encode()) * 2) for i in range(count)]
    return keys, [rng.integers(0, 256, BLOCK, dtype=np.uint8) for _ in range(count)]


def _reader(nodes: list[str], worker: int, seconds: float, barrier: mp.Barrier, out: mp.Queue) -> None:
    """Client process: store its blocks, then get batches for ``seconds``; report bytes/s."""
    keys, blocks = _blocks(worker, 2 * BATCH)
    sums = [xxhash.xxh3_64_intdigest(b) for b in blocks]
    targets = [np.empty(BLOCK, np.uint8) for _ in range(BATCH)]
    with KVPoolClient(nodes) as client:
        client.put(keys, blocks).raise_for_errors()
        barrier.wait()
        moved, busy, start = 0, 0.0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            first = (moved // BLOCK) % 2 * BATCH
            began = time.perf_counter()
            client.get(keys[first : first + BATCH], targets).raise_for_errors()
            busy += time.perf_counter() - began
            moved += BATCH * BLOCK
            if any(xxhash.xxh3_64_intdigest(t) != sums[first + i] for i, t in enumerate(targets)):
                raise AssertionError(f"worker {worker}: wrong bytes")
        out.put(moved / busy)


def measure_throughput(nodes: int, seconds: float) -> ThroughputResult:
    ctx = mp.get_context("spawn")
    with LocalCluster(nodes, *DAEMON_FLAGS, with_etcd=False) as cluster:
        barrier, out = ctx.Barrier(CLIENTS), ctx.Queue()
        procs = [
            ctx.Process(target=_reader, args=(cluster.addresses, w, seconds, barrier, out)) for w in range(CLIENTS)
        ]
        for proc in procs:
            proc.start()
        try:
            rate = sum(out.get(timeout=seconds + 60) for _ in procs)
        finally:
            for proc in procs:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
    return ThroughputResult(nodes, CLIENTS, rate / 1e9)


def measure_failover(seconds: float) -> FailoverResult:
    with LocalCluster(3, *DAEMON_FLAGS, "--lease-ttl-s", "3") as cluster:
        config = ClientConfig(etcd_endpoints=cluster.etcd_endpoints, cluster=cluster.cluster, replicas=2)
        with KVPoolClient(config=config) as client:
            keys, blocks = _blocks(99, 48)
            client.put(keys, blocks).raise_for_errors()
            router = client.placement().router
            victim = cluster.daemons[0]
            on_victim = {k.hash for k in keys if router.placement(k).read_order[0].node_id == victim.node_id}
            return _read_through_kill(client, cluster, keys, on_victim, seconds)


def _read_through_kill(
    client: KVPoolClient, cluster: LocalCluster, keys: list[BlockKey], on_victim: set[bytes], seconds: float
) -> FailoverResult:
    target = np.empty(BLOCK, np.uint8)
    before, after, first_on_victim, failed = [], [], None, 0
    start, killed_at = time.perf_counter(), None
    for i in range(10**9):
        now = time.perf_counter()
        if killed_at is None and now - start > seconds / 3:
            cluster.daemons[0].stop(signal.SIGKILL)
            killed_at = time.perf_counter()
        if now - start > seconds:
            break
        key = keys[i % len(keys)]
        began = time.perf_counter()
        status = client.get([key], [target]).statuses[0]
        took = (time.perf_counter() - began) * 1e3
        failed += status is not ErrorCode.OK
        (after if killed_at else before).append(took)
        if killed_at and first_on_victim is None and key.hash in on_victim:
            first_on_victim = took
    gone = _wait_membership_removal(client, cluster.daemons[0].node_id, killed_at or time.perf_counter())
    return FailoverResult(statistics.median(before), first_on_victim or 0.0, max(after), failed, len(after), gone)


def _wait_membership_removal(client: KVPoolClient, node_id: str, since: float, limit_s: float = 15.0) -> float:
    while time.perf_counter() - since < limit_s:
        if all(m.node_id != node_id for m in client.placement().router.members()):
            return time.perf_counter() - since
        time.sleep(0.05)
    return float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    one, three = measure_throughput(1, args.seconds), measure_throughput(3, args.seconds)
    failover = measure_failover(args.seconds)
    report = {
        "throughput": [asdict(one), asdict(three)],
        "ratio_3_over_1": three.gb_per_s / one.gb_per_s,
        "failover": asdict(failover),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cluster.json").write_text(json.dumps(report, indent=2))
    print(
        f"get throughput, {CLIENTS} clients, batches of {BATCH} x 384 KiB: "
        f"1 node {one.gb_per_s:.2f} GB/s, 3 nodes {three.gb_per_s:.2f} GB/s, ratio {report['ratio_3_over_1']:.2f}"
    )
    f = failover
    print(
        f"failover after kill -9 (R=2): read p50 before {f.p50_before_ms:.2f} ms; first read owned by the dead "
        f"node {f.first_read_on_dead_owner_ms:.2f} ms; slowest read after {f.max_read_after_kill_ms:.2f} ms; "
        f"{f.failed_reads} of {f.reads_after_kill} reads failed; left the membership after "
        f"{f.membership_removal_s:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
