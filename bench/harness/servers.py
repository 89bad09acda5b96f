"""The servers a benchmark run talks to: a kvpool daemon, redis-server and a raw TCP stream server.

Each is a context manager that yields the server's :class:`Endpoint` (``None`` where a
server cannot run: a missing ``redis-server`` is a missing baseline, not a failure)
and always stops its process on the way out, exceptions and Ctrl-C included.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from bench.harness import sockio
from bench.harness.procs import ignore_sigint, start_shielded
from bench.harness.workload import MAX_WORKERS, RING_BYTES, region

REPO_ROOT = Path(__file__).resolve().parents[2]
_START_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: str  # host:port
    pid: int  # the serving process, for CPU accounting
    also: tuple[int, ...] = ()  # other server processes whose CPU counts as the server's (Mooncake's master)


# -- kvpool ---------------------------------------------------------------------


@contextmanager
def kvpool_daemon(capacity: str, slab_size: str) -> Iterator[Endpoint]:
    """A kvpool daemon on ephemeral loopback ports; yields its control address."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from tests.support.daemon import start_daemon

    daemon = start_daemon("--dram-capacity", capacity, "--slab-size", slab_size, "--log-level", "warning")
    try:
        yield Endpoint(daemon.address, daemon.process.pid)
    finally:
        code = daemon.stop()
        if code not in (0, -signal.SIGTERM):
            print(f"kvpool daemon exited with {code}; log:\n{daemon.log()[-4000:]}", file=sys.stderr)
        shutil.rmtree(daemon.workdir, ignore_errors=True)


# -- redis ----------------------------------------------------------------------


@contextmanager
def redis_server(maxmemory: str, install: bool) -> Iterator[Endpoint | None]:
    """Debian's redis-server on a free loopback port, persistence off; ``None`` if unavailable."""
    binary = _redis_binary(install)
    if binary is None:
        yield None
        return
    port = _free_port()
    argv = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
        "--save", "", "--appendonly", "no", "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru",
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, process)
        yield Endpoint(f"127.0.0.1:{port}", process.pid)
    finally:
        stop_process(process)


def _redis_binary(install: bool) -> str | None:
    found = shutil.which("redis-server")
    if found or not install or shutil.which("apt-get") is None:
        return found
    print("redis-server not found: installing Debian's redis-server with apt-get", file=sys.stderr)
    install_cmd = ["apt-get", "install", "-y", "redis-server"]
    if subprocess.run(install_cmd, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True)
        subprocess.run(install_cmd, capture_output=True)
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"redis-server did not listen on {port} within {_START_TIMEOUT_S}s")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# -- raw TCP stream -------------------------------------------------------------


@contextmanager
def socket_server() -> Iterator[Endpoint]:
    """The raw socket baseline's server in its own (spawned) process; yields its address."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=serve_stream, args=(child,), name="bench-socket-server", daemon=True)
    start_shielded(process)
    child.close()
    try:
        if not parent.poll(_START_TIMEOUT_S * 3):
            raise RuntimeError("socket server did not start")
        yield Endpoint(f"127.0.0.1:{parent.recv()}", process.pid or 0)
    finally:
        parent.close()
        process.terminate()
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)


def serve_stream(pipe: Connection) -> None:
    """Process body: hold every worker's region and answer requests, a thread per connection.

    A GET names blocks by offset and gets their bytes back with one ``sendmsg``; a PUT
    sends blocks that land in a per-connection ring and gets one ack byte.
    """
    ignore_sigint()
    threading.Thread(target=_exit_with_parent, args=(pipe,), daemon=True).start()
    blocks = np.concatenate([region(w) for w in range(MAX_WORKERS)])
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    pipe.send(listener.getsockname()[1])
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=_serve_connection, args=(sock, blocks.data), daemon=True).start()


def _exit_with_parent(pipe: Connection) -> None:
    """End this process as soon as the benchmark's end of the pipe closes, however it died."""
    with suppress(EOFError, OSError):
        pipe.recv()
    os._exit(0)


def _serve_connection(sock: socket.socket, blocks: memoryview) -> None:
    sockio.tune(sock)
    sink = np.ones(RING_BYTES, dtype=np.uint8).data
    position = 0
    with sock:
        while True:
            try:
                op, size, count = sockio.HEADER.unpack(sockio.recv_exact(sock, sockio.HEADER.size))
            except ConnectionError:
                return
            if op == sockio.GET:
                offsets = np.frombuffer(sockio.recv_exact(sock, 8 * count), dtype="<u8").tolist()
                sockio.send_views(sock, [blocks[o : o + size] for o in offsets])
                continue
            targets = []
            for _ in range(count):
                position = 0 if position + size > len(sink) else position
                targets.append(sink[position : position + size])
                position += size
            sockio.recv_views(sock, targets)
            sock.sendall(sockio.ACK)
