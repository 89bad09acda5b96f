"""Tests of kvpool_server.config: defaults, the three sources, precedence, errors, byte sizes."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool_server.config import (
    CLIENT_ENV_VARS,
    SCHEMA,
    ConfigError,
    GiB,
    KiB,
    MiB,
    ServerConfig,
    TiB,
    build_arg_parser,
    env_name,
    flag_name,
    format_byte_size,
    load_config,
    parse_byte_size,
    validate_config,
)

FIELD_NAMES = list(SCHEMA.settings)


@pytest.fixture
def shm(tmp_path: Path) -> str:
    """An existing directory standing in for /dev/shm, so tests don't depend on the host."""
    path = tmp_path / "shm"
    path.mkdir()
    return str(path)


def write_yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def load_error(argv: list[str], env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(argv, env)
    return str(info.value)


# --- defaults -----------------------------------------------------------------------------------


def test_defaults_match_the_contract() -> None:
    config = ServerConfig()
    assert (config.node_id, config.host, config.advertise_host) == ("", "127.0.0.1", "")
    assert (config.grpc_port, config.data_port) == (50051, 50052)
    # A Llama-3-8B LMCache chunk of 256 tokens (32 MiB) fits the default slab.
    assert (config.dram_capacity, config.slab_size, config.max_frame_bytes) == (GiB, 64 * MiB, GiB)
    assert config.max_block_size >= 32 * 2 * 8 * 128 * 2 * 256
    assert (config.shm_dir, config.max_keys_per_request) == ("/dev/shm", 4096)
    assert config.verify_checksum_on_get is False
    assert (config.io_timeout_s, config.shutdown_grace_s) == (30.0, 10.0)
    assert (config.announce_file, config.log_level, config.log_format) == ("", "info", "json")
    assert config.max_block_size == config.slab_size


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_load_with_no_sources_gives_defaults() -> None:
    assert load_config([], {}) == ServerConfig()


def test_config_is_frozen_and_slotted() -> None:
    config = ServerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.net.host = "0.0.0.0"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dram = config.dram  # type: ignore[misc]
    assert not hasattr(config, "__dict__") and not hasattr(config.ssd, "__dict__")


def test_every_field_has_help() -> None:
    assert all(spec.help for spec in SCHEMA)


# --- node id and advertised address -------------------------------------------------------------


def test_effective_node_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "box")
    assert ServerConfig().effective_node_id() == "box-50051"
    assert ServerConfig.of(grpc_port=0).effective_node_id(bound_grpc_port=40001) == "box-40001"
    assert ServerConfig.of(node_id="n1").effective_node_id(40001) == "n1"


def test_effective_advertise_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "box")
    assert ServerConfig().effective_advertise_host() == "127.0.0.1"
    assert ServerConfig.of(host="0.0.0.0").effective_advertise_host() == "box"
    assert ServerConfig.of(host="0.0.0.0", advertise_host="10.0.0.5").effective_advertise_host() == "10.0.0.5"


def test_resolved_fills_node_id_and_advertise_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "box")
    resolved = ServerConfig.of(grpc_port=0, host="::").resolved(bound_grpc_port=5000)
    assert (resolved.node_id, resolved.advertise_host, resolved.grpc_port) == ("box-5000", "box", 0)


# --- each source --------------------------------------------------------------------------------


def test_yaml_file_via_flag(tmp_path: Path, shm: str) -> None:
    path = write_yaml(
        tmp_path,
        f"shm_dir: {shm}\ndram_capacity: 512MiB\nslab_size: 65536\nverify_checksum_on_get: true\n"
        "io_timeout_s: 2\nlog_level: DEBUG\nnode_id: n7\n",
    )
    config = load_config(["--config", path], {})
    assert (config.dram_capacity, config.slab_size) == (512 * MiB, 64 * KiB)
    assert config.verify_checksum_on_get is True
    assert config.io_timeout_s == 2.0 and isinstance(config.io_timeout_s, float)
    assert (config.log_level, config.node_id, config.shm_dir) == ("debug", "n7", shm)


def test_yaml_file_via_env(tmp_path: Path, shm: str) -> None:
    path = write_yaml(tmp_path, f"shm_dir: {shm}\ngrpc_port: 7000\n")
    assert load_config([], {"KVPOOL_CONFIG": path}).grpc_port == 7000


def test_empty_yaml_file_gives_defaults(tmp_path: Path, shm: str) -> None:
    path = write_yaml(tmp_path, "# nothing set\n")
    assert load_config(["--config", path, "--shm-dir", shm], {}) == ServerConfig.of(shm_dir=shm)


def test_env_source(shm: str) -> None:
    env = {
        "KVPOOL_SHM_DIR": shm,
        "KVPOOL_DRAM_CAPACITY": "1.5G",
        "KVPOOL_GRPC_PORT": "0",
        "KVPOOL_DATA_PORT": "0",
        "KVPOOL_SHUTDOWN_GRACE_S": "0.25",
        "KVPOOL_LOG_FORMAT": "text",
        "PATH": "/usr/bin",
    }
    config = load_config([], env)
    assert config.dram_capacity == 3 * GiB // 2
    assert (config.grpc_port, config.data_port) == (0, 0)
    assert (config.shutdown_grace_s, config.log_format) == (0.25, "text")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("YES", True), ("1", True), ("on", True), ("false", False), ("No", False), ("0", False)],
)
def test_env_booleans(shm: str, text: str, expected: bool) -> None:
    env = {"KVPOOL_SHM_DIR": shm, "KVPOOL_VERIFY_CHECKSUM_ON_GET": text}
    assert load_config([], env).verify_checksum_on_get is expected


def test_flag_source(shm: str) -> None:
    argv = [
        "--shm-dir",
        shm,
        "--host=0.0.0.0",
        "--max-keys-per-request",
        "16",
        "--slab-size",
        "4KiB",
        "--max-frame-bytes",
        "8KiB",
        "--dram-capacity",
        "64k",
        "--verify-checksum-on-get",
    ]
    config = load_config(argv, {})
    assert (config.host, config.max_keys_per_request) == ("0.0.0.0", 16)
    assert (config.slab_size, config.max_frame_bytes, config.dram_capacity) == (4096, 8192, 64 * KiB)
    assert config.verify_checksum_on_get is True


def test_client_env_vars_and_other_vars_are_ignored(shm: str) -> None:
    """Every variable the client reads is accepted; those the daemon shares stay its settings."""
    own = {env_name(name) for name in FIELD_NAMES}
    env = {name: "x" for name in CLIENT_ENV_VARS - own} | {"KVPOOL_SHM_DIR": shm, "HOME": "/root"}
    assert load_config([], env) == ServerConfig.of(shm_dir=shm)
    assert load_config([], env | {"KVPOOL_CLUSTER": "shared"}).cluster == "shared"


# --- precedence ---------------------------------------------------------------------------------


def test_precedence_defaults_yaml_env_flags(tmp_path: Path, shm: str) -> None:
    path = write_yaml(
        tmp_path, f"shm_dir: {shm}\ngrpc_port: 1001\ndata_port: 1002\nhost: 10.0.0.1\nverify_checksum_on_get: true\n"
    )
    env = {"KVPOOL_CONFIG": path, "KVPOOL_DATA_PORT": "2002", "KVPOOL_HOST": "10.0.0.2"}
    config = load_config(["--host", "10.0.0.3", "--no-verify-checksum-on-get"], env)
    assert config.grpc_port == 1001  # YAML over default
    assert config.data_port == 2002  # env over YAML
    assert config.host == "10.0.0.3"  # flag over env
    assert config.verify_checksum_on_get is False  # --no- flag over YAML
    assert config.log_level == "info"  # default


def test_config_flag_beats_config_env(tmp_path: Path, shm: str) -> None:
    flag_file = tmp_path / "flag.yaml"
    flag_file.write_text(f"shm_dir: {shm}\ngrpc_port: 3000\n")
    env = {"KVPOOL_CONFIG": str(tmp_path / "missing.yaml")}
    assert load_config(["--config", str(flag_file)], env).grpc_port == 3000


def test_last_flag_wins(shm: str) -> None:
    assert load_config(["--shm-dir", shm, "--grpc-port", "1", "--grpc-port", "2"], {}).grpc_port == 2


# --- error messages name the source and the key -------------------------------------------------


def test_env_bad_byte_size_message() -> None:
    message = load_error([], {"KVPOOL_DRAM_CAPACITY": "abc"})
    assert message == "KVPOOL_DRAM_CAPACITY='abc': not a byte size (examples: 4096, 512MiB, 1GiB)"


def test_yaml_unknown_key_suggests(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "dram_capacty: 1GiB\n")
    message = load_error(["--config", path], {})
    assert message == f"{path}: unknown key 'dram_capacty' (did you mean 'dram_capacity'?)"


def test_yaml_unknown_key_without_suggestion(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "zzz: 1\n")
    assert load_error(["--config", path], {}) == f"{path}: unknown key 'zzz'"


def test_yaml_bad_value_names_file_and_key(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "grpc_port: many\n")
    assert load_error(["--config", path], {}) == f"{path}: grpc_port='many': not an integer"


def test_yaml_non_string_for_string_field(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "node_id: 7\n")
    assert load_error(["--config", path], {}) == f"{path}: node_id=7: not a string (quote it in YAML)"


def test_yaml_missing_file_names_the_path(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.yaml")
    message = load_error([], {"KVPOOL_CONFIG": path})
    assert message.startswith(f"{path}: cannot read config file:")


def test_yaml_syntax_error(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "grpc_port: [1,\n")
    assert load_error(["--config", path], {}).startswith(f"{path}: not valid YAML")


def test_yaml_top_level_must_be_mapping(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "- grpc_port\n")
    assert load_error(["--config", path], {}) == f"{path}: expected a mapping of setting: value, got list"


def test_unknown_env_var_suggests() -> None:
    message = load_error([], {"KVPOOL_DRAM_CAPCITY": "1GiB"})
    assert message == "KVPOOL_DRAM_CAPCITY: unknown environment variable (did you mean 'KVPOOL_DRAM_CAPACITY'?)"


def test_env_bad_bool_int_float() -> None:
    assert load_error([], {"KVPOOL_VERIFY_CHECKSUM_ON_GET": "maybe"}) == (
        "KVPOOL_VERIFY_CHECKSUM_ON_GET='maybe': not a boolean (true/false, yes/no, on/off, 1/0)"
    )
    assert load_error([], {"KVPOOL_GRPC_PORT": "5.5"}) == "KVPOOL_GRPC_PORT='5.5': not an integer"
    assert load_error([], {"KVPOOL_IO_TIMEOUT_S": "soon"}) == "KVPOOL_IO_TIMEOUT_S='soon': not a number"
    assert load_error([], {"KVPOOL_IO_TIMEOUT_S": "inf"}) == "KVPOOL_IO_TIMEOUT_S='inf': not a finite number"


def test_unknown_flag_suggests() -> None:
    message = load_error(["--dram-capacty=1G"], {})
    assert message == "command line: unknown argument '--dram-capacty=1G' (did you mean '--dram-capacity'?)"


def test_flag_abbreviation_is_not_accepted() -> None:
    assert "unknown argument '--dram'" in load_error(["--dram", "1G"], {})


def test_flag_missing_value() -> None:
    assert load_error(["--grpc-port"], {}) == "command line: argument --grpc-port: expected one argument"


def test_flag_bad_value_names_flag() -> None:
    assert load_error(["--slab-size", "1.3K"], {}) == "--slab-size='1.3K': not a whole number of bytes"


def test_slab_larger_than_dram_names_both_sources(shm: str) -> None:
    env = {"KVPOOL_SHM_DIR": shm, "KVPOOL_DRAM_CAPACITY": "8MiB"}
    message = load_error(["--slab-size", "16MiB"], env)
    assert message == "--slab-size=16MiB: must be <= dram_capacity=8MiB (from KVPOOL_DRAM_CAPACITY)"


def test_slab_larger_than_default_dram(shm: str) -> None:
    message = load_error(["--shm-dir", shm], {"KVPOOL_SLAB_SIZE": "2GiB", "KVPOOL_MAX_FRAME_BYTES": "4GiB"})
    assert message == "KVPOOL_SLAB_SIZE=2GiB: must be <= dram_capacity=1GiB (default)"


@pytest.mark.parametrize("slab", ["6000", "0", "2048"])
def test_slab_must_be_page_multiple(tmp_path: Path, shm: str, slab: str) -> None:
    path = write_yaml(tmp_path, f"shm_dir: {shm}\nslab_size: {slab}\n")
    message = load_error(["--config", path], {})
    assert message.startswith(f"{path}: slab_size=") and "must be a positive multiple of 4096" in message


def test_frame_must_hold_largest_block(shm: str) -> None:
    message = load_error(["--shm-dir", shm, "--max-frame-bytes", "1MiB"], {})
    assert message == (
        "--max-frame-bytes=1MiB: must be >= slab_size=64MiB (default) so the largest block fits in a frame"
    )


@pytest.mark.parametrize(("flag", "value"), [("--grpc-port", "65536"), ("--data-port", "-1")])
def test_port_range(shm: str, flag: str, value: str) -> None:
    message = load_error(["--shm-dir", shm, f"{flag}={value}"], {})
    assert message == f"{flag}={value}: must be a port number in 0..65535 (0: ephemeral)"


def test_ports_must_differ(shm: str) -> None:
    message = load_error(["--shm-dir", shm, "--data-port", "50051"], {})
    assert message == "--data-port=50051: must differ from grpc_port=50051 (default)"


@pytest.mark.parametrize("value", ["-2", "65536"])
def test_metrics_port_range(shm: str, value: str) -> None:
    message = load_error(["--shm-dir", shm, "--metrics-port", value], {})
    assert message == f"--metrics-port={value}: must be a port number in 0..65535 (0: ephemeral) or -1 (off)"


def test_metrics_port_defaults_to_ephemeral_and_minus_one_is_off(shm: str) -> None:
    assert load_config(["--shm-dir", shm], {}).metrics_port == 0
    assert load_config(["--shm-dir", shm, "--metrics-port", "-1"], {}).metrics_port == -1
    message = load_error(["--shm-dir", shm], {"KVPOOL_METRICS_PORT": "50052"})
    assert message == "KVPOOL_METRICS_PORT=50052: must differ from data_port=50052 (default)"


@pytest.mark.parametrize("value", ["0", "65536"])
def test_max_keys_range(shm: str, value: str) -> None:
    message = load_error([], {"KVPOOL_SHM_DIR": shm, "KVPOOL_MAX_KEYS_PER_REQUEST": value})
    assert message == f"KVPOOL_MAX_KEYS_PER_REQUEST={value}: must be in 1..65535"


@pytest.mark.parametrize("name", ["io_timeout_s", "shutdown_grace_s"])
def test_timeouts_must_be_positive(shm: str, name: str) -> None:
    message = load_error([flag_name(name), "0", "--shm-dir", shm], {})
    assert message == f"{flag_name(name)}=0.0: must be > 0"


def test_choice_error_and_case_insensitivity(shm: str) -> None:
    assert load_config(["--shm-dir", shm, "--log-level", "WARNING"], {}).log_level == "warning"
    message = load_error(["--shm-dir", shm], {"KVPOOL_LOG_LEVEL": "verbose"})
    assert message == "KVPOOL_LOG_LEVEL='verbose': must be one of debug, info, warning, error"


def test_shm_dir_must_exist(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent")
    message = load_error([], {"KVPOOL_SHM_DIR": missing})
    assert message == f"KVPOOL_SHM_DIR={missing!r}: not an existing directory"


def test_announce_file_directory_must_exist(tmp_path: Path, shm: str) -> None:
    ok = load_config(["--shm-dir", shm, "--announce-file", str(tmp_path / "ports.json")], {})
    assert ok.announce_file == str(tmp_path / "ports.json")
    message = load_error(["--shm-dir", shm, "--announce-file", str(tmp_path / "no" / "ports.json")], {})
    assert message.startswith("--announce-file=") and "does not exist" in message


def test_validate_config_without_origins_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^slab_size=8KiB: must be <= dram_capacity=4KiB \(default\)$"):
        validate_config(ServerConfig.of(dram_capacity=4096, slab_size=8192))


def test_nixl_refuses_ucxx_beside_it_and_tls(tmp_path: Path) -> None:
    """NIXL's UCX cannot share the daemon's process with ucxx's, and it moves bytes unencrypted."""
    pem = tmp_path / "x.pem"
    pem.write_text("")
    with pytest.raises(ConfigError, match=r"^nixl_enabled=true: NIXL and ucxx each bring a UCX"):
        validate_config(ServerConfig.of(nixl_enabled=True, ucx_port=0))
    with pytest.raises(ConfigError, match=r"^nixl_enabled=true: NIXL moves bytes unencrypted"):
        tls = {"data_tls": True, "tls_cert_file": str(pem), "tls_key_file": str(pem)}
        validate_config(ServerConfig.of(nixl_enabled=True, **tls))
    validate_config(ServerConfig.of(nixl_enabled=True))  # alone: fine


# --- byte sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("0", 0),
        ("512MiB", 512 * MiB),
        ("1GiB", GiB),
        ("1.5G", 3 * GiB // 2),
        ("64k", 64 * KiB),
        ("64 KB", 64 * KiB),
        ("2t", 2 * TiB),
        (" 7 b ", 7),
        ("0.5KiB", 512),
        (4096, 4096),
    ],
)
def test_parse_byte_size(text: str | int, expected: int) -> None:
    assert parse_byte_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1", "1.3K", "1 PiB", "1e3", "1GiBs", ".5M", True, -5, 1.5])
def test_parse_byte_size_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_byte_size(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "expected"),
    [(0, "0"), (1000, "1000"), (1024, "1KiB"), (1536 * MiB, "1536MiB"), (GiB, "1GiB"), (3 * TiB, "3TiB")],
)
def test_format_byte_size(n: int, expected: str) -> None:
    assert format_byte_size(n) == expected


def test_format_byte_size_rejects_negative() -> None:
    with pytest.raises(ValueError):
        format_byte_size(-1)


@given(st.integers(min_value=0, max_value=1 << 60))
def test_byte_size_round_trip(n: int) -> None:
    assert parse_byte_size(format_byte_size(n)) == n


@given(
    st.integers(min_value=0, max_value=1 << 20),
    st.sampled_from([("", 1), ("K", KiB), ("KiB", KiB), ("mb", MiB), ("G", GiB), ("TiB", TiB)]),
)
def test_unit_text_round_trip(count: int, unit: tuple[str, int]) -> None:
    suffix, multiplier = unit
    n = parse_byte_size(f"{count}{suffix}")
    assert n == count * multiplier
    assert parse_byte_size(format_byte_size(n)) == n


# --- --help -------------------------------------------------------------------------------------


def test_help_lists_every_flag_env_name_and_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping, which may split words at hyphens
    with pytest.raises(SystemExit) as info:
        load_config(["--help"], {})
    assert info.value.code == 0
    text = capsys.readouterr().out
    for name in FIELD_NAMES:
        assert flag_name(name) in text and env_name(name) in text
    assert "--no-verify-checksum-on-get" in text and "KVPOOL_CONFIG" in text
    assert "default: 1GiB" in text and "default: 64MiB" in text and "default: 50051" in text


def test_arg_parser_returns_only_given_flags() -> None:
    namespace = build_arg_parser().parse_args(["--grpc-port", "9"])
    assert vars(namespace) == {"grpc_port": "9"}


def test_etcd_tls_files(tmp_path: Path, shm: str) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "client.pem", "client.key"))
    for path in (ca, cert, key):
        path.write_text("pem")
    assert load_config([], {"KVPOOL_SHM_DIR": shm}).etcd_tls() is None
    env = {
        "KVPOOL_SHM_DIR": shm,
        "KVPOOL_ETCD_CA_FILE": str(ca),
        "KVPOOL_ETCD_CERT_FILE": str(cert),
        "KVPOOL_ETCD_KEY_FILE": str(key),
    }
    tls = load_config([], env).etcd_tls()
    assert tls is not None and (tls.ca_file, tls.cert_file, tls.key_file) == (str(ca), str(cert), str(key))
    assert "etcd_key_file" in load_error(["--etcd-cert-file", str(cert)], {"KVPOOL_SHM_DIR": shm})
    assert "not an existing file" in load_error(["--etcd-ca-file", str(tmp_path / "missing")], {"KVPOOL_SHM_DIR": shm})


def test_the_client_variables_come_from_one_declaration() -> None:
    """ENV_VARS is derived from ClientSettings, and no client module reads a KVPOOL_* variable by hand."""
    import re

    import kvpool_client.admin.cli
    import kvpool_client.core.auth
    import kvpool_client.core.config
    from kvpool_client.core.config import CLIENT_SCHEMA, ENV_VARS

    assert {spec.env_name for spec in CLIENT_SCHEMA if spec.env} == ENV_VARS
    assert {"KVPOOL_NODES", "KVPOOL_AUTH_TOKEN_FILE", "KVPOOL_TLS_CA_FILE", "KVPOOL_ETCD_KEY_FILE"} <= ENV_VARS
    for module in (kvpool_client.core.config, kvpool_client.core.auth, kvpool_client.admin.cli):
        text = Path(module.__file__).read_text()
        by_hand = re.findall(r'(?:env(?:iron)?(?:\.get\(|\[))"(KVPOOL_[A-Z_]+)"', text)
        assert not by_hand, f"{module.__name__} reads {by_hand} itself: declare them in ClientSettings"


def test_the_configuration_docs_name_every_setting() -> None:
    """docs/configuration.md is what users read: a setting missing there is a setting nobody finds."""
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    named = set(re.findall(r"`([a-z_0-9]+)`", text))
    missing = [name for name in FIELD_NAMES if name not in named]
    assert not missing, f"settings not in docs/configuration.md: {missing}"
