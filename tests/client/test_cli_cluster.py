"""kvpoolctl against a real etcd and real daemons: status, drain, config, watch, exit codes.

Each test starts its own etcd (tests.support.etcd) and daemons registered in it, and
stops them all at teardown. kvpoolctl runs as a subprocess, as an operator runs it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from kvpool_client import KVPoolClient
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from tests.client.test_cli import dead_address, kvpoolctl, ok, one_line_error
from tests.support.daemon import DaemonProcess, start_daemon
from tests.support.etcd import LocalEtcd, local_etcd, requires_etcd

pytestmark = [pytest.mark.integration, requires_etcd]

CLUSTER = "cli"
# No repair: the tests put blocks on one node on purpose and count them there.
DAEMON_FLAGS = ("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--no-repair-enabled")

StartNodes = Callable[..., list[DaemonProcess]]


@pytest.fixture
def etcd() -> Iterator[LocalEtcd]:
    with local_etcd() as server:
        yield server


@pytest.fixture
def start_nodes(etcd: LocalEtcd) -> Iterator[StartNodes]:
    """Start daemons registered in ``etcd`` (in parallel); all are stopped at teardown."""
    started: list[DaemonProcess] = []

    def start(*node_ids: str) -> list[DaemonProcess]:
        flags = ("--etcd-endpoints", etcd.endpoint, "--cluster", CLUSTER, *DAEMON_FLAGS)
        with ThreadPoolExecutor(len(node_ids)) as pool:
            daemons = list(pool.map(lambda n: start_daemon("--node-id", n, *flags), node_ids))
        started.extend(daemons)
        return daemons

    yield start
    for daemon in started:
        daemon.stop()
        daemon.remove_files()


def ctl(etcd: LocalEtcd, *args: str) -> subprocess.CompletedProcess[bytes]:
    return kvpoolctl("--etcd", etcd.endpoint, "--cluster", CLUSTER, *args)


def status_json(etcd: LocalEtcd) -> dict[str, dict[str, object]]:
    """The nodes of ``kvpoolctl --json status`` by node id."""
    report = json.loads(ok(ctl(etcd, "--json", "status")))
    return {node["node_id"]: node for node in report["nodes"]}


def blocks(count: int, tag: bytes) -> tuple[list[BlockKey], list[bytes]]:
    keys = [BlockKey("cli-cluster", tag + i.to_bytes(4, "big") + bytes(28)) for i in range(count)]
    return keys, [os.urandom(1024 + i) for i in range(count)]


def test_status_lists_every_node_from_etcd_with_live_stats(etcd: LocalEtcd, start_nodes: StartNodes) -> None:
    daemons = start_nodes("node-a", "node-b", "node-c")
    keys, data = blocks(5, b"s")
    with KVPoolClient([daemons[0].address]) as client:
        assert client.put(keys, data).statuses == (ErrorCode.OK,) * 5

    lines = ok(ctl(etcd, "status")).splitlines()
    assert lines[0] == f"cluster {CLUSTER}: block_size=16 replicas=1 write_quorum=1 placement_version=1"
    assert lines[2].split()[:6] == ["NODE", "STATE", "ADDRESS", "DATA", "WEIGHT", "CAPACITY"]
    assert lines[2].split()[-1] == "METRICS", lines[2]
    rows = lines[3:]
    assert [row.split()[0] for row in rows] == ["node-a", "node-b", "node-c"]
    for row, daemon in zip(rows, daemons, strict=True):
        assert f"  active  {daemon.address}  tcp://{daemon.data_address} +shm  " in row
        assert "16.0 MiB" in row
        assert row.endswith(f"  http://127.0.0.1:{daemon.metrics_port}/metrics"), row
    assert rows[0].split()[10] == "5"  # node-a holds the 5 blocks (cells 7-8, 9-10 are sizes)

    nodes = status_json(etcd)
    assert sorted(nodes) == ["node-a", "node-b", "node-c"]
    a = nodes["node-a"]
    assert a["state"] == a["live_state"] == "active" and a["reachable"] is True
    assert a["address"] == daemons[0].address and a["data_endpoints"]["tcp"] == daemons[0].data_address
    assert set(a["data_endpoints"]) == {"tcp", "shm"}, a["data_endpoints"]
    assert a["blocks"] == 5 and a["capacity_bytes"] == 16 << 20 and a["weight"] == 1.0
    assert nodes["node-b"]["blocks"] == 0 and nodes["node-b"]["uptime_s"] >= 0
    assert nodes["node-b"]["metrics_url"] == f"http://127.0.0.1:{daemons[1].metrics_port}/metrics"

    # A registered node that stops answering keeps its row, marked, and the exit code is 3.
    daemons[2].process.send_signal(signal.SIGSTOP)
    try:
        hung = ctl(etcd, "--timeout", "0.5", "status")
    finally:
        daemons[2].process.send_signal(signal.SIGCONT)
    assert f"{daemons[2].address} did not answer in time" in one_line_error(hung, 3)
    assert "active, unreachable" in hung.stdout.decode().splitlines()[-1]


def test_drain_refuses_writes_and_undrain_restores_them(etcd: LocalEtcd, start_nodes: StartNodes) -> None:
    drained, _ = start_nodes("node-a", "node-b")
    out = ok(ctl(etcd, "drain", "node-a", "--wait"))
    assert out.startswith(f"node-a ({drained.address}): active -> draining")
    assert status_json(etcd)["node-a"]["state"] == "draining"

    keys, data = blocks(2, b"d")
    with KVPoolClient([drained.address]) as client:
        assert client.put(keys, data).statuses == (ErrorCode.DRAINING,) * 2

    undrained = json.loads(ok(ctl(etcd, "--json", "undrain", drained.address, "--wait")))
    assert undrained["node_id"] == "node-a" and undrained["previous_state"] == "draining"
    assert undrained["state"] == "active"
    assert status_json(etcd)["node-a"]["state"] == "active"
    with KVPoolClient([drained.address]) as client:
        assert client.put(keys, data).statuses == (ErrorCode.OK,) * 2

    unknown = one_line_error(ctl(etcd, "drain", "node-z"), 4)
    assert "no node 'node-z' in cluster 'cli' (known: node-a, node-b)" in unknown
    assert "cannot reach" in one_line_error(ctl(etcd, "drain", dead_address()), 3)


def test_drain_with_handoff_copies_blocks_to_the_other_nodes(etcd: LocalEtcd, start_nodes: StartNodes) -> None:
    source, *others = start_nodes("node-a", "node-b", "node-c")
    keys, data = blocks(24, b"h")
    with KVPoolClient([source.address]) as client:
        assert client.put(keys, data).statuses == (ErrorCode.OK,) * len(keys)

    report = json.loads(ok(ctl(etcd, "--json", "drain", "node-a", "--handoff", "--wait", "--wait-timeout", "20")))
    assert report["state"] == "draining" and report["handoff"] is True
    assert report["handoff_copies"] == len(keys) and report["handoff_failures"] == 0

    held = []
    for other in others:
        with KVPoolClient([other.address]) as client:
            held.append(client.exists(keys))
    assert all(any(on_node) for on_node in zip(*held, strict=True)), held
    assert all(sum(h) > 0 for h in held)  # spread over both, not piled on one
    with KVPoolClient([source.address]) as client:  # still readable where they were
        assert all(client.exists(keys))


def test_config_get_and_set(etcd: LocalEtcd) -> None:
    missing = one_line_error(ctl(etcd, "config", "get"), 4)
    assert f"cluster '{CLUSTER}' has no config yet" in missing

    out = ok(ctl(etcd, "config", "set", "replicas=2"))
    assert out.splitlines()[0] == f"cluster {CLUSTER}: config created: replicas 1 -> 2"
    got = json.loads(ok(ctl(etcd, "--json", "config", "get")))
    assert got == {
        "cluster": CLUSTER,
        "config": {"block_size": 16, "replicas": 2, "write_quorum": 1, "placement_version": 1},
    }
    assert "replicas           2" in ok(ctl(etcd, "config", "get"))

    both = json.loads(ok(ctl(etcd, "--json", "config", "set", "replicas=3", "write_quorum=2")))
    assert both["changed"] == {"replicas": [2, 3], "write_quorum": [1, 2]}

    invalid = one_line_error(ctl(etcd, "config", "set", "write_quorum=4"), 2)
    assert "write_quorum must be in 1..replicas (3), not 4" in invalid
    assert json.loads(ok(ctl(etcd, "--json", "config", "get")))["config"]["write_quorum"] == 2  # unchanged
    unknown = ctl(etcd, "config", "set", "colour=1")
    assert unknown.returncode == 2 and "unknown setting 'colour'" in unknown.stderr.decode()


def test_watch_sees_a_node_join_and_leave(etcd: LocalEtcd, start_nodes: StartNodes) -> None:
    ok(ctl(etcd, "config", "set", "replicas=1"))  # else the first daemon writing it is an event too
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
    argv = [
        sys.executable,
        "-m",
        "kvpool_client.admin.cli",
        "--etcd",
        etcd.endpoint,
        "--cluster",
        CLUSTER,
        "--json",
        "watch",
        "--count",
        "4",
        "--timeout",
        "15",
    ]
    watcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean)
    try:
        assert watcher.stdout is not None
        snapshot = json.loads(watcher.stdout.readline())  # printed once the watch is live
        assert snapshot["event"] == "snapshot" and snapshot["nodes"] == []
        (daemon,) = start_nodes("node-w")
        assert daemon.stop() == 0
        out, err = watcher.communicate(timeout=15)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["event"], e["node_id"]) for e in events] == [
        ("joined", "node-w"),
        ("state", "node-w"),
        ("state", "node-w"),
        ("left", "node-w"),
    ]
    assert events[0]["node"]["address"] == daemon.address
    assert [e["changed"]["state"] for e in events[1:3]] == [["joining", "active"], ["active", "draining"]]

    text = ctl(etcd, "watch", "--count", "1", "--timeout", "0.5")
    assert text.returncode == 5 and "saw 0 of 1 changes in 0.5 s" in text.stderr.decode()
    assert text.stdout.decode().startswith(f"watching cluster {CLUSTER} (revision ")


@pytest.mark.parametrize("args", [("status",), ("config", "get"), ("watch",), ("drain", "node-a"), ("stats",)])
def test_unreachable_etcd_exits_3_with_a_hint(args: tuple[str, ...]) -> None:
    dead = dead_address()
    line = one_line_error(kvpoolctl("--etcd", dead, *args), 3)
    assert (
        line == f"kvpoolctl: error: cannot reach etcd at {dead}: is etcd running? set --etcd or KVPOOL_ETCD_ENDPOINTS"
    )


def test_etcd_settings_are_checked() -> None:
    env = {"KVPOOL_ETCD_ENDPOINTS": "nohost"}
    assert "expected host:port" in kvpoolctl("status", env=env).stderr.decode()
    assert "config get reads the cluster from etcd" in one_line_error(kvpoolctl("config", "get"), 2)
    assert "invalid cluster name" in kvpoolctl("--cluster", "a/b", "status").stderr.decode()


class _RefusingNode(kvpool_pb2_grpc.KVPoolServicer):
    """A control plane that answers like a node but refuses every state change."""

    def GetServerInfo(self, request: pb.GetServerInfoRequest, context: grpc.ServicerContext) -> pb.ServerInfo:
        return pb.ServerInfo(node_id="stub", state="joining")

    def GetStats(self, request: pb.GetStatsRequest, context: grpc.ServicerContext) -> pb.Stats:
        return pb.Stats(node_id="stub")

    def SetState(self, request: pb.SetStateRequest, context: grpc.ServicerContext) -> pb.ServerInfo:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"node stub: cannot go from joining to {request.state}")


def test_a_refused_transition_exits_2_with_the_reason() -> None:
    # The daemon's life cycle accepts every draining/active move today, so a stub plays the refusing node.
    server = grpc.server(ThreadPoolExecutor(2))
    kvpool_pb2_grpc.add_KVPoolServicer_to_server(_RefusingNode(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        line = one_line_error(kvpoolctl("undrain", f"127.0.0.1:{port}", "--nodes", f"127.0.0.1:{port}"), 2)
    finally:
        server.stop(None)
    assert line == (
        f"kvpoolctl: error: 127.0.0.1:{port} refused to become active: node stub: cannot go from joining to active"
    )
