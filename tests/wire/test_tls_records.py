"""The sans-IO TLS records of the data plane: two sessions wired through memory, no sockets."""

from __future__ import annotations

import ssl

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool_client.core.auth import TlsFiles
from kvpool_client.core.channels.tls import TlsRecords
from kvpool_client.core.errors import NodeUnavailable
from tests.support.pki import issue, make_ca, requires_openssl

pytestmark = requires_openssl


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "ca")
    cert, key = issue(directory, "server", ca)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    server.num_tickets = 0
    return TlsFiles(str(ca[0])).ssl_context(), server


def exchange_records(client: TlsRecords, server: TlsRecords) -> None:
    for source, target in ((client, server), (server, client)):
        if records := source.take_outgoing():
            target.feed(records)


def connected(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> tuple[TlsRecords, TlsRecords]:
    client = TlsRecords(contexts[0], server_side=False, server_hostname="127.0.0.1")
    server = TlsRecords(contexts[1], server_side=True)
    for _ in range(10):
        done = client.handshake(), server.handshake()
        exchange_records(client, server)
        if all(done):
            return client, server
    raise AssertionError("the handshake did not finish")


def receive(records: TlsRecords, ciphertext: bytes, cuts: list[int], size: int) -> bytes:
    """Feed ``ciphertext`` in pieces cut at ``cuts``, opening into a buffer of ``size`` as it comes."""
    out = bytearray(size)
    view, filled, start = memoryview(out), 0, 0
    for end in [*sorted(c % (len(ciphertext) + 1) for c in cuts), len(ciphertext)]:
        if end > start:
            records.feed(ciphertext[start:end])
            start = end
        while filled < size and (count := records.open_into(view[filled:])) is not None:
            filled += count
    assert filled == size, (filled, size)
    return bytes(out)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(min_size=1, max_size=300_000), cuts=st.lists(st.integers(0, 1 << 20), max_size=8))
def test_sealed_bytes_open_exactly_however_the_records_are_split(contexts, payload: bytes, cuts: list[int]) -> None:
    client, server = connected(contexts)
    client.seal(payload)
    assert receive(server, client.take_outgoing(), cuts, len(payload)) == payload
    server.seal(payload[::-1])
    assert receive(client, server.take_outgoing(), cuts, len(payload)) == payload[::-1]


def test_a_tampered_record_never_opens(contexts) -> None:
    client, server = connected(contexts)
    client.seal(b"k" * 5000)
    ciphertext = bytearray(client.take_outgoing())
    ciphertext[len(ciphertext) // 2] ^= 0x01
    server.feed(bytes(ciphertext))
    with pytest.raises(NodeUnavailable):
        server.open_into(memoryview(bytearray(5000)))


def test_plaintext_fails_the_handshake_and_an_empty_feed_is_a_closed_peer(contexts) -> None:
    server = TlsRecords(contexts[1], server_side=True)
    server.feed(b"KVPL\x01" + bytes(40))
    with pytest.raises(NodeUnavailable, match="handshake"):
        server.handshake()
    with pytest.raises(NodeUnavailable, match="closed"):
        TlsRecords(contexts[1], server_side=True).feed(b"")


def test_a_certificate_for_another_name_is_refused(contexts) -> None:
    client = TlsRecords(contexts[0], server_side=False, server_hostname="10.9.9.9")
    server = TlsRecords(contexts[1], server_side=True)
    with pytest.raises(NodeUnavailable, match="handshake"):
        for _ in range(10):
            client.handshake()
            server.handshake()
            exchange_records(client, server)
