"""The daemon's and the client's UCX settings: one schema, checked at start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kvpool_client.core.errors import UsageError
from kvpool_server.config import ConfigError, load_config


def ucx_channel() -> Any:
    """The module, imported by the tests that need it: not at collection, where ucxx's UCX would
    be loaded into a run of the nixl tests (they cannot share a process)."""
    return pytest.importorskip("kvpool_client.core.channels.ucx_channel", reason="ucxx cannot be imported")


def test_ucx_is_off_by_default_and_set_by_flag_env_or_yaml(tmp_path: Path) -> None:
    assert load_config([], {}).ucx_port == -1
    config = load_config(["--ucx-port", "0"], {"KVPOOL_UCX_TLS": "tcp", "KVPOOL_UCX_PROGRESS_MODE": "polling"})
    assert (config.ucx_port, config.ucx_tls, config.ucx_progress_mode) == (0, "tcp", "polling")
    yaml = tmp_path / "kvpool.yaml"
    yaml.write_text("ucx_port: 50053\nucx_net_devices: lo\n")
    config = load_config(["--config", str(yaml)], {})
    assert (config.ucx_port, config.ucx_net_devices) == (50053, "lo")


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--ucx-port", "70000"], "ucx.port"),
        (["--ucx-port", "50052"], "ucx.port.*differ"),  # the data port's default
        (["--ucx-progress-mode", "thread"], "ucx.progress.mode"),
    ],
)
def test_bad_ucx_settings_are_refused(argv: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(argv, {})


def test_ucx_is_refused_beside_data_plane_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    argv = ["--tls-cert-file", str(cert), "--tls-key-file", str(key), "--data-tls", "--ucx-port", "0"]
    with pytest.raises(ConfigError, match="no TLS"):
        load_config(argv, {})


def test_settings_go_to_the_environment_unless_already_set(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = ucx_channel().UcxSettings(tls="tcp,sm", net_devices="lo")
    for name in settings.ucx_environment():  # restored after the test, whatever apply() sets
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("UCX_TLS", "rc,sm,self")
    settings.apply()
    assert os.environ["UCX_TLS"] == "rc,sm,self"  # the operator's variable wins
    assert os.environ["UCX_MM_ERROR_HANDLING"] == "y" and os.environ["UCX_NET_DEVICES"] == "lo"


def test_an_unknown_progress_mode_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="progress mode"):
        ucx_channel().UcxSettings(progress_mode="thread")
