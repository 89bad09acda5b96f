"""One tenant's throughput while another tenant of the same daemon is hostile.

A daemon serves two tenants from one credentials file. The measured tenant's client puts,
gets and deletes batches of 32 x 384 KiB blocks for ``--seconds``; in each round it runs
alone, beside a *fair* tenant (``--fair`` processes doing the same, within its rights), and beside
a *hostile* tenant: processes putting fresh blocks into its own namespaces as fast as they can
(far past its DRAM quota, so it evicts its own blocks; at most ``--hostile-rate`` bytes a second),
probing the measured tenant's keys,
trying to put into its namespace, and opening connections past its cap. Cells are interleaved
within each round. It reports the measured tenant's GB/s in each, the ratios to alone (target
>= 0.9 with the hostile tenant) and to beside the fair tenant (what sharing the machine costs
by itself), whether any of the measured tenant's blocks were lost, and what the hostile tenant
held and was refused.

    python bench/robustness/tenants.py [--rounds 3] [--seconds 3] [--hostile 2] [--fair 1] [--hostile-rate 100MiB]
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.robustness.hostile import BATCH, BLOCK, round_trips_gbps  # noqa: E402
from kvpool_client import BlockKey, ClientConfig, ErrorCode, KVPoolClient  # noqa: E402
from kvpool_client.core.wire import HelloRequest  # noqa: E402
from tests.support.daemon import running_daemon  # noqa: E402
from tests.support.rawwire import RawConnection  # noqa: E402

CLUSTER, VICTIM, FAIR, HOSTILE = (f"{who}-token-0123456789abcdef".encode() for who in ("cluster", "v", "f", "h"))
VICTIM_NS, FAIR_NS, HOSTILE_NS = "victim.m@bf16@bench", "fair.m@bf16@bench", "hostile.m{}@bf16@bench"
HOSTILE_DRAM = 64 << 20
HOSTILE_CONNECTIONS = 16


def credentials(hostile_rate: str) -> dict[str, object]:
    rights = ["read", "write", "delete"]
    return {
        "tenants": {
            "victim": {"token": VICTIM.decode(), "namespaces": ["victim.*"], "rights": rights},
            "fair": {"token": FAIR.decode(), "namespaces": ["fair.*"], "rights": rights},
            "hostile": {
                "token": HOSTILE.decode(),
                "namespaces": ["hostile.*"],
                "rights": rights,
                "quotas": {"dram": HOSTILE_DRAM, "connections": HOSTILE_CONNECTIONS, "rate": hostile_rate},
            },
        }
    }


def keys(namespace: str, tag: str, count: int) -> list[BlockKey]:
    return [BlockKey(namespace, hashlib.sha256(f"{tag}-{i}".encode()).digest()) for i in range(count)]


def client(address: str, token: bytes) -> KVPoolClient:
    return KVPoolClient(config=ClientConfig(nodes=(address,), auth_token=token, transport="tcp"))


def workload_gbps(
    address: str, token: bytes, namespace: str, seconds: float, tag: str, ready: Callable[[], None] = lambda: None
) -> float:
    """Bytes put and got per second, batches of 32, for ``seconds`` (``ready``: told once connected)."""
    with client(address, token) as pool:
        pool.server_info(address)
        ready()
        return round_trips_gbps(pool, seconds, lambda serial: keys(namespace, f"{tag}-{serial}", BATCH))


def fair(address: str, data_address: str, seconds: float, tag: str, out: multiprocessing.Queue[object]) -> None:
    out.put(("fair", workload_gbps(address, FAIR, FAIR_NS, seconds, tag, lambda: out.put("ready"))))


def hostile(address: str, data_address: str, seconds: float, tag: str, out: multiprocessing.Queue[object]) -> None:
    """Flood: fresh puts past the quota, probes and puts into the victim's namespace, extra connections."""
    blocks = [os.urandom(BLOCK) for _ in range(BATCH)]
    counts = {"stored": 0, "over_quota_or_overloaded": 0, "denied": 0, "probe_hits": 0, "connections_refused": 0}
    opened: list[RawConnection] = []
    with client(address, HOSTILE) as pool:
        pool.server_info(address)
        out.put("ready")
        started, serial = time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            serial += 1
            result = pool.put(keys(HOSTILE_NS.format(serial % 4), f"{tag}-{serial}", BATCH), blocks)
            counts["stored"] += result.stored
            counts["over_quota_or_overloaded"] += sum(
                s in (ErrorCode.QUOTA_EXCEEDED, ErrorCode.OVERLOADED) for s in result.statuses
            )
            victim_keys = keys(VICTIM_NS, f"probe-{serial}", 8)
            counts["denied"] += pool.put(victim_keys, blocks[:8]).statuses.count(ErrorCode.PERMISSION_DENIED)
            counts["probe_hits"] += sum(pool.exists(victim_keys))
            if len(opened) < 4 * HOSTILE_CONNECTIONS:
                conn = RawConnection(data_address)
                opened.append(conn)
                answer = conn.request(HelloRequest(1, HOSTILE)).message
                counts["connections_refused"] += getattr(answer, "code", None) == ErrorCode.OVERLOADED
    for conn in opened:
        conn.close()
    out.put(("hostile", counts))


def beside(
    address: str, data_address: str, seconds: float, tag: str, others: list[Callable[..., None]]
) -> tuple[float, list[object]]:
    """The victim's GB/s while ``others`` run in processes of their own; what they reported."""
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[object] = context.Queue()
    processes = [
        context.Process(target=other, args=(address, data_address, seconds + 1.0, f"{tag}-{i}", out))
        for i, other in enumerate(others)
    ]
    for process in processes:
        process.start()
    for _ in processes:  # the others are past their start-up (imports, connections) before the measurement
        assert out.get(timeout=120) == "ready"
    gbps = workload_gbps(address, VICTIM, VICTIM_NS, seconds, tag)
    reports = [out.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
    return gbps, reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hostile", type=int, default=2, help="hostile processes")
    parser.add_argument("--fair", type=int, default=1, help="fair processes (as many as --hostile: sharing alone)")
    parser.add_argument("--hostile-rate", default="100MiB", help="the hostile tenant's quotas.rate per node (0: none)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvpool-tenants-"))
    (work / "token").write_bytes(CLUSTER)
    (work / "tenants.yaml").write_text(yaml.safe_dump(credentials(args.hostile_rate)))
    flags = ("--auth-token-file", str(work / "token"), "--auth-tenants-file", str(work / "tenants.yaml"))
    cells: dict[str, list[float]] = {"alone": [], "fair": [], "hostile": []}
    hostile_reports: list[object] = []
    with running_daemon("--dram-capacity", "1GiB", "--slab-size", "4MiB", *flags) as daemon:
        kept = keys(VICTIM_NS, "kept", BATCH)
        with client(daemon.address, VICTIM) as victim:
            victim.put(kept, [b"k" * BLOCK] * BATCH).raise_for_errors()
        order = ["alone", "fair", "hostile"]
        for round_ in range(args.rounds):
            for cell in order if round_ % 2 == 0 else order[::-1]:
                tag = f"{cell}-{round_}"
                if cell == "alone":
                    gbps = workload_gbps(daemon.address, VICTIM, VICTIM_NS, args.seconds, tag)
                else:
                    others = [fair] * args.fair if cell == "fair" else [hostile] * args.hostile
                    gbps, reports = beside(daemon.address, daemon.data_address, args.seconds, tag, others)
                    if cell == "hostile":
                        hostile_reports += reports
                cells[cell].append(gbps)
                print(f"round {round_} {cell:8s} victim {gbps:.2f} GB/s", flush=True)
        with client(daemon.address, VICTIM) as victim, client(daemon.address, CLUSTER) as cluster:
            lost = victim.exists(kept).count(False)
            held = sum(r.bytes for r in cluster.namespaces(daemon.address) if r.namespace.startswith("hostile."))
    medians = {cell: statistics.median(values) for cell, values in cells.items()}
    to_alone = statistics.median(h / a for h, a in zip(cells["hostile"], cells["alone"], strict=True))
    to_fair = statistics.median(h / f for h, f in zip(cells["hostile"], cells["fair"], strict=True))
    fair_alone = statistics.median(f / a for f, a in zip(cells["fair"], cells["alone"], strict=True))
    print(f"medians GB/s: {', '.join(f'{cell} {value:.2f}' for cell, value in medians.items())}")
    print(f"victim beside the hostile tenant / alone: {to_alone:.2f} (target >= 0.9)")
    print(f"victim beside a fair tenant / alone: {fair_alone:.2f} (what sharing the machine costs)")
    print(f"victim beside the hostile tenant / beside a fair one: {to_fair:.2f}")
    print(f"victim blocks lost: {lost} of {BATCH}; hostile tenant holds {held / (1 << 20):.1f} MiB (quota 64 MiB)")
    print(f"hostile tenant's reports: {hostile_reports}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
