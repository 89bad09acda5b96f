"""Tenants against a real daemon: what one tenant can and cannot do to another's blocks, on every path."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import yaml

from kvpool_client import BlockKey, ClientConfig, ErrorCode, KVPoolClient
from kvpool_client.core.auth import Credentials, open_channel
from kvpool_client.core.channels.nixl_agent import import_error as nixl_import_error
from kvpool_client.core.errors import AuthenticationError, PermissionDenied
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.core.wire import (
    ErrorResponse,
    HelloRequest,
    HelloResponse,
    PeerRequest,
    PingRequest,
    PingResponse,
    ReserveRequest,
)
from tests.server.test_metrics_daemon import scrape
from tests.support.daemon import DaemonProcess
from tests.support.rawwire import RawConnection
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

CLUSTER, A, B, READER, SLOW = (
    f"{who}-token-0123456789abcdef".encode() for who in ("cluster", "team-a", "team-b", "reader", "slow")
)
A_NS, B_NS = "team-a.llama@test", "team-b.qwen@test"
KiB = 1 << 10


def tenants(b_token: bytes = B) -> dict[str, object]:
    return {
        "tenants": {
            "team-a": {"token": A.decode(), "namespaces": ["team-a.*"], "rights": ["read", "write", "delete"]},
            "team-b": {
                "token_sha256": hashlib.sha256(b_token).hexdigest(),
                "namespaces": ["team-b.*"],
                "rights": ["read", "write", "delete"],
                "quotas": {"dram": "256KiB"},
            },
            "slow": {
                "token": SLOW.decode(),
                "namespaces": ["slow.*"],
                "rights": ["read", "write"],
                "quotas": {"rate": "4MiB"},
            },
            "reader": {
                "token": READER.decode(),
                "namespaces": ["team-a.*"],
                "rights": ["read"],
                "quotas": {"connections": 2},
            },
        }
    }


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    token, listing = tmp_path / "token", tmp_path / "tenants.yaml"
    token.write_bytes(CLUSTER)
    listing.write_text(yaml.safe_dump(tenants()))
    return token, listing


@pytest.fixture
def node(daemon_factory: Callable[..., DaemonProcess], files: tuple[Path, Path]) -> DaemonProcess:
    token, listing = files
    return daemon_factory(
        "--dram-capacity",
        "16MiB",
        "--slab-size",
        "1MiB",
        "--auth-token-file",
        str(token),
        "--auth-tenants-file",
        str(listing),
    )


def connect(node: DaemonProcess, token: bytes, transport: str = "auto") -> KVPoolClient:
    return KVPoolClient(config=ClientConfig(nodes=(node.address,), auth_token=token, transport=transport))


def keys(namespace: str, count: int) -> list[BlockKey]:
    return [BlockKey(namespace, os.urandom(32)) for _ in range(count)]


def stub_call(node: DaemonProcess, token: bytes, method: str, request: object) -> object:
    with open_channel(node.address, Credentials(token)) as channel:
        return getattr(kvpool_pb2_grpc.KVPoolStub(channel), method)(request, timeout=10)


def test_a_tenant_cannot_read_write_or_delete_another_tenant_s_blocks(node: DaemonProcess) -> None:
    mine, absent = keys(A_NS, 4), keys(A_NS, 2)
    blocks = [os.urandom(8192) for _ in mine]
    with connect(node, A) as a, connect(node, B) as b, connect(node, READER) as reader:
        assert a.put(mine, blocks).stored == 4
        got = b.get(mine + absent)
        assert got.statuses == (ErrorCode.NOT_FOUND,) * 6, "another tenant's blocks look absent"
        assert b.get(mine[:1]).statuses == (ErrorCode.NOT_FOUND,), "the one-key get's path too"
        assert b.exists(mine) == [False] * 4 and b.lookup(mine) == 0
        assert set(b.put(mine, blocks).statuses) == {ErrorCode.PERMISSION_DENIED}
        written = b.put(keys(A_NS, 2), blocks[:2])
        assert set(written.statuses) == {ErrorCode.PERMISSION_DENIED} and written.stored == 0
        with pytest.raises(PermissionDenied):
            b.delete(mine)
        assert a.exists(mine) == [True] * 4, "nothing of A's was touched"
        read = reader.get(mine)
        assert read.ok and [bytes(x) for x in read.buffers] == blocks, "a read-only tenant reads"
        assert set(reader.put(keys(A_NS, 1), blocks[:1]).statuses) == {ErrorCode.PERMISSION_DENIED}
        with pytest.raises(PermissionDenied):
            reader.delete(mine[:1])
        assert a.delete(mine[:1]) == [True]


def test_a_tenant_s_control_calls_keep_to_its_rights(node: DaemonProcess) -> None:
    mine = keys(A_NS, 2)
    with connect(node, A) as a:
        assert a.put(mine, [os.urandom(4096) for _ in mine]).stored == 2
        wire = [k.hash for k in mine]
        present = stub_call(node, B, "Exists", pb.KeysRequest(namespace=A_NS, hashes=wire))
        assert list(present.present) == [False, False]  # type: ignore[attr-defined]
        own = stub_call(node, A, "Exists", pb.KeysRequest(namespace=A_NS, hashes=wire))
        assert list(own.present) == [True, True]  # type: ignore[attr-defined]
        for token, method, request in [
            (B, "Delete", pb.KeysRequest(namespace=A_NS, hashes=wire)),
            (B, "FlushNamespace", pb.FlushNamespaceRequest(namespace=A_NS)),
            (A, "FlushNamespace", pb.FlushNamespaceRequest(model="team-a.llama")),  # a model: not one at a time
            (A, "SetState", pb.SetStateRequest(state="draining")),
            (A, "GetStats", pb.GetStatsRequest()),
        ]:
            with pytest.raises(grpc.RpcError) as refused:
                stub_call(node, token, method, request)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, (method, refused.value)
        listed = stub_call(node, B, "ListNamespaces", pb.ListNamespacesRequest())
        assert [row.namespace for row in listed.namespaces] == [], "B does not see A's namespaces"  # type: ignore[attr-defined]
        assert A_NS in [row.namespace for row in a.namespaces(node.address)]
        assert a.flush_namespace(A_NS) == 2, "a tenant flushes its own namespace"
        with connect(node, CLUSTER) as cluster:
            assert cluster.stats(node.address).counters["requests_put"] >= 1, "the cluster's token may do everything"


def test_the_same_node_path_is_the_cluster_token_s_only(node: DaemonProcess) -> None:
    """The arena and its published index hold every namespace: a tenant's client reads over the wire."""
    with connect(node, A) as a, connect(node, CLUSTER) as cluster:
        assert cluster.transport(node.address) == "shm"
        assert a.transport(node.address) == "tcp"
        info = stub_call(node, A, "GetServerInfo", pb.GetServerInfoRequest())
        assert not info.HasField("shared_arena")  # type: ignore[attr-defined]
        assert {e.transport for e in info.endpoints} == {"tcp"}  # type: ignore[attr-defined]


@pytest.mark.skipif(nixl_import_error() is not None, reason="nixl cannot be imported")
def test_the_one_sided_plane_is_the_cluster_token_s_only(
    daemon_factory: Callable[..., DaemonProcess], files: tuple[Path, Path]
) -> None:
    """PEER and RESERVE reach the whole arena (a reserved slot still holds an evicted block's bytes)."""
    token, listing = files
    flags = ("--auth-token-file", str(token), "--auth-tenants-file", str(listing), "--nixl-enabled")
    node = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", *flags)
    with RawConnection(node.data_address) as raw:
        assert isinstance(raw.request(HelloRequest(1, A)).message, HelloResponse)
        for request in (PeerRequest(2), ReserveRequest(3, A_NS, [os.urandom(32)], [4096])):
            answer = raw.request(request).message
            assert isinstance(answer, ErrorResponse) and answer.code == ErrorCode.PERMISSION_DENIED, answer
        assert raw.ping(), "the connection goes on"


def test_a_tenant_s_puts_evict_its_own_blocks_past_its_quota_never_another_s(node: DaemonProcess) -> None:
    theirs = keys(A_NS, 32)
    mine = [keys(f"team-b.m{i % 2}@test", 8) for i in range(8)]  # B: 1 MiB over two namespaces, 128 KiB a put
    with connect(node, A) as a, connect(node, B) as b, connect(node, CLUSTER) as cluster:
        assert a.put(theirs, [os.urandom(16 * KiB) for _ in theirs]).stored == 32
        for batch in mine:
            assert b.put(batch, [os.urandom(16 * KiB) for _ in batch]).stored == len(batch)
        assert a.exists(theirs) == [True] * 32, "another tenant's puts evicted none of A's blocks"
        held = sum(row.bytes for row in cluster.namespaces(node.address) if row.namespace.startswith("team-b."))
        assert 0 < held <= 256 * KiB, f"B holds {held} bytes over its two namespaces"


def test_a_tenant_with_a_byte_rate_is_served_at_that_rate_and_correctly(node: DaemonProcess) -> None:
    """4 MiB/s: 16 MiB of puts and gets, 1 MiB a request, take 3.6 s at least (a request's bytes are paid
    for before the next one is read; its burst is 0.4 MiB); load only adds to that."""
    batches = [keys("slow.m@test", 4) for _ in range(8)]
    blocks = [os.urandom(256 * KiB) for _ in range(4)]
    with connect(node, SLOW) as slow:
        started = time.monotonic()
        for batch in batches:
            assert slow.put(batch, blocks).stored == 4
        got = [slow.get(batch) for batch in batches]
        took = time.monotonic() - started
    assert all(g.ok and [bytes(b) for b in g.buffers] == blocks for g in got)
    assert took >= 3.0, f"16 MiB moved in {took:.2f} s at 4 MiB/s"


def test_a_tenant_holds_at_most_its_connections(node: DaemonProcess) -> None:
    def hello(raw: RawConnection) -> object:
        return raw.request(HelloRequest(1, READER)).message

    with RawConnection(node.data_address) as first, RawConnection(node.data_address) as second:
        assert isinstance(hello(first), HelloResponse) and isinstance(hello(second), HelloResponse)
        with RawConnection(node.data_address) as third:
            refused = hello(third)
            assert isinstance(refused, ErrorResponse) and refused.code == ErrorCode.OVERLOADED, refused
            assert third.closed_by_peer(within=5.0)
        with connect(node, A) as a:  # another tenant is not held by this one's cap
            assert a.put(keys(A_NS, 1), [b"a" * 4096]).stored == 1

    def admitted() -> bool:
        with RawConnection(node.data_address) as again:
            return isinstance(hello(again), HelloResponse)

    wait_until(admitted, bool, "a connection admitted once the others closed")


def test_a_rotated_credentials_file_takes_effect_without_a_restart(
    node: DaemonProcess, files: tuple[Path, Path]
) -> None:
    rotated = b"team-b-rotated-token-0123456789"
    with RawConnection(node.data_address) as opened:  # proved the old token before the rotation
        assert isinstance(opened.request(HelloRequest(1, B)).message, HelloResponse) and opened.ping()
        files[1].write_text(yaml.safe_dump(tenants(b_token=rotated)))

        def old_token_refused() -> bool:
            try:
                stub_call(node, B, "GetServerInfo", pb.GetServerInfoRequest())
            except grpc.RpcError as exc:
                return exc.code() == grpc.StatusCode.UNAUTHENTICATED
            return False

        wait_until(old_token_refused, bool, "the old token refused")

        def open_connection_ended() -> object:
            try:
                return opened.request(PingRequest(2)).message
            except ConnectionError:
                return "closed"

        ended = wait_until(open_connection_ended, lambda seen: not isinstance(seen, PingResponse), "revoked")
        assert ended == "closed" or (isinstance(ended, ErrorResponse) and ended.code == ErrorCode.UNAUTHENTICATED)
    with connect(node, rotated) as b:
        assert b.put(keys(B_NS, 1), [b"x" * 4096]).stored == 1
    with pytest.raises(AuthenticationError), connect(node, B) as old:
        old.put(keys(B_NS, 1), [b"x" * 4096]).raise_for_errors()


def test_another_tenant_s_hits_and_misses_look_the_same(node: DaemonProcess) -> None:
    """Counts and times: B probes A's stored keys and keys nobody stored, interleaved, many times."""
    stored, never = keys(A_NS, 64), keys(A_NS, 64)
    with connect(node, A) as a, connect(node, B) as b:
        assert a.put(stored, [os.urandom(4096) for _ in stored]).stored == 64
        times: dict[str, list[float]] = {"stored": [], "never": []}
        for _ in range(5):
            for name, probe in (("stored", stored), ("never", never)):
                for key in probe:
                    started = time.perf_counter()
                    assert b.exists([key]) == [False]
                    times[name].append(time.perf_counter() - started)
    ratio = statistics.median(times["stored"]) / statistics.median(times["never"])
    assert 0.8 < ratio < 1.25, f"median probe time of stored / never-stored keys: {ratio:.3f}"


def test_kvpoolctl_and_the_metrics_show_each_tenant_s_rights_quotas_and_use(
    node: DaemonProcess, files: tuple[Path, Path]
) -> None:
    with connect(node, A) as a, connect(node, B) as b:
        assert a.put(keys(A_NS, 4), [b"a" * 4096] * 4).stored == 4
        assert b.put(keys(B_NS, 2), [b"b" * 4096] * 2).stored == 2
        base = ("--nodes", node.address, "--auth-token-file")
        listing = json.loads(kvpoolctl(*base, str(files[0]), "--json", "tenants"))["tenants"]
        by_name = {t["tenant"]: t for t in listing}
        assert sorted(by_name) == ["cluster", "reader", "slow", "team-a", "team-b"], listing
        assert by_name["team-a"]["dram_bytes"] == 4 * 4096 and by_name["team-b"]["dram_bytes"] == 2 * 4096
        assert by_name["reader"]["dram_bytes"] == 0, "it writes nothing: nothing counts against it"
        assert by_name["team-b"]["quotas_per_node"] == {"dram": 256 * KiB, "ssd": 0, "connections": 0}
        assert by_name["team-a"]["rights"] == ["delete", "read", "write"]
        table = kvpoolctl(*base, str(files[0]), "tenants")
        assert "team-b" in table and "quota 256.0 KiB/node" in table, table
        samples = scrape(node)
        assert samples[("kvpool_tenant_bytes", (("tenant", "team-a"), ("tier", "dram")))] == 4 * 4096
        assert samples[("kvpool_tenant_quota_bytes", (("tenant", "team-b"), ("tier", "dram")))] == 256 * KiB
        assert samples[("kvpool_tenant_connections", (("tenant", "reader"),))] == 0
        token = files[0].parent / "a.token"
        token.write_bytes(A)
        refused = kvpoolctl_run(*base, str(token), "tenants")
        assert refused.returncode != 0 and "admin right" in refused.stderr, refused.stderr


def kvpoolctl_run(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
    command = [sys.executable, "-m", "kvpool_client.admin.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=clean, check=False)


def kvpoolctl(*args: str) -> str:
    done = kvpoolctl_run(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout
