"""Tests of kvpool_client.core.settings: declarations, the sources, sections that check themselves.

A small schema of its own shows the loader's contract; the daemon's and the client's schemas
show that their spellings (flat and nested YAML, variables, flags) mean the same.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpool_client.core.config import CLIENT_SCHEMA, ClientConfig, settings_from_env
from kvpool_client.core.settings import (
    ConfigError,
    MiB,
    Schema,
    SectionReport,
    argv_layer,
    check,
    env_layer,
    load,
    mapping_layer,
    section,
    setting,
)
from kvpool_client.core.settings.render import add_setting_flags, help_line, markdown_tables
from kvpool_server.config import SCHEMA, ServerConfig, load_config
from kvpool_server.tiers.node import ssd_config


@dataclass(frozen=True, slots=True)
class Cache:
    size: int = setting(4 * MiB, "bytes cached", unit="bytes")
    mode: str = setting("lru", "order", choices=("lru", "fifo"))
    ways: int | None = setting(None, "associativity; none: full")

    def check(self, report: SectionReport) -> None:
        if self.ways is not None and self.ways < 1:
            report.fail("ways", "must be >= 1")
        if self.size < MiB:
            report.fail("size", f"must be >= 1MiB, with {report.describe('mode')}")


@dataclass(frozen=True, slots=True)
class Toy:
    name: str = setting("toy", "a name")
    hosts: tuple[str, ...] = setting((), "hosts, comma separated")
    quiet: bool = setting(False, "say less", env=False)
    cache: Cache = section(Cache, "Cache", prefix="cache_")


TOY = Schema(Toy)


def toy_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy", allow_abbrev=False)
    add_setting_flags(parser, TOY)
    return parser


def test_keys_come_from_prefix_and_field() -> None:
    assert list(TOY.settings) == ["name", "hosts", "quiet", "cache_size", "cache_mode", "cache_ways"]
    spec = TOY.settings["cache_size"]
    assert (spec.env_name, spec.flag, spec.nested, spec.section, spec.name) == (
        "KVPOOL_CACHE_SIZE",
        "--cache-size",
        "cache.size",
        "cache",
        "size",
    )


def test_flat_and_nested_mappings_mean_the_same() -> None:
    flat, _ = load(TOY, mapping_layer(TOY, {"cache_size": "8MiB", "cache_mode": "FIFO", "hosts": "a, b"}, "f.yaml"))
    nested, origins = load(
        TOY, mapping_layer(TOY, {"cache": {"size": "8MiB", "mode": "fifo"}, "hosts": ["a", "b"]}, "f.yaml")
    )
    assert flat == nested == Toy(hosts=("a", "b"), cache=Cache(size=8 * MiB, mode="fifo"))
    assert origins == {"cache_size": "f.yaml: cache.size", "cache_mode": "f.yaml: cache.mode", "hosts": "f.yaml: hosts"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cache": {"sise": 1}}, "f.yaml: unknown key 'cache.sise' (did you mean 'cache.size'?)"),
        ({"cache_sise": 1}, "f.yaml: unknown key 'cache_sise' (did you mean 'cache_size'?)"),
        ({"cache": 5}, "f.yaml: cache: expected a mapping of setting: value, got int"),
        (
            {"cache_size": "1MiB", "cache": {"size": "2MiB"}},
            "f.yaml: cache.size: also set as f.yaml: cache_size: keep one",
        ),
        ({"cache": {"size": "lots"}}, "f.yaml: cache.size='lots': not a byte size (examples: 4096, 512MiB, 1GiB)"),
        ({"hosts": 7}, "f.yaml: hosts=7: not a comma-separated list (or a YAML list of strings)"),
    ],
)
def test_mapping_errors_name_the_source_and_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        mapping_layer(TOY, data, "f.yaml")
    assert str(caught.value) == message


def test_a_section_checks_itself_and_names_the_source() -> None:
    layer = env_layer(TOY, {"KVPOOL_CACHE_SIZE": "4096", "KVPOOL_CACHE_MODE": "fifo"})
    with pytest.raises(ConfigError) as caught:
        load(TOY, layer)
    assert str(caught.value) == "KVPOOL_CACHE_SIZE=4KiB: must be >= 1MiB, with cache_mode=fifo (from KVPOOL_CACHE_MODE)"
    with pytest.raises(ConfigError, match=r"^KVPOOL_CACHE_MODE='mru': must be one of lru, fifo$"):
        load(TOY, env_layer(TOY, {"KVPOOL_CACHE_MODE": "MRU"}))
    with pytest.raises(ConfigError, match=r"^KVPOOL_CACHE_WAYS=0: must be >= 1$"):
        load(TOY, env_layer(TOY, {"KVPOOL_CACHE_WAYS": "0"}))
    with pytest.raises(ConfigError, match=r"^cache_ways=0: must be >= 1$"):
        check(TOY, Toy(cache=Cache(ways=0)))  # no origins: the key names it


def test_env_strict_and_lenient() -> None:
    with pytest.raises(
        ConfigError, match=r"^KVPOOL_CACHE_SIZ: unknown environment variable \(did you mean 'KVPOOL_CACHE_SIZE'\?\)$"
    ):
        env_layer(TOY, {"KVPOOL_CACHE_SIZ": "1"})
    assert env_layer(TOY, {"KVPOOL_OTHER": "x"}, allowed={"KVPOOL_OTHER"}) == {}
    assert env_layer(TOY, {"KVPOOL_QUIET": "1"}, strict=False) == {}, "env=False: no variable"
    lenient = env_layer(
        TOY, {"KVPOOL_NAME": "  ", "KVPOOL_CACHE_WAYS": " 4 ", "KVPOOL_X": "?"}, strict=False, skip_blank=True
    )
    assert lenient == {"cache_ways": ("KVPOOL_CACHE_WAYS", 4)}
    assert env_layer(TOY, {"KVPOOL_CACHE_WAYS": ""})["cache_ways"][1] is None, "blank: none, for an optional"


def test_flags_from_the_schema_and_their_errors() -> None:
    layer, others = argv_layer(TOY, toy_parser(), ["--cache-size", "2MiB", "--quiet", "--hosts=a,b"])
    assert layer == {
        "cache_size": ("--cache-size", 2 * MiB),
        "quiet": ("--quiet", True),
        "hosts": ("--hosts", ("a", "b")),
    }
    assert others == {}
    with pytest.raises(
        ConfigError, match=r"^command line: unknown argument '--cache-sise=1' \(did you mean '--cache-size'\?\)$"
    ):
        argv_layer(TOY, toy_parser(), ["--cache-sise=1"])
    with pytest.raises(ConfigError, match=r"^--cache-ways='x': not an integer$"):
        argv_layer(TOY, toy_parser(), ["--cache-ways", "x"])


def test_help_and_docs_come_from_the_declarations() -> None:
    assert help_line(TOY.settings["cache_size"]) == "bytes cached [env KVPOOL_CACHE_SIZE; default: 4MiB]"
    assert help_line(TOY.settings["quiet"]) == "say less [default: false]"
    tables = markdown_tables(TOY)
    assert "| `cache_size` | `cache.size` | `4MiB` | bytes cached |" in tables
    assert "### Cache (`cache`)" in tables and '| `hosts` |  | `""` | hosts, comma separated |' in tables


def test_a_schema_refuses_what_it_cannot_load() -> None:
    @dataclass(frozen=True)
    class Undeclared:
        plain: int = 1

    @dataclass(frozen=True)
    class Twice:
        a: int = setting(1, "a", key="x")
        b: int = setting(2, "b", key="x")

    @dataclass(frozen=True)
    class BadType:
        a: dict[str, int] = setting(None, "a")

    for cls, says in (
        (Undeclared, "declare it with setting"),
        (Twice, "two settings have the key 'x'"),
        (BadType, "no loader for"),
    ):
        with pytest.raises(TypeError, match=says):
            Schema(cls)


# --- the daemon's schema --------------------------------------------------------------------------


def test_daemon_nested_yaml_equals_flat(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    flat = tmp_path / "flat.yaml"
    flat.write_text(
        f"shm_dir: {shm}\ndram_capacity: 4GiB\nssd_dir: {tmp_path / 'ssd'}\nssd_capacity: 200GiB\n"
        "data_tls: false\nrepair_enabled: false\ndata_workers: 2\n"
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        f"dram_capacity: 4GiB\ndram:\n  shm_dir: {shm}\nssd:\n  dir: {tmp_path / 'ssd'}\n"
        "  capacity: 200GiB\ntls: {data: false}\nrepair: {enabled: false}\ndata: {workers: 2}\n"
    )
    from_flat, from_nested = load_config(["--config", str(flat)], {}), load_config(["--config", str(nested)], {})
    assert from_flat == from_nested
    assert from_nested.ssd.capacity == 200 << 30 and from_nested.dram.capacity == 4 << 30
    assert from_nested.data.effective_workers() == 2 and from_nested.repair.enabled is False
    assert from_nested.ssd_capacity == from_nested.ssd.capacity, "flat keys read through to their section"


def test_daemon_nested_errors_name_the_nested_spelling(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("dram:\n  capacty: 1GiB\n")
    with pytest.raises(ConfigError, match=r"unknown key 'dram\.capacty' \(did you mean 'dram\.capacity'\?\)$"):
        load_config(["--config", str(path)], {})
    path.write_text("dram:\n  slab_size: 2GiB\n")
    with pytest.raises(ConfigError) as caught:
        load_config(["--config", str(path)], {})
    assert str(caught.value) == f"{path}: dram.slab_size=2GiB: must be <= dram_capacity=1GiB (default)"


def test_every_daemon_section_is_a_frozen_dataclass_with_its_settings() -> None:
    config = ServerConfig()
    for name, info in SCHEMA.sections.items():
        assert isinstance(getattr(config, name), info.cls)
    assert config.repair.bandwidth == config.repair_bandwidth
    assert ssd_config(config.ssd).segment_size == config.ssd_segment_size
    assert ServerConfig.of(ssd_dir="/x").ssd.dir == "/x"
    with pytest.raises(AttributeError):
        config.no_such_setting  # noqa: B018


# --- the client's schema --------------------------------------------------------------------------


def test_client_defaults_are_the_declared_ones() -> None:
    config = ClientConfig(nodes=("h:1",))
    for spec in CLIENT_SCHEMA:
        if hasattr(config, spec.key) and spec.key not in ("nodes",):
            assert getattr(config, spec.key) == spec.default, spec.key


def test_client_env_errors_name_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^KVPOOL_TRANSPORT='pigeon': must be one of auto, tcp, shm, ucx, nixl$"):
        ClientConfig.from_env({"KVPOOL_NODES": "a:1", "KVPOOL_TRANSPORT": "pigeon"})
    with pytest.raises(ConfigError, match=r"^KVPOOL_REQUEST_TIMEOUT_S='soon': not a number$"):
        ClientConfig.from_env({"KVPOOL_NODES": "a:1", "KVPOOL_REQUEST_TIMEOUT_S": "soon"})
    blank = ClientConfig.from_env({"KVPOOL_NODES": "a:1", "KVPOOL_REPLICAS": " ", "KVPOOL_SHM_DIR": "/x"})
    assert blank.replicas is None, "blank is unset; a daemon's variable is not the client's business"
    settings = settings_from_env(
        {
            "KVPOOL_TLS_CA_FILE": "ca.pem",
            "KVPOOL_TLS_CLIENT_CERT_FILE": "c.pem",
            "KVPOOL_TLS_CLIENT_KEY_FILE": "k.pem",
            "KVPOOL_ETCD_CERT_FILE": "e.pem",
        }
    )
    tls, etcd = settings.tls(), settings.etcd_tls()
    assert tls is not None and (tls.ca_file, tls.cert_file, tls.key_file) == ("ca.pem", "c.pem", "k.pem")
    assert etcd is not None and (etcd.ca_file, etcd.cert_file) == ("", "e.pem")
    assert settings_from_env({}).tls() is None and settings_from_env({}).etcd_tls() is None
