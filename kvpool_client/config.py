"""Client settings: where the nodes are (a static list or etcd) and how long to wait for them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvpool_client.auth import Credentials, TlsFiles, etcd_tls_from_env, read_token, tls_from_env
from kvpool_client.errors import UsageError
from kvpool_client.membership.records import MAX_REPLICAS, check_name

TRANSPORTS = ("auto", "tcp", "shm", "ucx")  # how block bytes move; see ClientConfig.transport

# Every variable ClientConfig.from_env reads. The daemon reads some as its own settings too,
# and ignores the rest, so a client's environment never stops a daemon.
ENV_VARS = frozenset({
    "KVPOOL_NODES", "KVPOOL_ETCD_ENDPOINTS", "KVPOOL_CLUSTER", "KVPOOL_TRANSPORT", "KVPOOL_AUTH_TOKEN_FILE",
    "KVPOOL_REQUEST_TIMEOUT_S", "KVPOOL_LOCATION_TTL_S", "KVPOOL_REPLICAS", "KVPOOL_WRITE_QUORUM",
    "KVPOOL_TLS_CA_FILE", "KVPOOL_TLS_CLIENT_CERT_FILE", "KVPOOL_TLS_CLIENT_KEY_FILE",
    "KVPOOL_ETCD_CA_FILE", "KVPOOL_ETCD_CERT_FILE", "KVPOOL_ETCD_KEY_FILE",
})


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings of a kvpool client.

    Args:
        nodes: control-plane addresses (``host:port``) of the nodes; required
            unless ``etcd_endpoints`` is given.
        request_timeout_s: most seconds one request to one node may take; a node
            that takes longer is treated as down (its circuit opens).
        connect_timeout_s: most seconds to open a connection (and to wait for the
            first read of the membership at start).
        max_idle_connections: idle data connections kept per node.
        verify_checksums: check each received block against the node's checksum.
        etcd_endpoints: etcd client URLs (``http://host:port``); when given, the
            nodes come from the cluster's membership in etcd and follow it live.
        cluster: the cluster name in etcd (``/kvpool/<cluster>/``).
        replicas: copies per key (R); None: the cluster config's in etcd, else 1.
        write_quorum: owners that must store a key for a put to succeed; None: the
            cluster config's in etcd, else 1. Clamped to the owners placed.
        io_threads: threads the blocking client uses to talk to several nodes at once.
        transport: how block bytes move: ``auto`` copies gets out of a node's
            shared-memory arena when the node runs on this machine (``shm``), else
            uses ``ucx`` when the node offers it and ucxx is installed, else
            ``tcp``, falling back to tcp when ucx fails; ``tcp`` always uses the
            socket; ``shm`` requires the arena (puts and the rest over tcp);
            ``ucx`` requires UCX for every op. A node that cannot do a required
            transport fails its keys with ``UNAVAILABLE``.
        location_ttl_s: over ``shm``, how long a block's place in the node's arena,
            once learned, is reused without asking the node (0: ask on every get).
            A repeat read is then one memcpy. Safe at any length (the slot's
            generation shows a deleted, evicted or overwritten block); the node does
            not see such reads, so this bounds how stale its eviction order gets,
            and how long a restarted node goes unnoticed.
        auth_token: the cluster's shared token, for nodes that require one
            (proved on every data connection and gRPC call).
        tls: CA (and client certificate) files for nodes whose gRPC port is TLS.
        etcd_tls: CA (and client certificate) files for etcd over TLS; ``https://``
            endpoints without it are verified against the system's roots.
    Raises:
        UsageError: no nodes and no etcd, a non-positive timeout, R/quorum out of
            range, or an unknown transport.
    """

    nodes: tuple[str, ...] = field(default_factory=tuple)
    request_timeout_s: float = 10.0
    connect_timeout_s: float = 3.0
    max_idle_connections: int = 8
    verify_checksums: bool = False
    etcd_endpoints: tuple[str, ...] = field(default_factory=tuple)
    cluster: str = "default"
    replicas: int | None = None
    write_quorum: int | None = None
    io_threads: int = 8
    transport: str = "auto"
    location_ttl_s: float = 0.5
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
        """Settings from the environment, then ``overrides``.

        Reads ``KVPOOL_NODES`` and ``KVPOOL_ETCD_ENDPOINTS`` (comma separated),
        ``KVPOOL_CLUSTER``, ``KVPOOL_REPLICAS``, ``KVPOOL_WRITE_QUORUM``,
        ``KVPOOL_REQUEST_TIMEOUT_S``, ``KVPOOL_TRANSPORT`` (auto, tcp, shm or ucx),
        ``KVPOOL_LOCATION_TTL_S`` and
        ``KVPOOL_AUTH_TOKEN_FILE`` (the token's file, the daemon's setting too) and
        ``KVPOOL_TLS_CA_FILE`` (with ``KVPOOL_TLS_CLIENT_CERT_FILE`` and
        ``KVPOOL_TLS_CLIENT_KEY_FILE`` for mTLS) and ``KVPOOL_ETCD_CA_FILE`` (with
        ``KVPOOL_ETCD_CERT_FILE`` and ``KVPOOL_ETCD_KEY_FILE``).

        Raises:
            UsageError: a malformed number, or an invalid combination (see the class).
        """
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        if env.get("KVPOOL_NODES"):
            values["nodes"] = _split(env["KVPOOL_NODES"])
        if env.get("KVPOOL_ETCD_ENDPOINTS"):
            values["etcd_endpoints"] = _split(env["KVPOOL_ETCD_ENDPOINTS"])
        if env.get("KVPOOL_CLUSTER"):
            values["cluster"] = env["KVPOOL_CLUSTER"].strip()
        if env.get("KVPOOL_TRANSPORT"):
            values["transport"] = env["KVPOOL_TRANSPORT"].strip().lower()
        if env.get("KVPOOL_AUTH_TOKEN_FILE"):
            values["auth_token"] = read_token(env["KVPOOL_AUTH_TOKEN_FILE"])
        values["tls"] = tls_from_env(env)
        values["etcd_tls"] = etcd_tls_from_env(env)
        for name, var, kind in (
            ("request_timeout_s", "KVPOOL_REQUEST_TIMEOUT_S", float),
            ("location_ttl_s", "KVPOOL_LOCATION_TTL_S", float),
            ("replicas", "KVPOOL_REPLICAS", int),
            ("write_quorum", "KVPOOL_WRITE_QUORUM", int),
        ):
            if env.get(var):
                values[name] = _number(var, env[var], kind)
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _number(var: str, text: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise UsageError(f"{var}={text!r} is not {'an integer' if kind is int else 'a number'}") from None
