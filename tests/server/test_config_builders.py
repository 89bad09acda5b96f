"""What the daemon's config derives for its components (limits, admission budgets, the session's
settings, the token), and the node's presence the daemon wires from the membership section."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kvpool_client.core.errors import UsageError
from kvpool_client.core.wire import WireLimits
from kvpool_server.app import Daemon
from kvpool_server.config import GiB, MiB, ServerConfig, load_config
from kvpool_server.data.admission import AdmissionLimits
from kvpool_server.tenants.access import Access


def test_wire_limits_announce_one_slab_as_the_largest_block() -> None:
    config = ServerConfig.of(slab_size=32 * MiB, max_keys_per_request=100, max_frame_bytes=512 * MiB)
    assert config.wire_limits() == WireLimits(100, 32 * MiB, 512 * MiB), config.wire_limits()


@pytest.mark.parametrize(
    ("settings", "inflight"),
    [
        ({}, GiB // 4),  # a quarter of the 1 GiB arena
        ({"dram_capacity": 128 * MiB}, 64 * MiB),  # a quarter is less than the 64 MiB slab: one slab
        ({"max_inflight_put_bytes": 100 * MiB}, 100 * MiB),
    ],
)
def test_admission_limits(settings: dict[str, int], inflight: int) -> None:
    config = ServerConfig.of(max_connections=10, max_connections_per_peer=3, **settings)
    assert config.admission_limits() == AdmissionLimits(inflight, 10, 3), config.admission_limits()


def test_session_config_carries_the_token_check_timeouts_and_limits() -> None:
    config = ServerConfig.of(verify_checksum_on_get=True, idle_timeout_s=5.0, io_timeout_s=7.0)
    verify = Access(b"t" * 16).verifier()
    session = config.session_config(verify)
    assert (session.limits, session.verify_checksum_on_get, session.verify) == (config.wire_limits(), True, verify)
    assert (session.idle_timeout_s, session.io_timeout_s) == (5.0, 7.0), session
    assert config.session_config(None).verify is None


def test_the_token_is_read_from_its_file(tmp_path: Path) -> None:
    assert ServerConfig().auth.token() is None
    path = tmp_path / "token"
    path.write_text("  twenty-three-byte-token\n")
    assert ServerConfig.of(auth_token_file=str(path)).auth.token() == b"twenty-three-byte-token"
    path.write_text("short")
    with pytest.raises(UsageError, match=r"must be 16\.\.1024 bytes, not 5"):
        ServerConfig.of(auth_token_file=str(path)).auth.token()


def test_presence_without_etcd_is_standalone(tmp_path: Path) -> None:
    config = load_config(["--cluster", "c-1", "--shm-dir", str(tmp_path)], {})
    presence = Daemon(config).presence
    assert presence.store is None and presence.cluster == "c-1", presence
    asyncio.run(presence.close())
