"""The blocking transport bounds a whole request, not each receive (a real loopback socket)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from kvpool_client.core.channels.tcp import TcpConnection
from kvpool_client.core.errors import RequestTimeout


@pytest.fixture
def trickling_peer() -> Iterator[str]:
    """A peer that sends one byte every 50 ms: never silent for long, never done."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        with conn:
            while not stop.is_set():
                try:
                    conn.send(b"x")
                except OSError:
                    return
                time.sleep(0.05)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()
    thread.join(5)


def test_a_trickling_peer_cannot_stretch_a_request_past_its_timeout(trickling_peer: str) -> None:
    connection = TcpConnection(trickling_peer, timeout=0.5, connect_timeout=2.0)
    try:
        connection.start_request()
        began = time.monotonic()
        with pytest.raises(RequestTimeout):
            connection.recv_exactly(1000)  # 1000 bytes at 20 bytes/s: 50 s without a deadline
        took = time.monotonic() - began
        assert 0.4 < took < 1.5, f"request ended after {took:.2f}s, timeout is 0.5s"
    finally:
        connection.close()
