"""The shape of a soak run: the cluster's constants, the run's settings and the clients' configuration."""

from __future__ import annotations

from dataclasses import dataclass

from kvpool_client import ClientConfig

NODES = 3
CLUSTER = "soak"
NS = "soak@u8@raw@tp0of1"
DISK_NODE = 2  # whose SSD directory is a tmpfs that the disk fault fills
TMPFS_SIZE = "96m"  # above the tier's 64 MiB, so only the fault fills it


@dataclass(frozen=True, slots=True)
class SoakSettings:
    """One run's shape; the fault and gap durations are in seconds."""

    seconds: float = 120.0
    workers: int = 3
    baseline_s: float = 15.0
    warmup_s: float = 4.0
    kill_down_s: float = 3.0
    stop_s: float = 4.0
    etcd_down_s: float = 3.0
    disk_full_s: float = 6.0
    gap_s: float = 5.0
    block: int = 16 << 10
    batch: int = 4
    live_per_worker: int = 600
    put_share: float = 0.05  # read-mostly, as a cache is: a block lives through several faults
    dram: str = "48MiB"
    seed: int = 1


def client_config(etcd_endpoint: str) -> ClientConfig:
    """The soak's clients: R=2 and a write quorum of 2, with 1 s timeouts so a fault shows quickly."""
    return ClientConfig(etcd_endpoints=(etcd_endpoint,), cluster=CLUSTER, replicas=2, write_quorum=2,
                        request_timeout_s=1.0, connect_timeout_s=1.0)  # fmt: skip
