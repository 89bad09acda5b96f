"""What the daemon checks before it maps its arena: fail fast, naming the setting, and warn."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool_server import preflight
from kvpool_server.config import GiB, MiB, ServerConfig


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def config(**settings: object) -> ServerConfig:
    """Ephemeral ports unless a test names one: 50051 and 50052 lie in Linux's ephemeral range, so
    any process's outgoing connection may hold them for a while."""
    return ServerConfig.of(**{"grpc_port": 0, "data_port": 0, **settings})


def test_a_port_in_use_is_refused_before_the_arena(taken_port: int, tmp_path: Path) -> None:
    with pytest.raises(OSError, match=f"data_port 127.0.0.1:{taken_port}"):
        preflight.check(config(data_port=taken_port, shm_dir=str(tmp_path)))


def test_a_shm_dir_too_small_names_the_setting_and_the_sizes(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=f"shm_dir {tmp_path} has .* free; the DRAM arena needs"):
        preflight.check(config(dram_capacity=1 << 60, shm_dir=str(tmp_path)))


def test_likely_mistakes_are_warned_about(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("x" * 32)
    token.chmod(0o644)
    warnings = preflight.check(
        config(shm_dir=str(tmp_path), auth_token_file=str(token), ssd_dir=str(tmp_path / "ssd"), ssd_capacity=1 << 60)
    )
    assert any("readable by every user" in w for w in warnings), warnings
    assert any("ssd_capacity" in w and "free under" in w for w in warnings), warnings
    open_host = preflight.check(config(host="0.0.0.0", shm_dir=str(tmp_path), dram_capacity=64 * MiB))
    assert any("no auth_token_file" in w for w in open_host), open_host
    token.chmod(0o600)
    quiet = preflight.check(config(shm_dir=str(tmp_path), auth_token_file=str(token), dram_capacity=GiB // 4))
    assert quiet == [], quiet
