"""The daemon's configuration: one schema, three sources, validated at start.

The fields of :class:`ServerConfig` are the schema. Every field can be set from

- the YAML file named by ``--config PATH`` or ``KVPOOL_CONFIG`` (keys are field names),
- the environment, as ``KVPOOL_`` + the upper-case field name,
- the command line, as ``--field-name`` (``--flag/--no-flag`` for booleans),

with precedence defaults < YAML < environment < flags. Strings are coerced to the
field's type; byte-size fields accept :func:`parse_byte_size` syntax. Unknown YAML
keys, flags and ``KVPOOL_*`` variables are errors (with a did-you-mean), except
``KVPOOL_CONFIG`` and the client-side variables in :data:`CLIENT_ENV_VARS`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import re
import socket
import typing
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import yaml

from kvpool_client import config as client_config
from kvpool_client.auth import TlsFiles
from kvpool_client.version import package_version
from kvpool_client.membership.records import MAX_REPLICAS

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
PAGE_SIZE = 4096
ENV_PREFIX = "KVPOOL_"
CONFIG_ENV = "KVPOOL_CONFIG"
# Read by kvpool_client in the same environment; the daemon ignores those that are not its own.
CLIENT_ENV_VARS = client_config.ENV_VARS
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


class ConfigError(Exception):
    """A setting is unknown, malformed or inconsistent; the message names its source and key."""


def _opt(default: Any, help: str, *, unit: str | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A schema field: its default, --help text, and ``unit="bytes"`` or string choices."""
    return dataclasses.field(default=default, metadata={"help": help, "unit": unit, "choices": choices})


@dataclasses.dataclass(frozen=True, slots=True)
class ServerConfig:
    """Settings of one kvpool-server; build it with :func:`load_config`, which validates it."""

    node_id: str = _opt("", "node id in the cluster; empty: <hostname>-<grpc port>")
    host: str = _opt("127.0.0.1", "address both listeners bind")
    grpc_port: int = _opt(50051, "gRPC control-plane port (0: ephemeral)")
    data_port: int = _opt(50052, "data-plane port (0: ephemeral)")
    ucx_port: int = _opt(
        -1, "UCX data-plane port, on every interface (0: ephemeral, -1: off); needs ucxx (pip install kvpool[ucx])"
    )
    ucx_tls: str = _opt("tcp,sm", "UCX transports (UCX_TLS): tcp,sm on one node or over Ethernet; rc,sm,self with verbs UCX on InfiniBand/RoCE")
    ucx_progress_mode: str = _opt(
        "blocking", "how the UCX worker is progressed: blocking (epoll; idle costs nothing) or polling (one core busy)",
        choices=("blocking", "polling"),
    )
    ucx_net_devices: str = _opt("", "UCX_NET_DEVICES, e.g. mlx5_0:1 or eth0; empty: UCX's choice")
    metrics_port: int = _opt(0, "Prometheus /metrics HTTP port on host (0: ephemeral, -1: off); Helm sets a fixed one")
    advertise_host: str = _opt("", "address published to clients; empty: host (hostname if host is a wildcard)")
    etcd_endpoints: str = _opt("", "etcd client URLs, comma separated (http:// or https://); empty: standalone")
    cluster: str = _opt("default", "cluster name: the etcd prefix /kvpool/<cluster>/")
    lease_ttl_s: int = _opt(10, "etcd lease TTL: a dead node leaves the membership this long after dying")
    node_weight: float = _opt(1.0, "placement weight: a node of weight 2 owns twice the keys")
    repair_enabled: bool = _opt(True, "after a membership change, copy blocks held here to owners that lack them (needs etcd)")
    repair_settle_s: float = _opt(2.0, "the active nodes must stay unchanged this long before a repair starts")
    repair_bandwidth: int = _opt(128 * MiB, "most bytes per second a repair sends (0: no limit)", unit="bytes")
    repair_replicas: int = _opt(0, "copies a repair keeps of each block; 0: the cluster config's replicas")
    dram_capacity: int = _opt(GiB, "bytes of the DRAM tier arena", unit="bytes")
    prefault_arena: bool = _opt(True, "map every arena page at start: slower start, no page faults on puts")
    # 64 MiB holds a 256-token LMCache chunk of an 8B model (32 MiB) with room to spare; the cost
    # (fewer slabs, so fewer block sizes held at once in a small arena) is in docs/configuration.md.
    slab_size: int = _opt(
        64 * MiB, "allocator slab, also the largest block; multiple of 4096; one block size per slab", unit="bytes"
    )
    shm_dir: str = _opt("/dev/shm", "existing directory holding the shared-memory arena")
    namespace_quota: int = _opt(
        0, "most DRAM bytes one namespace may hold here; past it its own oldest blocks go (0: no quota)", unit="bytes"
    )
    eviction_policy: str = _opt(
        "lru", "eviction order: lru, or prefix (a chain's tail before its head, among blocks of similar age)",
        choices=("lru", "prefix"),
    )
    ssd_dir: str = _opt("", "directory of the SSD tier's segment files (created if missing); empty: no SSD tier")
    ssd_capacity: int = _opt(64 * GiB, "bytes of segment files the SSD tier may use", unit="bytes")
    ssd_segment_size: int = _opt(256 * MiB, "bytes per SSD segment file; at least slab_size + 4KiB", unit="bytes")
    ssd_fsync: bool = _opt(False, "fdatasync each SSD write: blocks survive power loss, not only a crash")
    ssd_io_threads: int = _opt(4, "threads that read blocks from the SSD tier")
    ssd_demote_share: float = _opt(0.25, "coldest share of each DRAM size class copied to SSD ahead of eviction")
    ssd_write_through: bool = _opt(False, "acknowledge a put once its blocks are on SSD: they survive a crash; puts go at disk speed")
    ssd_promote_on_hit: bool = _opt(True, "copy a block served from SSD back into DRAM")
    ssd_read_ahead: int = _opt(
        32 * MiB, "bytes a client reading SSD records front to back is read ahead of, into DRAM "
        "(at most a quarter of dram_capacity; needs ssd_promote_on_hit; 0: off)", unit="bytes"
    )
    ssd_gc_live_ratio: float = _opt(0.5, "compact an SSD segment once its live share falls below this")
    ssd_flush_on_shutdown: bool = _opt(True, "write DRAM's blocks to SSD at a clean shutdown, so a restart starts warm")
    ssd_namespace_quota: int = _opt(
        0, "most SSD bytes one namespace may hold here; past it its own oldest records go (0: no quota)", unit="bytes"
    )
    data_workers: int = _opt(0, "data-plane event loops, one thread each; 0: one per CPU, at most 8")
    max_keys_per_request: int = _opt(4096, "most keys in one request (1..65535)")
    max_frame_bytes: int = _opt(GiB, "most payload bytes in one data-plane frame", unit="bytes")
    verify_checksum_on_get: bool = _opt(False, "verify each block's checksum before sending it")
    max_connections: int = _opt(4096, "most data connections at once; past it new ones are closed")
    max_connections_per_peer: int = _opt(1024, "most data connections from one peer address")
    max_inflight_put_bytes: int = _opt(
        0, "most bytes reserved for puts whose payload is still arriving, over every connection; past it a "
        "block is refused OVERLOADED (retryable); 0: a quarter of dram_capacity", unit="bytes"
    )
    io_timeout_s: float = _opt(30.0, "seconds a peer may stall mid-frame before it is dropped")
    idle_timeout_s: float = _opt(0.0, "close a data connection idle this long between requests (0: never)")
    shutdown_grace_s: float = _opt(10.0, "seconds in-flight requests get to finish at shutdown")
    auth_token_file: str = _opt(
        "", "file with the cluster's shared token (16..1024 printable bytes): data connections and gRPC calls "
        "must prove it; empty: no authentication"
    )
    tls_cert_file: str = _opt("", "PEM certificate chain of the gRPC port; with tls_key_file, gRPC runs over TLS")
    tls_key_file: str = _opt("", "PEM private key of tls_cert_file")
    tls_client_ca_file: str = _opt("", "PEM CA of client certificates: set, gRPC requires them (mTLS)")
    data_tls: bool = _opt(False, "the TCP data plane requires TLS too (tls_cert_file's certificates): for networks that are not private")
    etcd_ca_file: str = _opt("", "PEM CA verifying etcd's certificate; set (or https:// endpoints): etcd over TLS")
    etcd_cert_file: str = _opt("", "PEM client certificate for etcd's --client-cert-auth, with etcd_key_file")
    etcd_key_file: str = _opt("", "PEM private key of etcd_cert_file")
    announce_file: str = _opt("", "if set, the bound ports are written there as JSON once ready")
    log_level: str = _opt("info", "log level", choices=("debug", "info", "warning", "error"))
    log_format: str = _opt("json", "log line format", choices=("json", "text"))

    @property
    def max_block_size(self) -> int:
        """The largest block this daemon stores: one slab."""
        return self.slab_size

    def effective_inflight_put_bytes(self) -> int:
        """``max_inflight_put_bytes``, or a quarter of the arena (at least one slab) when 0."""
        return self.max_inflight_put_bytes or max(self.dram_capacity // 4, self.slab_size)

    def effective_data_workers(self) -> int:
        """``data_workers``, or one per CPU (at most 8) when 0."""
        return self.data_workers or min(8, os.cpu_count() or 1)

    def etcd_tls(self) -> TlsFiles | None:
        """TLS to etcd when a CA or client certificate is configured (https:// endpoints alone use system roots)."""
        if not (self.etcd_ca_file or self.etcd_cert_file):
            return None
        return TlsFiles(self.etcd_ca_file, self.etcd_cert_file, self.etcd_key_file)

    def effective_node_id(self, bound_grpc_port: int | None = None) -> str:
        """``node_id``, or ``<hostname>-<port>`` if empty; pass the bound port when ``grpc_port`` is 0."""
        if self.node_id:
            return self.node_id
        port = self.grpc_port if bound_grpc_port is None else bound_grpc_port
        return f"{socket.gethostname()}-{port}"

    def effective_advertise_host(self) -> str:
        """``advertise_host``, else ``host``, else (``host`` is a wildcard) this machine's hostname."""
        if self.advertise_host:
            return self.advertise_host
        return socket.gethostname() if self.host in _WILDCARD_HOSTS else self.host

    def resolved(self, bound_grpc_port: int | None = None) -> ServerConfig:
        """A copy with ``node_id`` and ``advertise_host`` filled in (see the ``effective_*`` methods)."""
        return dataclasses.replace(
            self,
            node_id=self.effective_node_id(bound_grpc_port),
            advertise_host=self.effective_advertise_host(),
        )


_FIELDS = {f.name: f for f in dataclasses.fields(ServerConfig)}
_TYPES = typing.get_type_hints(ServerConfig)


def env_name(name: str) -> str:
    """The environment variable of field ``name``, e.g. ``KVPOOL_DRAM_CAPACITY``."""
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    """The command-line flag of field ``name``, e.g. ``--dram-capacity``."""
    return "--" + name.replace("_", "-")


_NOT_BYTES = "not a byte size (examples: 4096, 512MiB, 1GiB)"
_BYTE_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt](?:i?b)?|b)?", re.IGNORECASE)
_UNIT_BYTES = {"": 1, "b": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}


def parse_byte_size(text: str | int) -> int:
    """Parse a byte count such as ``4096``, ``512MiB``, ``1.5G`` or ``64 kib``.

    Units are binary and case-insensitive: K, KB and KiB all mean 1024 bytes (likewise
    M, G, T). A fraction is allowed when the result is a whole number of bytes.

    Args:
        text: the text to parse, or a non-negative int (returned as is).
    Returns:
        The number of bytes.
    Raises:
        ValueError: not a byte size, negative, or not a whole number of bytes.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError("a byte size must be >= 0")
        return text
    match = _BYTE_SIZE_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(_NOT_BYTES)
    number, unit = match.groups()
    size = Fraction(number) * _UNIT_BYTES[(unit or "")[:1].lower()]
    if size.denominator != 1:
        raise ValueError("not a whole number of bytes")
    return int(size)


def format_byte_size(n: int) -> str:
    """Format ``n`` bytes exactly, in the largest binary unit that divides it (``1536MiB``, ``4096``).

    Raises:
        ValueError: ``n`` is negative.
    """
    if n < 0:
        raise ValueError("a byte size must be >= 0")
    for suffix, unit in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = value.strip().lower() if isinstance(value, str) else ""
    if word not in _BOOL_WORDS:
        raise ValueError("not a boolean (true/false, yes/no, on/off, 1/0)")
    return _BOOL_WORDS[word]


def _to_int(value: Any) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError("not an integer")


def _to_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("not a number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError("not a number") from None
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def _to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ValueError("not a string (quote it in YAML)")


_CONVERTERS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _coerce(name: str, value: Any, where: str) -> Any:
    """Convert a raw value from source ``where`` to field ``name``'s type, or raise ConfigError."""
    meta = _FIELDS[name].metadata
    convert = parse_byte_size if meta["unit"] == "bytes" else _CONVERTERS[_TYPES[name]]
    try:
        result = convert(value)
    except ValueError as exc:
        raise ConfigError(f"{where}={value!r}: {exc}") from None
    return result.lower() if meta["choices"] else result


def _did_you_mean(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


Layer = dict[str, tuple[str, Any]]  # field name -> (where it came from, coerced value)


def _yaml_layer(path: str) -> Layer:
    """Read the YAML config file at ``path``; keys are field names."""
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
    layer: Layer = {}
    for key, raw in data.items():
        if key not in _FIELDS:
            raise ConfigError(f"{path}: unknown key {key!r}{_did_you_mean(str(key), _FIELDS)}")
        where = f"{path}: {key}"
        layer[key] = (where, _coerce(key, raw, where))
    return layer


def _env_layer(env: Mapping[str, str]) -> Layer:
    """Collect ``KVPOOL_*`` settings, refusing unknown ones that are not allow-listed."""
    known = {env_name(name): name for name in _FIELDS}
    layer: Layer = {}
    for key, raw in sorted(env.items()):
        # A variable both sides read (KVPOOL_CLUSTER, ...) is the daemon's setting too.
        if not key.startswith(ENV_PREFIX) or key == CONFIG_ENV or (key in CLIENT_ENV_VARS and key not in known):
            continue
        if key not in known:
            choices = [*known, CONFIG_ENV, *CLIENT_ENV_VARS]
            raise ConfigError(f"{key}: unknown environment variable{_did_you_mean(key, choices)}")
        layer[known[key]] = (key, _coerce(known[key], raw, key))
    return layer


def _flag_layer(argv: Sequence[str] | None) -> tuple[Layer, str]:
    """Parse the command line; returns its settings and the ``--config`` path ('' if none)."""
    parser = build_arg_parser()
    namespace, extras = parser.parse_known_args(argv)
    if extras:
        flag = extras[0].split("=", 1)[0]
        hint = _did_you_mean(flag, [flag_name(n) for n in _FIELDS] + ["--config"])
        raise ConfigError(f"command line: unknown argument {extras[0]!r}{hint}")
    given = vars(namespace)
    config_path = given.pop("config", "")
    layer = {name: (flag_name(name), _coerce(name, raw, flag_name(name))) for name, raw in given.items()}
    return layer, config_path


_METAVARS = {int: "N", float: "NUMBER", str: "TEXT"}


def _metavar(name: str, unit: str | None) -> str:
    """SIZE for byte sizes, SECONDS for ``*_s`` fields, else what the field's type holds."""
    if unit == "bytes":
        return "SIZE"
    return "SECONDS" if name.endswith("_s") else _METAVARS[_TYPES[name]]


class _ArgumentParser(argparse.ArgumentParser):
    """Raises ConfigError instead of exiting, so the daemon reports every config error one way."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"command line: {message}")


def _show(name: str, value: Any) -> str:
    if _FIELDS[name].metadata["unit"] == "bytes":
        return format_byte_size(value)
    if isinstance(value, bool):
        return str(value).lower()
    return '""' if value == "" else str(value)


def build_arg_parser() -> argparse.ArgumentParser:
    """The daemon's argument parser: one flag per field, help naming its env variable and default.

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
    for name, spec in _FIELDS.items():
        meta = spec.metadata
        help_text = f"{meta['help']} [env {env_name(name)}; default: {_show(name, spec.default)}]"
        kwargs: dict[str, Any] = {"dest": name, "help": help_text.replace("%", "%%")}
        if _TYPES[name] is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif meta["choices"]:
            kwargs["metavar"] = "{" + ",".join(meta["choices"]) + "}"
        else:
            kwargs["metavar"] = _metavar(name, meta["unit"])
        parser.add_argument(flag_name(name), **kwargs)
    return parser


def load_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> ServerConfig:
    """Merge defaults < YAML file < environment < flags into a validated config.

    Args:
        argv: command-line arguments without the program name; None means ``sys.argv[1:]``.
        env: the environment, e.g. ``os.environ``.
    Returns:
        The validated config. ``node_id`` and ``advertise_host`` stay as given (maybe
        empty); see :meth:`ServerConfig.resolved`.
    Raises:
        ConfigError: a setting is unknown, malformed or inconsistent.
        SystemExit: ``--help`` was given (after printing the help).
    """
    flags, flag_config = _flag_layer(argv)
    path = flag_config or env.get(CONFIG_ENV, "")
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for layer in (_yaml_layer(path) if path else {}, _env_layer(env), flags):
        for name, (where, value) in layer.items():
            values[name], origins[name] = value, where
    config = ServerConfig(**values)
    validate_config(config, origins)
    return config


def validate_config(config: ServerConfig, origins: Mapping[str, str] | None = None) -> None:
    """Check ranges, choices and cross-field rules.

    Args:
        config: the config to check.
        origins: field name -> where its value came from (``KVPOOL_SLAB_SIZE``, ...), for messages.
    Raises:
        ConfigError: the first rule broken, naming the field and where its value came from.
    """
    report = _Report(config, origins or {})
    _check_fields(report)
    _check_sizes(report)
    _check_paths(report)


@dataclasses.dataclass(frozen=True, slots=True)
class _Report:
    """Words validation errors: each names the field's source (or the field, for defaults)."""

    config: ServerConfig
    origins: Mapping[str, str]

    def fail(self, name: str, problem: str) -> typing.NoReturn:
        value = getattr(self.config, name)
        shown = repr(value) if isinstance(value, str) else _show(name, value)
        raise ConfigError(f"{self.origins.get(name, name)}={shown}: {problem}")

    def describe(self, name: str) -> str:
        origin = f"from {self.origins[name]}" if name in self.origins else "default"
        return f"{name}={_show(name, getattr(self.config, name))} ({origin})"


def _check_fields(report: _Report) -> None:
    config = report.config
    for name, spec in _FIELDS.items():
        if spec.metadata["choices"] and getattr(config, name) not in spec.metadata["choices"]:
            report.fail(name, f"must be one of {', '.join(spec.metadata['choices'])}")
    if not config.host:
        report.fail("host", "must not be empty")
    for name in ("grpc_port", "data_port"):
        if not 0 <= getattr(config, name) <= 65535:
            report.fail(name, "must be a port number in 0..65535 (0: ephemeral)")
    if config.grpc_port == config.data_port != 0:
        report.fail("data_port", f"must differ from {report.describe('grpc_port')}")
    if not -1 <= config.ucx_port <= 65535:
        report.fail("ucx_port", "must be a port number in 0..65535 (0: ephemeral) or -1 (off)")
    for name in ("grpc_port", "data_port"):
        if config.ucx_port == getattr(config, name) > 0:
            report.fail("ucx_port", f"must differ from {report.describe(name)}")
    if config.ucx_port >= 0 and config.data_tls:
        report.fail("ucx_port", "UCX has no TLS: with data_tls set, turn the UCX data plane off (-1)")
    if not -1 <= config.metrics_port <= 65535:
        report.fail("metrics_port", "must be a port number in 0..65535 (0: ephemeral) or -1 (off)")
    for name in ("grpc_port", "data_port"):
        if config.metrics_port == getattr(config, name) > 0:
            report.fail("metrics_port", f"must differ from {report.describe(name)}")
    if config.lease_ttl_s < 1:
        report.fail("lease_ttl_s", "must be >= 1")
    if not config.node_weight > 0:
        report.fail("node_weight", "must be > 0")
    if config.repair_settle_s < 0:
        report.fail("repair_settle_s", "must be >= 0")
    if not 0 <= config.repair_replicas <= MAX_REPLICAS:
        report.fail("repair_replicas", f"must be in 0..{MAX_REPLICAS} (0: the cluster config's)")
    if not config.cluster or not config.cluster.replace("-", "").replace("_", "").isalnum():
        report.fail("cluster", "must be non-empty letters, digits, '-' or '_'")
    if not 0 <= config.data_workers <= 64:
        report.fail("data_workers", "must be in 0..64 (0: one per CPU)")
    if not 1 <= config.max_keys_per_request <= 65535:
        report.fail("max_keys_per_request", "must be in 1..65535")
    for name in ("max_connections", "max_connections_per_peer"):
        if getattr(config, name) < 1:
            report.fail(name, "must be >= 1")
    if config.max_inflight_put_bytes and config.max_inflight_put_bytes < config.slab_size:
        report.fail("max_inflight_put_bytes", f"must be 0 or at least slab_size ({config.slab_size}): one block")
    for name in ("io_timeout_s", "shutdown_grace_s"):
        if getattr(config, name) <= 0:
            report.fail(name, "must be > 0")
    if config.idle_timeout_s < 0:
        report.fail("idle_timeout_s", "must be >= 0 (0: never)")
    if not 1 <= config.ssd_io_threads <= 64:
        report.fail("ssd_io_threads", "must be in 1..64")
    if not 0 < config.ssd_demote_share <= 1:
        report.fail("ssd_demote_share", "must be in (0, 1]")
    if config.ssd_read_ahead < 0:
        report.fail("ssd_read_ahead", "must be >= 0 (0: off)")
    if not 0 < config.ssd_gc_live_ratio < 1:
        report.fail("ssd_gc_live_ratio", "must be in (0, 1)")


def _check_sizes(report: _Report) -> None:
    config = report.config
    if config.slab_size < PAGE_SIZE or config.slab_size % PAGE_SIZE:
        report.fail("slab_size", f"must be a positive multiple of {PAGE_SIZE}")
    if config.slab_size > config.dram_capacity:
        report.fail("slab_size", f"must be <= {report.describe('dram_capacity')}")
    if config.ssd_dir:
        if config.ssd_segment_size < config.slab_size + PAGE_SIZE:
            report.fail("ssd_segment_size", f"must be >= {report.describe('slab_size')} + 4KiB, so the largest block fits")
        if config.ssd_capacity < 4 * config.ssd_segment_size:
            report.fail("ssd_capacity", f"must be >= 4 x {report.describe('ssd_segment_size')}")
    if config.max_frame_bytes < config.slab_size:
        problem = f"must be >= {report.describe('slab_size')} so the largest block fits in a frame"
        report.fail("max_frame_bytes", problem)


def _check_paths(report: _Report) -> None:
    config = report.config
    if not os.path.isdir(config.shm_dir):
        report.fail("shm_dir", "not an existing directory")
    if config.ssd_dir and not os.path.isdir(os.path.dirname(os.path.abspath(config.ssd_dir))):
        report.fail("ssd_dir", "its parent directory does not exist")
    files = ("auth_token_file", "tls_cert_file", "tls_key_file", "tls_client_ca_file", "etcd_ca_file",
             "etcd_cert_file", "etcd_key_file")  # fmt: skip
    for name in files:
        if getattr(config, name) and not os.path.isfile(getattr(config, name)):
            report.fail(name, "not an existing file")
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        report.fail("tls_key_file" if config.tls_cert_file else "tls_cert_file", "TLS needs both tls_cert_file and tls_key_file")
    if config.tls_client_ca_file and not config.tls_cert_file:
        report.fail("tls_client_ca_file", "client certificates need TLS: set tls_cert_file and tls_key_file")
    if config.data_tls and not config.tls_cert_file:
        report.fail("data_tls", "TLS on the data plane needs tls_cert_file and tls_key_file")
    if bool(config.etcd_cert_file) != bool(config.etcd_key_file):
        report.fail("etcd_key_file" if config.etcd_cert_file else "etcd_cert_file",
                    "an etcd client certificate needs both etcd_cert_file and etcd_key_file")  # fmt: skip
    if config.announce_file:
        parent = os.path.dirname(os.path.abspath(config.announce_file))
        if not os.path.isdir(parent):
            report.fail("announce_file", f"its directory {parent} does not exist")
