"""Real daemons on loopback, one process each: for the tests, the demo and the benchmarks.

Each daemon is a real ``kvpool-server`` process on ephemeral ports; it writes its
bound ports to an announce file once it is ready, which is what we wait for. A
:class:`LocalCluster` adds an etcd (:mod:`tests.support.etcd`) the daemons register in.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kvpool_client.core.membership.records import ClusterConfig
from kvpool_server.alloc.arena import ARENA_PREFIX
from tests.support.etcd import LocalEtcd

# The interpreter that runs daemons: the one with the server's dependencies. Engine and
# compatibility test suites run clients in environments without them (tests/environments.py
# sets it). KVPOOL_TEST_* variables are the test tooling's, never a daemon setting.
SERVER_PYTHON_ENV = "KVPOOL_TEST_SERVER_PYTHON"
_TOOLING_PREFIX = "KVPOOL_TEST_"


@dataclass
class DaemonProcess:
    """A running daemon: its process, bound ports and log file."""

    process: subprocess.Popen[bytes]
    grpc_port: int
    data_port: int
    node_id: str
    log_path: Path
    workdir: Path
    extra: dict[str, str] = field(default_factory=dict)
    metrics_port: int = -1  # -1: metrics off

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def data_address(self) -> str:
        return f"127.0.0.1:{self.data_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def remove_files(self, shm_dir: str = "/dev/shm") -> None:
        """Delete the announce file and log, and the arena a killed daemon left (after :meth:`stop`)."""
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.process.poll() is not None:  # a clean exit removed it; a SIGKILL did not
            for pattern in (f"{ARENA_PREFIX}{self.process.pid}-*", f"{ARENA_PREFIX}marks-{self.process.pid}-*"):
                for arena in Path(shm_dir).glob(pattern):  # the arena, and the shared index's hit marks
                    arena.unlink(missing_ok=True)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signal the daemon and wait; SIGKILL if it does not exit in ``timeout``."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


def start_daemon(*args: str, env: dict[str, str] | None = None, timeout: float = 20.0) -> DaemonProcess:
    """Start ``kvpool-server`` on ephemeral loopback ports and wait until it announces itself.

    Raises:
        RuntimeError: the daemon exited or did not announce in time (its log is included).
    """
    workdir = Path(tempfile.mkdtemp(prefix="kvpool-test-"))
    announce = workdir / "announce.json"
    log_path = workdir / "daemon.log"
    argv = [
        os.environ.get(SERVER_PYTHON_ENV, sys.executable),
        "-m",
        "kvpool_server.app",
        "--host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--data-port",
        "0",
        "--announce-file",
        str(announce),
        "--log-format",
        "text",
        *args,
    ]
    with open(log_path, "wb") as log_file:
        child_env = {k: v for k, v in os.environ.items() if not k.startswith(_TOOLING_PREFIX)}
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env={**child_env, **(env or {})})
    deadline = time.monotonic() + timeout
    while not announce.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
                process.wait(5)
            log_text = log_path.read_text()
            shutil.rmtree(workdir, ignore_errors=True)
            raise RuntimeError(f"daemon did not start (exit {process.returncode}):\n{log_text}")
        time.sleep(0.02)
    info = json.loads(announce.read_text())
    ports = info["grpc_port"], info["data_port"]
    return DaemonProcess(process, *ports, info["node_id"], log_path, workdir, metrics_port=info.get("metrics_port", -1))


@contextmanager
def running_daemon(*args: str) -> Iterator[DaemonProcess]:
    """A daemon for the ``with`` block (a module's fixture): stopped, and its files removed, at its end."""
    daemon = start_daemon(*args)
    try:
        yield daemon
    finally:
        daemon.stop()
        daemon.remove_files()


def write_cluster_config(endpoint: str, cluster: str, config: ClusterConfig) -> None:
    """Write ``config`` as the cluster's config unless one exists (blocking; for tools and tests)."""
    # Imported here: only etcd clusters need the etcd client (the server's dependencies).
    from kvpool_client.core.membership.cluster import ensure_config
    from kvpool_client.core.membership.etcd import EtcdStore

    async def write() -> None:
        async with EtcdStore(endpoint) as store:
            await ensure_config(store, cluster, config)

    asyncio.run(write())


class LocalCluster:
    """A local pool on loopback: an etcd member and several daemons registered in it.

    Use as a context manager; everything started is stopped together.

    Args:
        size: number of daemons.
        daemon_args: extra ``kvpool-server`` flags for every daemon.
        with_etcd: start an etcd and register the daemons in it; without it the
            daemons run standalone and clients take the static address list.
        cluster: the cluster name in etcd.
        config: the cluster config written to etcd before any daemon starts (replicas,
            write quorum): clients and the daemons' repair then agree on it.
    """

    def __init__(
        self,
        size: int,
        *daemon_args: str,
        with_etcd: bool = True,
        cluster: str = "local",
        config: ClusterConfig | None = None,
    ) -> None:
        self.cluster = cluster
        self.etcd: LocalEtcd | None = None
        self.daemons: list[DaemonProcess] = []
        try:
            if with_etcd:
                self.etcd = LocalEtcd().start()
                if config is not None:
                    write_cluster_config(self.etcd.endpoint, cluster, config)
            for index in range(size):
                self.add_daemon(*daemon_args, node_id=f"node-{index}")
        except BaseException:
            self.stop()
            raise

    def add_daemon(self, *daemon_args: str, node_id: str) -> DaemonProcess:
        """Start one more daemon in this cluster."""
        membership = ("--etcd-endpoints", self.etcd.endpoint, "--cluster", self.cluster) if self.etcd else ()
        daemon = start_daemon("--node-id", node_id, *membership, *daemon_args)
        self.daemons.append(daemon)
        return daemon

    @property
    def addresses(self) -> list[str]:
        return [d.address for d in self.daemons]

    @property
    def etcd_endpoints(self) -> tuple[str, ...]:
        return (self.etcd.endpoint,) if self.etcd else ()

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()
            daemon.remove_files()
        if self.etcd is not None:
            self.etcd.close()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
