"""The daemon's life cycle as an operator sees it: start, health, signals, shutdown, restart."""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvpool_client import AsyncKVPoolClient, BlockKey, ErrorCode, KVPoolClient
from kvpool_client.core.wire import GetRequest, Op, StatusResponse, encode
from kvpool_client.core.wire.generations import GRANULE, GenerationsHeader
from kvpool_client.core.wire.published import aligned_offset, table_bytes
from kvpool_server.tiers.shared_index import entries_for
from tests.support.daemon import DaemonProcess
from tests.support.rawwire import RawConnection, put_frame
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

MiB = 1 << 20
NS = "lifecycle@fp16@L1@tp0of1"
SERVER_BIN = Path(sys.executable).with_name("kvpool-server")


def arena_files(pid: int) -> list[str]:
    return glob.glob(f"/dev/shm/kvpool-{pid}-*")


@pytest.fixture
def leaked_arenas() -> Iterator[list[int]]:
    """Pids whose arena file a test may leave behind on failure; removed at teardown."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        for path in arena_files(pid):
            os.unlink(path)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
    return {**env, **extra}


def server_argv(*args: str) -> list[str]:
    """The installed console script when present, else the module."""
    return [str(SERVER_BIN), *args] if SERVER_BIN.exists() else [sys.executable, "-m", "kvpool_server.app", *args]


def run_server(argv: list[str], env: dict[str, str]) -> tuple[int, str, str, int]:
    """Run a daemon expected to exit by itself: (exit code, stdout, stderr, pid)."""
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"kvpool-server did not exit by itself\n{out}{err}")
    return proc.returncode, out, err, proc.pid


def free_ports(n: int) -> list[int]:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    try:
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_refused(port: int, within: float) -> bool:
    """Whether connections to ``port`` are refused (the listener closed) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.02)
    return False


def health(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def round_trip(daemon: DaemonProcess, client: KVPoolClient, size: int = 64 << 10) -> BlockKey:
    key, data = BlockKey(NS, os.urandom(32)), os.urandom(size)
    assert client.put([key], [data]).statuses == (ErrorCode.OK,), daemon.log()
    assert bytes(client.get([key]).buffers[0]) == data, daemon.log()
    return key


# -- signals -----------------------------------------------------------------------------------

GRACE_S = 3.0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_stops_cleanly(daemon_factory: Callable[..., DaemonProcess], sig: signal.Signals) -> None:
    daemon = daemon_factory("--dram-capacity", "32MiB", "--slab-size", "1MiB", "--shutdown-grace-s", str(GRACE_S))
    files = arena_files(daemon.process.pid)
    assert len(files) == 1, f"expected one arena file, found {files}"
    generations = GenerationsHeader(arena_id=0, granule=GRANULE, count=32 * MiB // GRANULE).nbytes
    index = table_bytes(entries_for(-1, 32 * MiB))
    assert os.path.getsize(files[0]) == aligned_offset(32 * MiB + generations) + index, (
        "the arena, then its slot generations, then its shared index on a cache line"
    )
    with KVPoolClient([daemon.address]) as client:  # idle pooled connections stay open across the stop
        round_trip(daemon, client)
        started = time.monotonic()
        code = daemon.stop(sig, timeout=GRACE_S + 10)
        took = time.monotonic() - started
    assert code == 0, f"exit code {code} after {sig.name}\n{daemon.log()}"
    assert took < GRACE_S, f"took {took:.1f}s to stop, grace is {GRACE_S}s\n{daemon.log()}"
    assert arena_files(daemon.process.pid) == [], "the shared-memory arena was left behind"
    assert not glob.glob(f"/dev/shm/kvpool-marks-{daemon.process.pid}-*"), "the hit marks were left behind"
    assert "stopped" in daemon.log() and "Traceback" not in daemon.log(), daemon.log()


def test_sigterm_lets_in_flight_put_finish(daemon_factory: Callable[..., DaemonProcess]) -> None:
    daemon = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--shutdown-grace-s", "5")
    blocks = [(os.urandom(32), os.urandom(MiB)) for _ in range(4)]
    frame = put_frame(7, NS, blocks)
    with RawConnection(daemon.data_address) as conn:
        conn.send(frame[: len(frame) // 2])  # half of a 4 MiB put is in the daemon
        wait_put_begun(daemon)
        daemon.process.send_signal(signal.SIGTERM)
        assert wait_refused(daemon.data_port, within=5.0), f"still accepting after SIGTERM\n{daemon.log()}"
        assert health(daemon.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        time.sleep(0.3)  # a deliberate stall of the peer mid-put, well within the grace
        assert daemon.process.poll() is None, f"exited with a put in flight\n{daemon.log()}"
        conn.send(frame[len(frame) // 2 :])
        answer = conn.read_frame().message
    assert answer == StatusResponse(7, Op.PUT, [ErrorCode.OK] * 4), f"{answer!r}\n{daemon.log()}"
    assert daemon.process.wait(5) == 0, daemon.log()
    assert arena_files(daemon.process.pid) == []


def wait_put_begun(daemon: DaemonProcess) -> None:
    """Wait until the daemon has read the header of the first put sent to it: the put is in flight there."""
    with KVPoolClient([daemon.address]) as client:
        wait_until(
            lambda: client.stats(daemon.address).counters["requests_put"],
            lambda puts: puts >= 1,
            "the daemon to read the put's header",
        )


def _stall_mid_put(daemon: DaemonProcess) -> RawConnection:
    conn = RawConnection(daemon.data_address)
    frame = put_frame(9, NS, [(os.urandom(32), os.urandom(MiB))])
    conn.send(frame[: len(frame) // 2])
    wait_put_begun(daemon)
    return conn


def _stall_mid_get(daemon: DaemonProcess) -> RawConnection:
    """A reader that asks for 24 MiB and never reads: the daemon blocks sending from the arena."""
    keys = [BlockKey(NS, os.urandom(32)) for _ in range(24)]
    with KVPoolClient([daemon.address]) as client:
        assert client.put(keys, [os.urandom(MiB)] * 24).stored == 24
    conn = RawConnection(daemon.data_address)
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.send(encode(GetRequest(9, NS, [k.hash for k in keys])))
    assert conn.sock.recv(1, socket.MSG_PEEK), "no reply began"  # the daemon is sending, and will block
    return conn


@pytest.mark.parametrize("stall", [_stall_mid_put, _stall_mid_get], ids=["mid-put", "mid-get"])
def test_shutdown_past_grace_with_stalled_peer_still_cleans_up(
    daemon_factory: Callable[..., DaemonProcess],
    leaked_arenas: list[int],
    stall: Callable[[DaemonProcess], RawConnection],
) -> None:
    daemon = daemon_factory("--dram-capacity", "32MiB", "--slab-size", "1MiB", "--shutdown-grace-s", "0.5")
    leaked_arenas.append(daemon.process.pid)
    conn = stall(daemon)
    try:
        code = daemon.stop(signal.SIGTERM, timeout=10)
    finally:
        conn.close()
    leftovers = arena_files(daemon.process.pid)
    assert (code, leftovers) == (0, []), f"exit {code}, arena files left {leftovers}\n{daemon.log()}"


# -- configuration errors ----------------------------------------------------------------------

BAD_CONFIGS = {
    "slab-not-page-multiple": (["--slab-size", "1000"], {}, "--slab-size"),
    "capacity-not-a-size": ([], {"KVPOOL_DRAM_CAPACITY": "abc"}, "KVPOOL_DRAM_CAPACITY"),
    "slab-over-capacity": ([], {"KVPOOL_DRAM_CAPACITY": "4MiB", "KVPOOL_SLAB_SIZE": "8MiB"}, "KVPOOL_SLAB_SIZE"),
    "misspelt-flag": (["--dram-capasity", "1GiB"], {}, "--dram-capacity"),
    "zero-timeout": (["--io-timeout-s", "0"], {}, "--io-timeout-s"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_invalid_config_exits_2_naming_the_key(case: str) -> None:
    args, env, named = BAD_CONFIGS[case]
    # A small arena (and slabs that fit it) unless the case sets the capacity itself (a flag would
    # override the environment); a case's own --slab-size comes later and wins.
    capacity = [] if "KVPOOL_DRAM_CAPACITY" in env else ["--dram-capacity", "8MiB", "--slab-size", "1MiB"]
    argv = server_argv("--grpc-port", "0", "--data-port", "0", *capacity, *args)
    code, out, err, pid = run_server(argv, clean_env(**env))
    assert code == 2, f"exit {code}\nstdout: {out}\nstderr: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvpool-server: configuration error:"), err
    assert named in lines[0], f"the message does not name {named}: {lines[0]}"
    assert "Traceback" not in err and out == ""
    assert arena_files(pid) == [], "an arena was created before the config was validated"


# -- start-up failures, health, restart --------------------------------------------------------


@pytest.mark.parametrize(
    "which",
    [
        "--grpc-port",
        "--data-port",
    ],
)
def test_port_in_use_fails_start_cleanly(which: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        other = "--data-port" if which == "--grpc-port" else "--grpc-port"
        argv = server_argv(
            which, str(port), other, "0", "--dram-capacity", "8MiB", "--slab-size", "1MiB", "--log-format", "text"
        )
        code, out, err, pid = run_server(argv, clean_env())
    output = out + err
    assert code == 1, f"exit {code}\n{output}"
    assert arena_files(pid) == [], "the arena of a daemon that could not start was left behind"
    assert "cannot start" in output and str(port) in output, output
    assert "DRAM arena ready" not in output, "the port is checked before the arena is mapped"
    assert "Traceback" not in output, output


def test_health_service_answers_serving(daemon: DaemonProcess) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health(daemon.address) == serving
    assert health(daemon.address, "kvpool.v1.KVPool") == serving
    with pytest.raises(grpc.RpcError) as raised:
        health(daemon.address, "no.such.Service")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_restart_on_same_fixed_ports(daemon_factory: Callable[..., DaemonProcess]) -> None:
    grpc_port, data_port = free_ports(2)
    flags = (
        "--grpc-port",
        str(grpc_port),
        "--data-port",
        str(data_port),
        "--dram-capacity",
        "8MiB",
        "--slab-size",
        "1MiB",
        "--shutdown-grace-s",
        "2",
    )
    first = daemon_factory(*flags)
    assert (first.grpc_port, first.data_port) == (grpc_port, data_port)
    with KVPoolClient([first.address]) as client:
        old_key = round_trip(first, client)
        # Stop while the client still holds connections: the daemon closes first, so its
        # side of them sits in TIME_WAIT on the fixed ports when the next one binds.
        assert first.stop() == 0, first.log()
    second = daemon_factory(*flags)
    assert (second.grpc_port, second.data_port) == (grpc_port, data_port)
    assert health(second.address) == health_pb2.HealthCheckResponse.SERVING
    with KVPoolClient([second.address]) as client:
        assert client.exists([old_key]) == [False], "a restarted DRAM tier starts empty"
        round_trip(second, client)
    assert second.stop() == 0, second.log()
    assert arena_files(first.process.pid) == arena_files(second.process.pid) == []


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_pooled_client_survives_daemon_restart(daemon_factory: Callable[..., DaemonProcess], flavour: str) -> None:
    grpc_port, data_port = free_ports(2)
    flags = (
        "--grpc-port",
        str(grpc_port),
        "--data-port",
        str(data_port),
        "--dram-capacity",
        "8MiB",
        "--slab-size",
        "1MiB",
    )
    first = daemon_factory(*flags)
    key, data = BlockKey(NS, os.urandom(32)), os.urandom(4096)

    def restart() -> None:
        assert first.stop() == 0, first.log()
        daemon_factory(*flags)

    if flavour == "sync":
        with KVPoolClient([first.address]) as client:
            round_trip(first, client)  # leaves an idle pooled connection to the first daemon
            restart()
            statuses = client.put([key], [data]).statuses
    else:

        async def scenario() -> tuple[ErrorCode, ...]:
            async with AsyncKVPoolClient([first.address]) as client:
                assert (await client.put([BlockKey(NS, os.urandom(32))], [data])).stored == 1
                restart()
                return (await client.put([key], [data])).statuses

        statuses = asyncio.run(scenario())
    assert statuses == (ErrorCode.OK,), f"first put after the restart: {statuses}"


def test_arena_of_a_killed_daemon_is_removed_by_the_next_start(
    daemon_factory: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """SIGKILL leaves the arena and its shared index's hit marks in tmpfs; the next daemon on the node reclaims them."""
    shm = str(tmp_path)
    first = daemon_factory("--dram-capacity", "8MiB", "--slab-size", "1MiB", "--shm-dir", shm)
    left = sorted(tmp_path.glob("kvpool-*"))
    assert [path.name.split("-")[1] for path in left] == [str(first.process.pid), "marks"], left
    first.stop(signal.SIGKILL)
    assert all(path.exists() for path in left), "SIGKILL cannot remove the arena: the next start must"
    second = daemon_factory("--dram-capacity", "8MiB", "--slab-size", "1MiB", "--shm-dir", shm)
    remaining = list(tmp_path.glob("kvpool-*"))
    assert not any(path.exists() for path in left) and len(remaining) == 2, (remaining, second.log())
