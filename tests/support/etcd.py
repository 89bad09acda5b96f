"""A throwaway single-member etcd on loopback: for the tests, the demo, the benchmarks and the local cluster.

Runs the ``etcd`` binary (Debian's ``etcd-server`` 3.4 works) on free loopback ports
with fast raft timers, so it starts in about 0.1 s. It can be stopped and started
again on the same ports and data directory, which is how tests simulate an etcd
outage: clients see the same endpoint go away and come back with the same data;
``pause()`` / ``resume()`` hang it.

``local_etcd()`` (and the ``etcd`` fixture built on it) runs a fresh one in a temp dir
and always kills it and removes its directory at exit. To share the fixture, import it
in ``conftest.py``: ``from tests.support.etcd import etcd``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

DEFAULT_BINARY = "/usr/bin/etcd"
_POLL_S = 0.02

requires_etcd = pytest.mark.skipif(
    shutil.which(DEFAULT_BINARY) is None and shutil.which("etcd") is None,
    reason="etcd binary not installed (apt-get install etcd-server)",
)


class EtcdStartError(RuntimeError):
    """etcd exited or did not become healthy in time; the message holds its log tail."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now, chosen below the kernel's ephemeral range when possible.

    Outgoing connections take ports from the ephemeral range, so a port outside it
    stays free while etcd is stopped and can be bound again when it restarts.
    """
    low, _ = _ephemeral_range()
    candidates = random.sample(range(10000, low), k=min(50, max(0, low - 10000)))
    for port in [*candidates, 0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError("no free port")


@dataclass(frozen=True, slots=True)
class EtcdServerTls:
    """TLS for the client listener: etcd's certificate, and a CA to require client certificates from."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""  # set: clients must present a certificate this CA signed

    def flags(self) -> list[str]:
        required = ["--client-cert-auth", "--trusted-ca-file", self.client_ca_file] if self.client_ca_file else []
        return ["--cert-file", self.cert_file, "--key-file", self.key_file, *required]


class LocalEtcd:
    """One etcd member on loopback; use as a context manager, or call start/close.

    Args:
        binary: the etcd executable (``KVPOOL_ETCD_BINARY`` overrides the default).
        workdir: directory for the data dir and log; a temporary one (removed at
            close) when None.
        client_port, peer_port: fixed ports; 0 picks free ones at the first start.
        tls: serve clients over TLS (``https://``). Health is then probed on a
            separate plaintext metrics listener on loopback.
    """

    def __init__(
        self,
        binary: str | None = None,
        workdir: str | Path | None = None,
        client_port: int = 0,
        peer_port: int = 0,
        tls: EtcdServerTls | None = None,
    ) -> None:
        self.binary = binary or os.environ.get("KVPOOL_ETCD_BINARY", DEFAULT_BINARY)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="kvpool-etcd-"))
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "etcd.log"
        self.client_port = client_port
        self.peer_port = peer_port
        self.tls = tls
        self.health_port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of the client listener."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def endpoints(self) -> list[str]:
        """The client URL as clients dial it: ``https://`` when serving TLS, else ``host:port``."""
        return [f"https://{self.endpoint}" if self.tls else self.endpoint]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 15.0) -> LocalEtcd:
        """Start etcd (same ports and data dir as before, if it ran before) and wait for /health.

        Raises:
            EtcdStartError: it exited or was not healthy within ``timeout``.
        """
        if self.running:
            return self
        fixed = bool(self.client_port and self.peer_port)
        for attempt in range(1 if fixed else 3):
            if not fixed:
                self.client_port, self.peer_port = free_port(), free_port()
            if self.tls and not (fixed and self.health_port):
                self.health_port = free_port()
            try:
                self._spawn_and_wait(timeout)
                return self
            except EtcdStartError:
                if fixed or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _spawn_and_wait(self, timeout: float) -> None:
        client_url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        argv = [
            self.binary, "--name", "kvpool", "--data-dir", str(self.data_dir),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"kvpool={peer_url}",
            "--heartbeat-interval=10", "--election-timeout=100",
            "--logger=zap", "--log-outputs=stderr",
        ]  # fmt: skip
        if self.tls:
            argv += [*self.tls.flags(), "--listen-metrics-urls", f"http://127.0.0.1:{self.health_port}"]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise EtcdStartError(f"etcd did not become healthy on {self.endpoint}:\n{self.log_tail()}")
            time.sleep(_POLL_S)

    def _healthy(self) -> bool:
        try:
            probed = f"127.0.0.1:{self.health_port}" if self.tls else self.endpoint
            with urllib.request.urlopen(f"http://{probed}/health", timeout=0.5) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit within ``timeout``. Ports and data are kept."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL (resuming it first if paused) and reap."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a hung etcd)."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        """Kill the process and, if the work directory is ours, remove it."""
        self.kill()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalEtcd:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def local_etcd() -> Iterator[LocalEtcd]:
    """A running throwaway etcd; killed and its directory removed on exit, whatever happens."""
    server = LocalEtcd()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def etcd() -> Iterator[LocalEtcd]:
    """A running throwaway etcd per test (see :func:`local_etcd`)."""
    with local_etcd() as server:
        yield server
