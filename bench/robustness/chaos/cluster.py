"""The soak's cluster: an etcd and 3 daemons in one temp dir, each daemon with an SSD tier.

node-2's SSD directory is a tmpfs mount (where mounting is allowed), so the disk fault
can fill it. A node keeps every incarnation (process) it had, for the crash verdicts.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench.robustness.chaos.settings import CLUSTER, DISK_NODE, NODES, NS, TMPFS_SIZE, SoakSettings
from kvpool_client import KVPoolClient
from kvpool_client.core.membership.records import ClusterConfig
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from tests.support.daemon import DaemonProcess, start_daemon, write_cluster_config
from tests.support.etcd import LocalEtcd


@dataclass
class Incarnation:
    """One process of a node; ``killed`` when the driver sent it SIGKILL."""

    daemon: DaemonProcess
    killed: bool = False
    log: str = ""


@dataclass
class Node:
    """A node: its SSD directory, every process it had, and when the driver killed it."""

    name: str
    ssd_dir: Path
    incarnations: list[Incarnation] = field(default_factory=list)
    killed_at: list[float] = field(default_factory=list)

    @property
    def daemon(self) -> DaemonProcess:
        return self.incarnations[-1].daemon


@dataclass
class Window:
    """A fault's span (monotonic seconds) and what it did to its target."""

    fault: str
    target: str
    start: float
    end: float
    note: str = ""


class SoakCluster:
    """etcd and 3 daemons in one temp dir; the faults (``chaos.faults``) act on it and record their windows."""

    def __init__(self, settings: SoakSettings) -> None:
        self.s = settings
        self.root = Path(tempfile.mkdtemp(prefix="kvpool-soak-"))
        self.shm = Path(tempfile.mkdtemp(prefix="kvsoak-", dir="/dev/shm"))
        self.etcd = LocalEtcd(workdir=self.root / "etcd")
        self.nodes = [Node(f"node-{i}", self.root / f"ssd-{i}") for i in range(NODES)]
        self.mounted: Path | None = None
        self.disk_skip_reason = ""
        self.windows: list[Window] = []

    def start(self) -> None:
        self.etcd.workdir.mkdir()
        self.etcd.start()
        # R=2 in etcd, not only in the clients: the daemons' repair keeps as many copies as the clients write.
        write_cluster_config(self.etcd.endpoint, CLUSTER, ClusterConfig(replicas=2, write_quorum=2))
        for node in self.nodes:
            node.ssd_dir.mkdir()
        self._mount_tmpfs(self.nodes[DISK_NODE].ssd_dir)
        for node in self.nodes:
            node.incarnations.append(Incarnation(self.spawn(node)))

    def _mount_tmpfs(self, path: Path) -> None:
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)],
                           check=True, capture_output=True, timeout=10)  # fmt: skip
            self.mounted = path
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            self.disk_skip_reason = f"cannot mount a tmpfs ({exc} {detail.decode(errors='replace').strip()})"

    def spawn(self, node: Node, ports: tuple[int, int] | None = None) -> DaemonProcess:
        """Start a daemon for ``node``, on ``ports`` (gRPC, data) where given, else on free ones."""
        flags = [
            "--node-id", node.name, "--etcd-endpoints", self.etcd.endpoint, "--cluster", CLUSTER,
            "--lease-ttl-s", "3", "--dram-capacity", self.s.dram, "--slab-size", "1MiB", "--no-prefault-arena",
            "--ssd-dir", str(node.ssd_dir), "--ssd-capacity", "64MiB", "--ssd-segment-size", "4MiB",
            "--shm-dir", str(self.shm), "--metrics-port", "-1", "--log-level", "warning",
        ]  # fmt: skip
        if ports is not None:  # flags given later win: the restart keeps its ports
            flags += ["--grpc-port", str(ports[0]), "--data-port", str(ports[1])]
        return start_daemon(*flags, timeout=30.0)

    # -- queries --

    def stats(self, node: Node) -> pb.Stats:
        """``node``'s live daemon's counters, asked over gRPC."""
        with grpc.insecure_channel(node.daemon.address) as channel:
            return kvpool_pb2_grpc.KVPoolStub(channel).GetStats(pb.GetStatsRequest(), timeout=5)

    # -- end of the run --

    def wait_settled(self, client: KVPoolClient, timeout: float = 20.0) -> bool:
        """True once the client sees all nodes in the membership and each answers server info."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            members = {m.node_id for m in client.placement().router.members()}
            if members == {n.name for n in self.nodes} and all(self._answers(n) for n in self.nodes):
                return True
            time.sleep(0.2)
        return False

    def _answers(self, node: Node) -> bool:
        with grpc.insecure_channel(node.daemon.address) as channel:
            try:
                kvpool_pb2_grpc.KVPoolStub(channel).GetServerInfo(pb.GetServerInfoRequest(), timeout=2)
                return True
            except grpc.RpcError:
                return False

    def holders(self, hashes: list[bytes]) -> list[list[str]]:
        """Per hash, the nodes whose index holds it (asked directly, placement aside)."""
        found: list[list[str]] = [[] for _ in hashes]
        for node in self.nodes:
            with grpc.insecure_channel(node.daemon.address) as channel:
                stub = kvpool_pb2_grpc.KVPoolStub(channel)
                for start in range(0, len(hashes), 1000):
                    part = hashes[start : start + 1000]
                    present = stub.Exists(pb.KeysRequest(namespace=NS, hashes=part), timeout=10).present
                    for i, there in enumerate(present):
                        if there:
                            found[start + i].append(node.name)
        return found

    def evictions(self, client: KVPoolClient) -> dict[str, int]:
        """DRAM evictions per node (of the live incarnation: a restart resets the counters)."""
        counts = {}
        for node in self.nodes:
            stats = client.stats(node.daemon.address)
            counts[node.name] = sum(t.evictions for t in stats.tiers if t.name == "dram")
        return counts

    def stop(self) -> None:
        """SIGCONT, SIGTERM every daemon, stop etcd, unmount, remove every file. Safe to call twice."""
        for node in self.nodes:
            for inc in node.incarnations:
                if inc.daemon.process.poll() is None:
                    inc.daemon.process.send_signal(signal.SIGCONT)
                    inc.daemon.stop(timeout=20)
                if not inc.log:
                    inc.log = inc.daemon.log()
                inc.daemon.remove_files()
        self.etcd.close()
        if self.mounted is not None:
            subprocess.run(["umount", "-l", str(self.mounted)], check=False, capture_output=True, timeout=10)
            self.mounted = None
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.shm, ignore_errors=True)
