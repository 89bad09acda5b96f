"""Access to a daemon: the cluster's token on data connections, gRPC calls and kvpoolctl; idle connections."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from kvpool_client.core.auth import Credentials, open_channel
from kvpool_client.core.errors import AuthenticationError, ErrorCode, UsageError
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.core.wire import HelloRequest, PutRequest, WireLimits, decode_header, encode
from kvpool_client.core.wire.layout import HEADER_SIZE
from tests.support.daemon import DaemonProcess
from tests.support.waiting import wait_until

TOKEN = b"s3cret-token-of-the-cluster-0123"
KEYS = [BlockKey("auth@test", b"k%02d" % i) for i in range(4)]
BLOCKS = [os.urandom(4096) for _ in KEYS]


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_bytes(TOKEN + b"\n")
    return path


@pytest.fixture
def node(daemon_factory: Callable[..., DaemonProcess], token_file: Path) -> DaemonProcess:
    return daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--auth-token-file", str(token_file))


def client(node: DaemonProcess, token: bytes | None, transport: str = "auto") -> KVPoolClient:
    return KVPoolClient(config=ClientConfig(nodes=(node.address,), auth_token=token, transport=transport))


def raw_frames(node: DaemonProcess, *frames: bytes, answers: int = 1) -> list[tuple[int, int]]:
    """Send frames on one raw connection; (op, status) of up to ``answers`` replies, or until the node closes."""
    seen: list[tuple[int, int]] = []
    with socket.create_connection(("127.0.0.1", node.data_port), timeout=5) as sock:
        sock.sendall(b"".join(frames))
        stream = b""
        while len(seen) < answers and (chunk := sock.recv(65536)):
            stream += chunk
            while len(stream) >= HEADER_SIZE:
                header = decode_header(stream[:HEADER_SIZE], WireLimits())
                end = HEADER_SIZE + header.meta_len + header.payload_len
                if len(stream) < end:
                    break
                seen.append((header.op & 0x7F, header.status))
                stream = stream[end:]
        if len(seen) < answers:
            return seen
        sock.settimeout(0.5)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
    return [*seen, (-1, -1)] if closed else seen  # (-1, -1): the node closed the connection


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_the_right_token_stores_and_reads(node: DaemonProcess, transport: str) -> None:
    with client(node, TOKEN, transport) as pool:
        assert pool.put(KEYS, BLOCKS).statuses == (ErrorCode.OK,) * 4
        result = pool.get(KEYS)
        assert [bytes(b) for b in result.buffers] == BLOCKS, f"statuses {result.statuses}"
        assert pool.lookup(KEYS) == 4 and pool.stats(node.address).node_id == node.node_id
        assert pool.transport(node.address) == transport


@pytest.mark.parametrize("token", [None, b"the-wrong-token-0123456789"], ids=["no token", "wrong token"])
def test_a_client_without_the_token_gets_nothing(node: DaemonProcess, token: bytes | None) -> None:
    with client(node, TOKEN) as pool:
        pool.put(KEYS, BLOCKS).raise_for_errors()
    with client(node, token, "tcp") as pool:
        with pytest.raises(AuthenticationError):
            pool.stats(node.address)
        put = pool.put([BlockKey("auth@test", b"intruder")], [b"x" * 64])
        get = pool.get(KEYS)
    assert set(put.statuses) == {ErrorCode.UNAUTHENTICATED}, f"put statuses {put.statuses}"
    assert set(get.statuses) == {ErrorCode.UNAUTHENTICATED}, f"get statuses {get.statuses}"
    with client(node, TOKEN) as pool:  # nothing was written, nothing was lost
        assert pool.exists([BlockKey("auth@test", b"intruder"), *KEYS]) == [False, True, True, True, True]


def test_raw_frames_before_hello_are_refused_and_the_connection_closed(node: DaemonProcess) -> None:
    put = encode(PutRequest(1, "auth@test", [b"raw"], [3])) + b"abc"
    closed = (-1, -1)
    refused = raw_frames(node, put)
    assert refused == [(1, ErrorCode.UNAUTHENTICATED), closed], f"a put before HELLO: {refused}"
    wrong = raw_frames(node, encode(HelloRequest(1, b"nope-nope-nope-nope")), put)
    assert wrong == [(7, ErrorCode.UNAUTHENTICATED), closed], f"a wrong token: {wrong}"
    right = raw_frames(node, encode(HelloRequest(1, TOKEN)), put, answers=2)
    assert right == [(7, ErrorCode.OK), (1, ErrorCode.OK)], f"the right token: {right}"


def test_grpc_calls_need_the_token_except_health(node: DaemonProcess) -> None:
    with grpc.insecure_channel(node.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            kvpool_pb2_grpc.KVPoolStub(channel).GetStats(pb.GetStatsRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    with open_channel(node.address, Credentials(TOKEN)) as channel:
        stats = kvpool_pb2_grpc.KVPoolStub(channel).GetStats(pb.GetStatsRequest(), timeout=5)
    assert stats.counters["errors_unauthenticated"] >= 1, dict(stats.counters)


def test_kvpoolctl_takes_the_token_from_a_file(node: DaemonProcess, token_file: Path) -> None:
    env = {**os.environ, "KVPOOL_NODES": node.address}
    env.pop("KVPOOL_AUTH_TOKEN_FILE", None)
    command = [sys.executable, "-m", "kvpool_client.admin.cli", "status"]
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--auth-token-file" in refused.stderr, refused  # exit 2: the caller's to fix
    allowed = subprocess.run(
        [*command, "--auth-token-file", str(token_file)], env=env, capture_output=True, text=True, timeout=60
    )
    assert allowed.returncode == 0 and node.node_id in allowed.stdout, allowed
    wrong = token_file.with_name("wrong-token")
    wrong.write_text("a-token-but-not-the-cluster-one\n")
    rejected = subprocess.run(
        [*command, "--auth-token-file", str(wrong)], env=env, capture_output=True, text=True, timeout=60
    )
    assert rejected.returncode == 2 and f"rejected the token in {wrong}" in rejected.stderr, rejected


def test_a_daemon_refuses_to_start_with_a_short_token(
    daemon_factory: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    short = tmp_path / "short"
    short.write_text("tiny")
    with pytest.raises(RuntimeError, match=r"16\.\.1024 bytes"):
        daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--auth-token-file", str(short))


def test_read_token_rejects_spaces(tmp_path: Path) -> None:
    from kvpool_client.core.auth import read_token

    path = tmp_path / "token"
    path.write_text("a token with spaces inside!")
    with pytest.raises(UsageError, match="printable"):
        read_token(path)


def test_idle_connections_are_closed_and_the_client_reconnects(daemon_factory: Callable[..., DaemonProcess]) -> None:
    node = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--idle-timeout-s", "0.3")
    with socket.create_connection(("127.0.0.1", node.data_port), timeout=5) as sock:
        assert sock.recv(1) == b"", "an idle connection must be closed by the node"
    with client(node, None, "tcp") as pool:
        pool.put(KEYS, BLOCKS).raise_for_errors()
        # Stats go over the control plane: asking does not keep the pooled data connection busy.
        wait_until(
            lambda: pool.stats(node.address).counters["connections_closed_idle"],
            lambda closed: closed >= 2,
            "the node to close the pooled connection after its idle timeout",
        )
        assert [bytes(b) for b in pool.get(KEYS).buffers] == BLOCKS


def test_a_rejected_token_is_logged_and_named_in_the_error(
    node: DaemonProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """A client with the wrong token keeps running without the pool, but says so, naming the node."""
    config = ClientConfig(nodes=(node.address,), auth_token=b"not-the-cluster-token-at-all")
    with caplog.at_level(logging.WARNING, logger="kvpool.client"), KVPoolClient(config=config) as client:
        assert client.lookup(KEYS) == 0
        with pytest.raises(AuthenticationError) as caught:
            client.get(KEYS[:1]).raise_for_errors()
    assert node.address in str(caught.value) and "token" in str(caught.value), str(caught.value)
    warnings = [r.getMessage() for r in caplog.records if node.address in r.getMessage()]
    assert warnings and "refused this client's token" in warnings[0], caplog.records
