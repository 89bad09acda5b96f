"""The repair settings in the daemon's config: one schema for flags, KVPOOL_* variables and YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool_server.config import ConfigError, MiB, load_config


@pytest.fixture
def shm(tmp_path: Path) -> str:
    path = tmp_path / "shm"
    path.mkdir()
    return str(path)


def test_defaults_repair_after_a_two_second_settle_at_128_mib_per_second(shm: str) -> None:
    config = load_config(["--shm-dir", shm], {})
    assert config.repair_enabled is True
    assert config.repair_settle_s == 2.0
    assert config.repair_bandwidth == 128 * MiB
    assert config.repair_replicas == 0


def test_each_source_sets_them_and_flags_win(shm: str, tmp_path: Path) -> None:
    yaml_file = tmp_path / "kvpool.yaml"
    yaml_file.write_text("repair_settle_s: 5\nrepair_bandwidth: 1GiB\nrepair_replicas: 3\n")
    env = {"KVPOOL_REPAIR_ENABLED": "no", "KVPOOL_REPAIR_SETTLE_S": "0.5"}
    config = load_config(["--shm-dir", shm, "--config", str(yaml_file), "--repair-replicas", "2"], env)
    assert (config.repair_enabled, config.repair_settle_s, config.repair_bandwidth, config.repair_replicas) == (
        False, 0.5, 1 << 30, 2,
    )  # fmt: skip
    assert load_config(["--shm-dir", shm, "--no-repair-enabled"], {}).repair_enabled is False


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--repair-settle-s", "-1"], "--repair-settle-s=-1.0: must be >= 0"),
        (["--repair-replicas", "17"], "--repair-replicas=17: must be in 0..16"),
        (["--repair-bandwidth", "fast"], "not a byte size"),
    ],
)
def test_bad_values_name_their_source(shm: str, argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace(".", r"\.")):
        load_config(["--shm-dir", shm, *argv], {})
