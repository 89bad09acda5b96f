"""The daemon's configuration: one schema in sections, three sources, checked at start.

:class:`ServerConfig` is the schema: sections of settings (:mod:`kvpool_server.config_sections`).
Every setting can be set from

- the YAML file named by ``--config PATH`` or ``KVPOOL_CONFIG``: flat keys (``dram_capacity``),
  or a section's settings nested under its name (``dram: {capacity: 1GiB}``),
- the environment, as ``KVPOOL_`` + the upper-case key,
- the command line, as ``--key-with-dashes`` (``--flag/--no-flag`` for booleans),

with precedence defaults < YAML < environment < flags, loaded by :mod:`kvpool_client.core.settings`.
Unknown YAML keys, flags and ``KVPOOL_*`` variables are errors (with a did-you-mean), except
``KVPOOL_CONFIG`` and the client's variables in :data:`CLIENT_ENV_VARS`.

``python -m kvpool_server.config --write-docs docs/configuration.md`` regenerates the docs' tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kvpool_client.core import config as client_config
from kvpool_client.core.auth import TlsFiles
from kvpool_client.core.settings import (
    ENV_PREFIX,
    GiB,
    KiB,
    Layer,
    MiB,
    Report,
    Schema,
    TiB,
    argv_layer,
    check,
    env_layer,
    format_byte_size,
    load,
    mapping_layer,
    parse_byte_size,
    section,
)
from kvpool_client.core.settings.render import add_setting_flags, markdown_tables
from kvpool_client.core.settings.values import ConfigError
from kvpool_client.core.version import package_version
from kvpool_client.core.wire import WireLimits
from kvpool_server.config_sections import (
    PAGE_SIZE,
    AuthSection,
    DataSection,
    DramSection,
    LogSection,
    MembershipSection,
    NetSettings,
    NixlSection,
    RepairSection,
    SsdSection,
    TlsSection,
    UcxSection,
)
from kvpool_server.data.admission import AdmissionLimits

if TYPE_CHECKING:
    from kvpool_client.core.wire.connection import Verify
    from kvpool_server.data.session import SessionConfig

__all__ = [
    "CLIENT_ENV_VARS",
    "CONFIG_ENV",
    "ENV_PREFIX",
    "PAGE_SIZE",
    "SCHEMA",
    "ConfigError",
    "GiB",
    "KiB",
    "MiB",
    "ServerConfig",
    "TiB",
    "build_arg_parser",
    "env_name",
    "flag_name",
    "format_byte_size",
    "load_config",
    "parse_byte_size",
    "validate_config",
]

CONFIG_ENV = "KVPOOL_CONFIG"
# Read by kvpool_client in the same environment; the daemon ignores those that are not its own.
CLIENT_ENV_VARS = client_config.ENV_VARS


@dataclasses.dataclass(frozen=True, slots=True)
class ServerConfig:
    """Settings of one kvpool-server; build it with :func:`load_config`, which checks it.

    Sections hold values; the daemon wires its components from them
    (:class:`~kvpool_server.app.Daemon`, the tiers in :mod:`kvpool_server.tiers.node`). Values
    derived from several sections are made here (:meth:`wire_limits`, :meth:`admission_limits`,
    :meth:`session_config`).
    A setting can also be read by its flat key (``config.dram_capacity``), as users write it.
    """

    net: NetSettings = section(NetSettings, "Node and listeners")
    membership: MembershipSection = section(MembershipSection, "Membership in etcd")
    repair: RepairSection = section(RepairSection, "Re-replication", prefix="repair_")
    dram: DramSection = section(DramSection, "DRAM tier")
    ssd: SsdSection = section(SsdSection, "SSD tier", prefix="ssd_")
    data: DataSection = section(DataSection, "Data plane")
    ucx: UcxSection = section(UcxSection, "UCX data plane", prefix="ucx_")
    nixl: NixlSection = section(NixlSection, "One-sided data plane (NIXL)", prefix="nixl_")
    auth: AuthSection = section(AuthSection, "Authentication", prefix="auth_")
    tls: TlsSection = section(TlsSection, "TLS", prefix="tls_")
    log: LogSection = section(LogSection, "Logs", prefix="log_")

    @classmethod
    def of(cls, **settings: Any) -> ServerConfig:
        """A config with these settings, by flat key, over the defaults; unchecked (see :func:`validate_config`).

        Raises:
            KeyError: a key that is not a setting.
        """
        return typing.cast(ServerConfig, SCHEMA.build(settings))

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not sections or methods: the flat keys.
        if name in SCHEMA.settings:
            return SCHEMA.get(self, name)
        raise AttributeError(f"{type(self).__name__!r} has no setting or attribute {name!r}")

    def check(self, report: Report) -> None:
        """The rules across sections (each section checks its own first)."""
        slab = self.dram.slab_size
        if self.data.max_inflight_put_bytes and self.data.max_inflight_put_bytes < slab:
            report.fail("max_inflight_put_bytes", f"must be 0 or at least slab_size ({slab}): one block")
        if self.data.max_frame_bytes < slab:
            report.fail(
                "max_frame_bytes", f"must be >= {report.describe('slab_size')} so the largest block fits in a frame"
            )
        if self.ssd.dir and self.ssd.segment_size < slab + PAGE_SIZE:
            report.fail(
                "ssd_segment_size", f"must be >= {report.describe('slab_size')} + 4KiB, so the largest block fits"
            )
        for name in ("grpc_port", "data_port"):
            if self.ucx.port == getattr(self.net, name) > 0:
                report.fail("ucx_port", f"must differ from {report.describe(name)}")
        if self.ucx.port >= 0 and self.tls.data:
            report.fail("ucx_port", "UCX has no TLS: with data_tls set, turn the UCX data plane off (-1)")
        if self.nixl.enabled and self.ucx.port >= 0:
            report.fail("nixl_enabled", "NIXL and ucxx each bring a UCX, which cannot share a process: set ucx_port -1")
        if self.nixl.enabled and self.tls.data:
            report.fail("nixl_enabled", "NIXL moves bytes unencrypted: with data_tls set, leave it off")

    @property
    def max_block_size(self) -> int:
        """The largest block this daemon stores: one slab."""
        return self.dram.slab_size

    def wire_limits(self) -> WireLimits:
        """The bounds the data plane enforces and announces to clients."""
        return WireLimits(self.data.max_keys_per_request, self.max_block_size, self.data.max_frame_bytes)

    def admission_limits(self) -> AdmissionLimits:
        """The daemon-wide budgets; ``max_inflight_put_bytes`` 0 is a quarter of the arena, at least one slab."""
        inflight = self.data.max_inflight_put_bytes or max(self.dram.capacity // 4, self.dram.slab_size)
        return AdmissionLimits(inflight, self.data.max_connections, self.data.max_connections_per_peer)

    def session_config(self, verify: Verify | None) -> SessionConfig:
        """What every data connection is served with; ``verify``: a HELLO's token to its tenant
        (None: no authentication)."""
        from kvpool_server.data.session import SessionConfig  # the session imports the tiers (numpy)

        return SessionConfig(
            self.wire_limits(),
            self.data.verify_checksum_on_get,
            verify,
            self.data.idle_timeout_s,
            self.data.io_timeout_s,
        )

    def etcd_tls(self) -> TlsFiles | None:
        return self.membership.etcd_tls()

    def effective_node_id(self, bound_grpc_port: int | None = None) -> str:
        return self.net.effective_node_id(bound_grpc_port)

    def effective_advertise_host(self) -> str:
        return self.net.effective_advertise_host()

    def resolved(self, bound_grpc_port: int | None = None) -> ServerConfig:
        """A copy with ``node_id`` and ``advertise_host`` filled in (see :class:`NetSettings`)."""
        net = dataclasses.replace(
            self.net,
            node_id=self.net.effective_node_id(bound_grpc_port),
            advertise_host=self.net.effective_advertise_host(),
        )
        return dataclasses.replace(self, net=net)


SCHEMA = Schema(ServerConfig)


def env_name(key: str) -> str:
    """The environment variable of setting ``key``, e.g. ``KVPOOL_DRAM_CAPACITY``."""
    return SCHEMA.settings[key].env_name


def flag_name(key: str) -> str:
    """The command-line flag of setting ``key``, e.g. ``--dram-capacity``."""
    return SCHEMA.settings[key].flag


class _ArgumentParser(argparse.ArgumentParser):
    """Raises ConfigError instead of exiting, so the daemon reports every config error one way."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"command line: {message}")


def build_arg_parser() -> argparse.ArgumentParser:
    """The daemon's argument parser: one flag per setting, by section, help naming its variable and default.

    Every default is ``argparse.SUPPRESS``, so a parsed namespace holds only the flags given.
    Parse errors raise :class:`ConfigError` instead of exiting; ``--help`` still prints and exits.
    """
    parser = _ArgumentParser(
        prog="kvpool-server",
        description="kvpool daemon: a DRAM/SSD KV-cache pool node.",
        epilog="Precedence: defaults < YAML file < KVPOOL_* environment < flags. "
        "Byte sizes accept 4096, 512MiB, 1.5G (binary units).",
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--version", action="version", version=f"kvpool-server {package_version()}")
    parser.add_argument("--config", metavar="PATH", help=f"YAML config file [env {CONFIG_ENV}]")
    add_setting_flags(parser, SCHEMA)
    return parser


def _yaml_layer(path: str) -> Layer:
    """Read the YAML config file at ``path``: flat keys, or sections of field names."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of setting: value, got {type(data).__name__}")
    return mapping_layer(SCHEMA, data, path)


def load_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> ServerConfig:
    """Merge defaults < YAML file < environment < flags into a checked config.

    Args:
        argv: command-line arguments without the program name; None means ``sys.argv[1:]``.
        env: the environment, e.g. ``os.environ``.
    Returns:
        The checked config. ``node_id`` and ``advertise_host`` stay as given (maybe
        empty); see :meth:`ServerConfig.resolved`.
    Raises:
        ConfigError: a setting is unknown, malformed or inconsistent.
        SystemExit: ``--help`` was given (after printing the help).
    """
    flags, others = argv_layer(SCHEMA, build_arg_parser(), argv, others=("--config",))
    path = others.get("config") or env.get(CONFIG_ENV, "")
    file_layer = _yaml_layer(path) if path else {}
    variables = env_layer(SCHEMA, env, allowed={CONFIG_ENV, *CLIENT_ENV_VARS})
    config, _ = load(SCHEMA, file_layer, variables, flags)
    return typing.cast(ServerConfig, config)


def validate_config(config: ServerConfig, origins: Mapping[str, str] | None = None) -> None:
    """Check ranges, choices and rules across settings.

    Args:
        config: the config to check.
        origins: flat key -> where its value came from (``KVPOOL_SLAB_SIZE``, ...), for messages.
    Raises:
        ConfigError: the first rule broken, naming the setting and where its value came from.
    """
    check(SCHEMA, config, origins)


# The docs' generated part lies between these lines.
DOCS_BEGIN = (
    "<!-- settings: generated from kvpool_server/config.py by "
    "`python -m kvpool_server.config --write-docs docs/configuration.md` -->"
)
DOCS_END = "<!-- end of settings -->"


def docs_with_tables(text: str) -> str:
    """``text`` (docs/configuration.md) with its generated tables replaced by the schema's.

    Raises:
        ValueError: the markers are missing.
    """
    pattern = re.compile(re.escape(DOCS_BEGIN) + r"\n.*?" + re.escape(DOCS_END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"no generated part: expected {DOCS_BEGIN!r} ... {DOCS_END!r}")
    return pattern.sub(lambda _: f"{DOCS_BEGIN}\n\n{markdown_tables(SCHEMA)}\n{DOCS_END}", text, count=1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate the settings tables of the configuration docs.")
    parser.add_argument("--write-docs", metavar="PATH", required=True, help="docs/configuration.md")
    path = Path(parser.parse_args(argv).write_docs)
    path.write_text(docs_with_tables(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
