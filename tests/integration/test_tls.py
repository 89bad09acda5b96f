"""The gRPC control plane over TLS and mTLS, with certificates made by the openssl CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from kvpool_client.auth import Credentials, TlsFiles, open_channel
from kvpool_client.proto import kvpool_pb2 as pb
from kvpool_client.proto import kvpool_pb2_grpc
from tests.support.daemon import DaemonProcess

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make certificates")


def openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", str(key), "-out", str(cert))
    return cert, key


def issue(directory: Path, name: str, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by ``ca``."""
    cert, key, request = directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"
    extensions = directory / f"{name}.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(request))
    openssl("x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
            "-days", "2", "-extfile", str(extensions), "-out", str(cert))
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("pki")
    ca, other_ca = make_ca(directory, "ca"), make_ca(directory, "other-ca")
    return {"ca": ca, "other-ca": other_ca, "server": issue(directory, "server", ca),
            "client": issue(directory, "client", ca), "rotated": issue(directory, "rotated", ca),
            "stranger": issue(directory, "stranger", other_ca)}


def tls_daemon(factory: Callable[..., DaemonProcess], cert: Path, key: Path, *extra: str) -> DaemonProcess:
    return factory("--dram-capacity", "16MiB", "--slab-size", "1MiB",
                   "--tls-cert-file", str(cert), "--tls-key-file", str(key), *extra)


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
    done = subprocess.run(["openssl", "s_client", "-connect", node.address, "-showcerts"], input="",
                          capture_output=True, text=True, timeout=20, check=False)
    pem = done.stdout
    start, end = pem.find("-----BEGIN CERTIFICATE-----"), pem.find("-----END CERTIFICATE-----")
    assert start >= 0, f"no certificate from {node.address}: {done.stderr}"
    return pem[start : end + len("-----END CERTIFICATE-----")]
