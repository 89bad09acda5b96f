"""Client settings: where the nodes are and how long to wait for them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvpool_client.errors import UsageError


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings of a kvpool client.

    Args:
        nodes: control-plane addresses (``host:port``) of the nodes.
        request_timeout_s: most seconds one request to one node may take.
        connect_timeout_s: most seconds to open a connection.
        max_idle_connections: idle data connections kept per node.
        verify_checksums: check each received block against the node's checksum.
    """

    nodes: tuple[str, ...] = field(default_factory=tuple)
    request_timeout_s: float = 10.0
    connect_timeout_s: float = 3.0
    max_idle_connections: int = 8
    verify_checksums: bool = False

    def __post_init__(self) -> None:
        if not self.nodes:
            raise UsageError("no kvpool nodes given (pass nodes=[...] or set KVPOOL_NODES=host:port,...)")
        if self.request_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise UsageError("timeouts must be positive")
        if self.max_idle_connections < 0:
            raise UsageError("max_idle_connections must be >= 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> ClientConfig:
        """Settings from ``KVPOOL_NODES`` (comma separated) and ``KVPOOL_REQUEST_TIMEOUT_S``."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        if env.get("KVPOOL_NODES"):
            values["nodes"] = tuple(n.strip() for n in env["KVPOOL_NODES"].split(",") if n.strip())
        if env.get("KVPOOL_REQUEST_TIMEOUT_S"):
            values["request_timeout_s"] = float(env["KVPOOL_REQUEST_TIMEOUT_S"])
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
