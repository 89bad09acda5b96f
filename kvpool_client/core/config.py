"""Client settings: where the nodes are (a static list or etcd) and how long to wait for them.

:class:`ClientOptions` declares each setting a client runs with, once: its default, its
help and its ``KVPOOL_*`` variable. Two records share them: :class:`ClientSettings`, what a
client's environment, kvpoolctl and an engine's config hold (the credentials as file names,
read through the loader every kvpool program shares, :mod:`kvpool_client.core.settings`), and
:class:`ClientConfig`, what a client runs with (the credentials read, every value checked).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, cast

from kvpool_client.core.auth import Credentials, TlsFiles, read_token
from kvpool_client.core.errors import UsageError
from kvpool_client.core.membership.records import MAX_REPLICAS, check_name
from kvpool_client.core.settings import Schema, env_layer, load, setting

TRANSPORTS = ("auto", "tcp", "shm", "ucx", "nixl")  # how block bytes move; see ClientConfig.transport


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """The settings every client takes, declared once (``KVPOOL_<NAME>`` where ``env`` is not False)."""

    nodes: tuple[str, ...] = setting((), "control addresses of the nodes, host:port, comma separated")
    etcd_endpoints: tuple[str, ...] = setting(
        (), "etcd client URLs (http://host:port), comma separated: the nodes come from etcd and follow it live"
    )
    cluster: str = setting("default", "cluster name in etcd: /kvpool/<cluster>/")
    transport: str = setting(
        "auto",
        "how block bytes move: auto, tcp, shm, ucx or nixl",
        choices=TRANSPORTS,
        doc="``auto`` copies gets out of a node's shared-memory arena when the node runs on this "
        "machine (``shm``); puts, and gets the arena does not serve, move their bytes one-sided "
        "(``nixl``) when the node offers it and NIXL is installed here; the rest uses ``ucx`` when "
        "the node offers it and ucxx is installed, else ``tcp``, falling back to tcp when ucx fails; "
        "``tcp`` always uses the socket; ``shm`` requires the arena (puts and the rest over tcp); "
        "``ucx`` requires UCX for every op; ``nixl`` requires the one-sided data plane for gets and "
        "puts (the rest over tcp). A node that cannot do a required transport fails its keys with "
        "``UNAVAILABLE``.",
    )
    request_timeout_s: float = setting(
        10.0,
        "most seconds one request to one node may take",
        doc="A node that takes longer is treated as down (its circuit opens).",
    )
    connect_timeout_s: float = setting(
        3.0, "most seconds to open a connection (and to wait for the first read of the membership)", env=False
    )
    location_ttl_s: float = setting(
        0.5,
        "over shm and nixl, seconds a block's place in a node's arena is reused (0: ask each get)",
        doc="A repeat read is then one memcpy. Safe at any length (the slot's generation shows a "
        "deleted, evicted or overwritten block); the node does not see such reads, so this bounds "
        "how stale its eviction order gets, and how long a restarted node goes unnoticed.",
    )
    replicas: int | None = setting(None, "copies per key; none: the cluster config's in etcd, else 1")
    write_quorum: int | None = setting(None, "owners that must store a key for a put to succeed; none: as replicas")
    verify_checksums: bool = setting(False, "check each received block against the node's checksum", env=False)
    max_idle_connections: int = setting(8, "idle data connections kept per node", env=False)
    io_threads: int = setting(8, "threads the blocking client uses to talk to several nodes at once", env=False)
    streams_per_node: int = setting(
        2,
        "connections one get or put of 8 MiB and more to a node uses at once",
        doc="Its keys are split into that many frames of at least 4 MiB each, sent together, so the "
        "node's work on one overlaps the transfer of another (1: one frame).",
    )


@dataclass(frozen=True, slots=True)
class ClientSettings(ClientOptions):
    """The client's settings as users write them, the credentials as files.

    The rules on values are :class:`ClientConfig`'s; here only types and choices are checked.
    """

    auth_token_file: str = setting("", "file with the cluster's shared token, for nodes that require one")
    tls_ca_file: str = setting("", "PEM CA verifying the nodes' gRPC certificates: gRPC over TLS")
    tls_client_cert_file: str = setting("", "PEM client certificate for nodes that require one (mTLS)")
    tls_client_key_file: str = setting("", "PEM private key of tls_client_cert_file")
    etcd_ca_file: str = setting("", "PEM CA verifying etcd's certificate: etcd over TLS")
    etcd_cert_file: str = setting("", "PEM client certificate for etcd's --client-cert-auth")
    etcd_key_file: str = setting("", "PEM private key of etcd_cert_file")

    def tls(self) -> TlsFiles | None:
        """TLS to the nodes' gRPC ports, when a CA is set."""
        if not self.tls_ca_file:
            return None
        return TlsFiles(self.tls_ca_file, self.tls_client_cert_file, self.tls_client_key_file)

    def etcd_tls(self) -> TlsFiles | None:
        """TLS to etcd, when a CA or a client certificate is set."""
        if not (self.etcd_ca_file or self.etcd_cert_file):
            return None
        return TlsFiles(self.etcd_ca_file, self.etcd_cert_file, self.etcd_key_file)

    def config_values(self) -> dict[str, Any]:
        """:class:`ClientConfig`'s arguments: the plain settings, the token read, the TLS files.

        Raises:
            UsageError: the token file cannot be read or holds no valid token.
        """
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(ClientOptions)}
        values["auth_token"] = read_token(self.auth_token_file) if self.auth_token_file else None
        values["tls"], values["etcd_tls"] = self.tls(), self.etcd_tls()
        return values


CLIENT_SCHEMA = Schema(ClientSettings)

# Every variable a client reads. The daemon reads some as its own settings too, and ignores
# the rest, so a client's environment never stops a daemon.
ENV_VARS = frozenset(spec.env_name for spec in CLIENT_SCHEMA if spec.env)


def settings_from_env(env: Mapping[str, str] | None = None, only: Collection[str] | None = None) -> ClientSettings:
    """The client's settings from ``KVPOOL_*`` variables (blank ones count as unset).

    Args:
        env: the environment (default ``os.environ``).
        only: read just these settings (e.g. the TLS files), so a bad unrelated variable is not an error.
    Raises:
        ConfigError: a malformed value or a choice not offered, naming the variable.
    """
    env = os.environ if env is None else env
    if only is not None:
        names = {CLIENT_SCHEMA.settings[key].env_name for key in only}
        env = {var: value for var, value in env.items() if var in names}
    settings, _ = load(CLIENT_SCHEMA, env_layer(CLIENT_SCHEMA, env, strict=False, skip_blank=True))
    return cast(ClientSettings, settings)


def tls_from_env(env: Mapping[str, str]) -> TlsFiles | None:
    """``KVPOOL_TLS_CA_FILE`` (+ ``KVPOOL_TLS_CLIENT_CERT_FILE``, ``KVPOOL_TLS_CLIENT_KEY_FILE``), if set."""
    return settings_from_env(env, only=("tls_ca_file", "tls_client_cert_file", "tls_client_key_file")).tls()


def etcd_tls_from_env(env: Mapping[str, str]) -> TlsFiles | None:
    """``KVPOOL_ETCD_CA_FILE`` (+ ``KVPOOL_ETCD_CERT_FILE``, ``KVPOOL_ETCD_KEY_FILE``), the daemon's settings too."""
    return settings_from_env(env, only=("etcd_ca_file", "etcd_cert_file", "etcd_key_file")).etcd_tls()


@dataclass(frozen=True, slots=True)
class ClientConfig(ClientOptions):
    """Settings of a kvpool client: every :class:`ClientOptions` setting (nodes, etcd_endpoints,
    cluster, transport, timeouts, replicas, write_quorum, ...; each one's help says what it
    does), and the credentials.

    ``nodes`` is required unless ``etcd_endpoints`` is given: the nodes then come from the
    cluster's membership in etcd and follow it live. ``replicas`` and ``write_quorum`` left
    None take the cluster config's in etcd, else 1; the quorum is clamped to the owners placed.

    Args:
        auth_token: the cluster's shared token, for nodes that require one
            (proved on every data connection and gRPC call).
        tls: CA (and client certificate) files for nodes whose gRPC port is TLS.
        etcd_tls: CA (and client certificate) files for etcd over TLS; ``https://``
            endpoints without it are verified against the system's roots.
    Raises:
        UsageError: no nodes and no etcd, a non-positive timeout, R/quorum out of
            range, or an unknown transport.
    """

    auth_token: bytes | None = field(default=None, repr=False)
    tls: TlsFiles | None = None
    etcd_tls: TlsFiles | None = None

    def __post_init__(self) -> None:
        for name in ("nodes", "etcd_endpoints"):
            value = getattr(self, name)
            if isinstance(value, str):  # one comma-separated string is a common slip
                object.__setattr__(self, name, _split(value))
            else:
                object.__setattr__(self, name, tuple(value))
        if not self.nodes and not self.etcd_endpoints:
            raise UsageError(
                "no kvpool nodes given (pass nodes=[...] or etcd_endpoints=[...], "
                "or set KVPOOL_NODES=host:port,... or KVPOOL_ETCD_ENDPOINTS=http://host:port)"
            )
        for name in ("request_timeout_s", "connect_timeout_s"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be positive, not {getattr(self, name)!r}")
        if self.max_idle_connections < 0:
            raise UsageError("max_idle_connections must be >= 0")
        if self.io_threads < 1:
            raise UsageError("io_threads must be >= 1")
        if self.streams_per_node < 1:
            raise UsageError("streams_per_node must be >= 1")
        if self.location_ttl_s < 0:
            raise UsageError("location_ttl_s must be >= 0")
        if self.transport not in TRANSPORTS:
            raise UsageError(f"transport must be one of {', '.join(TRANSPORTS)}, not {self.transport!r}")
        try:
            check_name("cluster name", self.cluster)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self._check_replication()

    def _check_replication(self) -> None:
        if self.replicas is not None and not 1 <= self.replicas <= MAX_REPLICAS:
            raise UsageError(f"replicas must be in 1..{MAX_REPLICAS}, not {self.replicas}")
        if self.write_quorum is not None and self.write_quorum < 1:
            raise UsageError(f"write_quorum must be >= 1, not {self.write_quorum}")
        if self.replicas is not None and self.write_quorum is not None and self.write_quorum > self.replicas:
            raise UsageError(f"write_quorum ({self.write_quorum}) cannot exceed replicas ({self.replicas})")

    @property
    def probe_timeout_s(self) -> float:
        """Longest a circuit breaker probe can take (server info, connect, request), plus a second."""
        return 2 * self.request_timeout_s + self.connect_timeout_s + 1.0

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.auth_token, self.tls)

    @property
    def uses_etcd(self) -> bool:
        """Whether membership comes from etcd (else the static ``nodes`` list)."""
        return bool(self.etcd_endpoints)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> ClientConfig:
        """Settings from the ``KVPOOL_*`` variables of :class:`ClientSettings` (:data:`ENV_VARS`), then ``overrides``.

        Args:
            env: the environment (default ``os.environ``); blank variables count as unset.
            overrides: :class:`ClientConfig` arguments that win over the environment.
        Raises:
            UsageError: a malformed value (:class:`~kvpool_client.core.settings.ConfigError`, naming
                the variable), an unreadable token file, or an invalid combination (see the class).
        """
        values = settings_from_env(env).config_values()
        values.update(overrides)
        return cls(**values)


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())
