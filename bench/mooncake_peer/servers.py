"""Mooncake's master and one store node on loopback, started and stopped by the benchmark.

The master (``mooncake_master``) keeps the key -> replica table; the store node
(``mooncake_client``) mounts one global segment of ``capacity`` bytes and serves it over
the ``tcp`` transport; peers find each other by ``P2PHANDSHAKE`` (no metadata server).
Clients talk to the master for every lookup and move bytes with the store node: both
processes' CPU counts as the server's. Each is ready when its log announces its service on
the port it was given and that port accepts a connection. Both are stopped by PID on the way
out, exceptions and Ctrl-C included.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.harness.servers import Endpoint, stop_process
from bench.mooncake_peer import LOCAL_SYSTEMS, TCP_SYSTEMS
from bench.mooncake_peer.env import MooncakeUnavailable, ensure

MASTER_READY = re.compile(r"Master service started on port (\d+)")
NODE_READY = re.compile(r"Starting real client service on \S+?:(\d+)\b")
START_TIMEOUT_S = 30.0
_LOG_TAIL = 3000


@dataclass(frozen=True, slots=True)
class MooncakeServers:
    master: str  # host:port of the master's RPC service: the clients' master_server_addr
    store_node: str  # host:port of the store node's client service: what setup_dummy attaches to
    master_pid: int
    store_node_pid: int

    def endpoints(self) -> dict[str, Endpoint]:
        """Each Mooncake system's address; CPU per op counts the store node and the master."""
        tcp = Endpoint(self.master, self.store_node_pid, also=(self.master_pid,))
        local = Endpoint(self.store_node, self.store_node_pid, also=(self.master_pid,))
        return {system: tcp for system in TCP_SYSTEMS} | {system: local for system in LOCAL_SYSTEMS}


def announced_port(log: str, pattern: re.Pattern[str]) -> int | None:
    """The port that the last line of ``log`` matching ``pattern`` announces, if any."""
    found = pattern.findall(log)
    return int(found[-1]) if found else None


@contextmanager
def mooncake_servers(capacity: int, install_packages: bool) -> Iterator[MooncakeServers | None]:
    """A master and a store node with a ``capacity``-byte segment; ``None`` if Mooncake cannot
    be installed here (the reason goes to stderr).

    Raises:
        RuntimeError: a process exited or did not become ready (with its log's tail).
    """
    try:
        install = ensure(install_packages)
    except MooncakeUnavailable as exc:
        print(f"mooncake unavailable: {exc}", file=sys.stderr)
        yield None
        return
    workdir = Path(tempfile.mkdtemp(prefix="bench-mooncake-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        master_port, metrics_port, node_port = _free_ports(3)
        master_argv = [
            str(install.master), f"--rpc_port={master_port}", "--rpc_address=127.0.0.1",
            f"--metrics_port={metrics_port}", "--metrics_host=127.0.0.1", "--logtostderr",
        ]  # fmt: skip
        master = _start(processes, master_argv, workdir / "master.log")
        _wait_ready(master, workdir / "master.log", MASTER_READY, master_port)
        node_argv = [
            str(install.store_node), "--host=127.0.0.1", f"--port={node_port}",
            f"--master_server_address=127.0.0.1:{master_port}", "--metadata_server=P2PHANDSHAKE",
            "--protocol=tcp", f"--global_segment_size={capacity}", "--logtostderr",
        ]  # fmt: skip
        node = _start(processes, node_argv, workdir / "store_node.log")
        _wait_ready(node, workdir / "store_node.log", NODE_READY, node_port)
        yield MooncakeServers(f"127.0.0.1:{master_port}", f"127.0.0.1:{node_port}", master.pid, node.pid)
    finally:
        for process in reversed(processes):  # the store node first: it unmounts from a live master
            stop_process(process)
        shutil.rmtree(workdir, ignore_errors=True)


def _start(processes: list[subprocess.Popen[bytes]], argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    processes.append(process)
    return process


def _wait_ready(process: subprocess.Popen[bytes], log: Path, pattern: re.Pattern[str], port: int) -> None:
    """Until the log announces ``port`` and it accepts a connection.

    Raises:
        RuntimeError: the process exited, or the deadline passed.
    """
    name = Path(str(process.args[0])).name  # type: ignore[index]
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{_tail(log)}")
        if announced_port(log.read_text(errors="replace"), pattern) == port and _accepts(port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not announce port {port} within {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-_LOG_TAIL:]


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def _free_ports(count: int) -> list[int]:
    """Distinct ports free now (kept bound together, so none is handed out twice)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()
