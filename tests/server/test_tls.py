"""The gRPC control plane, and etcd, over TLS and mTLS, with certificates made by the openssl CLI."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from kvpool_client import AsyncKVPoolClient, BlockKey, ClientConfig, KVPoolClient
from kvpool_client.core.auth import Credentials, TlsFiles, open_channel
from kvpool_client.core.channels.tcp import TcpConnection
from kvpool_client.core.channels.tls import TlsConnection
from kvpool_client.core.errors import NodeUnavailable
from kvpool_client.core.membership.errors import EtcdUnavailable
from kvpool_client.core.membership.etcd import EtcdStore
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.core.wire import HEADER_SIZE, PingRequest, encode
from tests.client.test_cli import kvpoolctl
from tests.support.daemon import DaemonProcess
from tests.support.etcd import EtcdServerTls, LocalEtcd, requires_etcd
from tests.support.pki import issue, make_ca, requires_openssl

pytestmark = requires_openssl


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("pki")
    ca, other_ca = make_ca(directory, "ca"), make_ca(directory, "other-ca")
    return {
        "ca": ca,
        "other-ca": other_ca,
        "server": issue(directory, "server", ca),
        "client": issue(directory, "client", ca),
        "rotated": issue(directory, "rotated", ca),
        "stranger": issue(directory, "stranger", other_ca),
    }


def tls_daemon(factory: Callable[..., DaemonProcess], cert: Path, key: Path, *extra: str) -> DaemonProcess:
    return factory(
        "--dram-capacity",
        "16MiB",
        "--slab-size",
        "1MiB",
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        *extra,
    )


def node_id(address: str, credentials: Credentials) -> str:
    with open_channel(address, credentials) as channel:
        return kvpool_pb2_grpc.KVPoolStub(channel).GetServerInfo(pb.GetServerInfoRequest(), timeout=5).node_id


def test_tls_serves_a_client_that_trusts_the_ca_and_refuses_plaintext(daemon_factory, pki) -> None:
    node = tls_daemon(daemon_factory, *pki["server"])
    trusted = TlsFiles(str(pki["ca"][0]))
    config = ClientConfig(nodes=(node.address,), tls=trusted)
    key = BlockKey("tls@test", b"k0")
    with KVPoolClient(config=config) as pool:
        pool.put([key], [b"x" * 4096]).raise_for_errors()
        assert bytes(pool.get([key]).buffers[0]) == b"x" * 4096
        assert pool.stats(node.address).node_id == node.node_id
    with pytest.raises(grpc.RpcError):
        node_id(node.address, Credentials())  # plaintext to a TLS port
    with pytest.raises(grpc.RpcError):
        node_id(node.address, Credentials(tls=TlsFiles(str(pki["other-ca"][0]))))  # an untrusted server


def test_mtls_requires_a_client_certificate_from_the_ca(daemon_factory, pki) -> None:
    node = tls_daemon(daemon_factory, *pki["server"], "--tls-client-ca-file", str(pki["ca"][0]))
    ca = str(pki["ca"][0])
    client_cert, client_key = (str(p) for p in pki["client"])
    assert node_id(node.address, Credentials(tls=TlsFiles(ca, client_cert, client_key))) == node.node_id
    with pytest.raises(grpc.RpcError):
        node_id(node.address, Credentials(tls=TlsFiles(ca)))  # no client certificate
    stranger_cert, stranger_key = (str(p) for p in pki["stranger"])
    with pytest.raises(grpc.RpcError):
        node_id(node.address, Credentials(tls=TlsFiles(ca, stranger_cert, stranger_key)))


def test_a_rotated_certificate_is_served_without_a_restart(daemon_factory, pki, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki["server"][0], cert)
    shutil.copy(pki["server"][1], key)
    node = tls_daemon(daemon_factory, cert, key)
    ca = TlsFiles(str(pki["ca"][0]))
    before = served_certificate(node)
    for source, target in ((pki["rotated"][1], key), (pki["rotated"][0], cert)):  # as a Secret update swaps files
        shutil.copy(source, target.with_suffix(".new"))
        os.replace(target.with_suffix(".new"), target)
    deadline = time.monotonic() + 10
    while served_certificate(node) == before:
        assert time.monotonic() < deadline, "the daemon still serves the old certificate"
        time.sleep(0.2)
    assert node_id(node.address, Credentials(tls=ca)) == node.node_id
    assert served_certificate(node) == pki["rotated"][0].read_text().strip()


def served_certificate(node: DaemonProcess) -> str:
    """The PEM certificate the node's gRPC port presents to a new connection."""
    done = subprocess.run(
        ["openssl", "s_client", "-connect", node.address, "-showcerts"],
        input="",
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    pem = done.stdout
    start, end = pem.find("-----BEGIN CERTIFICATE-----"), pem.find("-----END CERTIFICATE-----")
    assert start >= 0, f"no certificate from {node.address}: {done.stderr}"
    return pem[start : end + len("-----END CERTIFICATE-----")]


# -- etcd over mTLS: the daemon registers, clients and kvpoolctl follow, strangers are refused --


@requires_etcd
def test_daemon_client_and_kvpoolctl_use_etcd_over_mtls(daemon_factory, pki) -> None:
    ca = str(pki["ca"][0])
    (server_cert, server_key), (cert, key) = ((str(p) for p in pki[name]) for name in ("server", "client"))
    with LocalEtcd(tls=EtcdServerTls(server_cert, server_key, client_ca_file=ca)) as etcd:
        url = etcd.endpoints[0]
        assert url.startswith("https://"), url
        node = daemon_factory(
            "--dram-capacity",
            "16MiB",
            "--slab-size",
            "1MiB",
            "--etcd-endpoints",
            url,
            "--cluster",
            "tls",
            "--etcd-ca-file",
            ca,
            "--etcd-cert-file",
            cert,
            "--etcd-key-file",
            key,
        )
        config = ClientConfig(etcd_endpoints=(url,), cluster="tls", etcd_tls=TlsFiles(ca, cert, key))
        with KVPoolClient(config=config) as pool:
            deadline = time.monotonic() + 15
            while [m.node_id for m in pool.placement().router.members()] != [node.node_id]:
                assert time.monotonic() < deadline, "the node never showed up in etcd over TLS"
                time.sleep(0.1)
            key_ = BlockKey("tls@etcd", b"k0")
            pool.put([key_], [b"e" * 4096]).raise_for_errors()
            assert bytes(pool.get([key_]).buffers[0]) == b"e" * 4096
        env = {"KVPOOL_ETCD_CA_FILE": ca, "KVPOOL_ETCD_CERT_FILE": cert, "KVPOOL_ETCD_KEY_FILE": key}
        listed = kvpoolctl("--etcd", url, "--cluster", "tls", "--json", "status", env=env)
        assert listed.returncode == 0, listed.stderr.decode()
        assert node.node_id in json.dumps(json.loads(listed.stdout)), listed.stdout
        for refused in (TlsFiles(ca), TlsFiles(str(pki["other-ca"][0]), cert, key), None):
            with pytest.raises(EtcdUnavailable):  # no client certificate, an untrusted server, plaintext
                asyncio.run(_ping(url if refused else etcd.endpoint, refused))


async def _ping(endpoint: str, tls: TlsFiles | None) -> None:
    store = EtcdStore(endpoint, tls=tls, request_timeout_s=1.0, rpc_attempts=1)
    try:
        await store.connect(check=True)
    finally:
        await store.close()


# -- the TCP data plane over TLS (data_tls) ----------------------------------------------------


def data_tls_daemon(factory: Callable[..., DaemonProcess], pki, *extra: str) -> DaemonProcess:
    return tls_daemon(factory, *pki["server"], "--data-tls", *extra)


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_data_plane_over_tls_moves_exact_bytes_for_both_clients(daemon_factory, pki, transport: str) -> None:
    node = data_tls_daemon(daemon_factory, pki)
    config = ClientConfig(nodes=(node.address,), tls=TlsFiles(str(pki["ca"][0])), transport=transport)
    keys = [BlockKey("tls@data", bytes([i]) * 8) for i in range(6)]
    blocks = [os.urandom(size) for size in (1, 4096, 65537, 262144, 1 << 20, 700_001)]
    with KVPoolClient(config=config) as pool:
        endpoints = pool.server_info(node.address).data_endpoints
        assert "tls" in endpoints and "tcp" not in endpoints, endpoints  # plaintext is not offered at all
        pool.put(keys, blocks).raise_for_errors()
        got = pool.get(keys, [bytearray(len(b)) for b in blocks])
        assert got.ok and [bytes(b) for b in got.buffers] == blocks
        assert pool.lookup(keys) == len(keys)
    assert asyncio.run(_async_roundtrip(config, keys, blocks)) == blocks


async def _async_roundtrip(config: ClientConfig, keys: list[BlockKey], blocks: list[bytes]) -> list[bytes]:
    async with AsyncKVPoolClient(config=config) as pool:
        got = await pool.get(keys, [bytearray(len(b)) for b in blocks])
        return [bytes(b) for b in got.buffers]


def test_data_plane_tls_refuses_plaintext_and_untrusted_peers(daemon_factory, pki) -> None:
    ca = str(pki["ca"][0])
    node = data_tls_daemon(daemon_factory, pki, "--tls-client-ca-file", ca)
    cert, key = (str(p) for p in pki["client"])
    trusted = ClientConfig(nodes=(node.address,), tls=TlsFiles(ca, cert, key), transport="tcp")
    block_key = BlockKey("tls@data", b"mtls")
    with KVPoolClient(config=trusted) as pool:
        pool.put([block_key], [b"m" * 8192]).raise_for_errors()
    with socket.create_connection(("127.0.0.1", node.data_port), timeout=5) as plain:
        plain.sendall(encode(PingRequest(1)))  # a plaintext PING fails the handshake: closed, unanswered
        try:
            answer = plain.recv(1024)
        except ConnectionResetError:
            answer = b""
        assert answer == b"", answer
    stranger_cert, stranger_key = (str(p) for p in pki["stranger"])
    refused = {"no client certificate": TlsFiles(ca),
               "a stranger's certificate": TlsFiles(ca, stranger_cert, stranger_key),
               "an untrusted server": TlsFiles(str(pki["other-ca"][0]), cert, key)}  # fmt: skip
    for case, files in refused.items():
        with pytest.raises(NodeUnavailable):  # in the handshake, or (TLS 1.3) at the first answer
            connection = TlsConnection(TcpConnection(node.data_address, 3, 3), files.ssl_context(), "127.0.0.1")
            try:
                connection.start_request()
                connection.send([encode(PingRequest(7))])
                connection.recv_exactly(HEADER_SIZE)
            finally:
                connection.close()
            pytest.fail(f"{case}: the data plane answered")
    with KVPoolClient(config=trusted) as pool:
        assert bytes(pool.get([block_key]).buffers[0]) == b"m" * 8192  # nothing lost, still served
