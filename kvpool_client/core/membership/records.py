"""What kvpool keeps in etcd, and where: node records and the cluster config.

Layout (``<cluster>`` names one pool; several pools can share an etcd)::

    /kvpool/<cluster>/nodes/<node-id>   NodeRecord, JSON, attached to the node's lease
    /kvpool/<cluster>/config            ClusterConfig, JSON, no lease

Values are JSON objects with a ``schema`` number. Decoding is strict about the fields
it knows (present, right type, in range) and ignores fields it does not know, so a
newer daemon can add a field without hiding itself from older clients. Anything
else raises :class:`RecordError`; readers log it and skip the key.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvpool_client.core.membership.errors import RecordError

SCHEMA = 1
ROOT = "/kvpool/"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TRANSPORT_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
MAX_REPLICAS = 16


class NodeState(enum.StrEnum):
    """Life cycle of a node in the pool; clients place new writes on ``active`` nodes only."""

    JOINING = "joining"  # registered, not yet taking writes
    ACTIVE = "active"
    DRAINING = "draining"  # serves reads, takes no writes, about to leave


# (from, to) pairs that set_state accepts; anything else is a caller error.
STATE_TRANSITIONS = frozenset(
    {
        (NodeState.JOINING, NodeState.ACTIVE),
        (NodeState.JOINING, NodeState.DRAINING),
        (NodeState.ACTIVE, NodeState.DRAINING),
        (NodeState.DRAINING, NodeState.ACTIVE),
    }
)


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a valid cluster or node id (``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``).

    Raises:
        ValueError: it is not; a ``/`` would break the key layout.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"invalid {kind} {name!r}: use letters, digits, '.', '_' or '-' (at most 128)")
    return name


def cluster_prefix(cluster: str) -> str:
    """``/kvpool/<cluster>/``: everything of one cluster, watched as one prefix."""
    return f"{ROOT}{check_name('cluster name', cluster)}/"


def nodes_prefix(cluster: str) -> str:
    """``/kvpool/<cluster>/nodes/``."""
    return cluster_prefix(cluster) + "nodes/"


def node_key(cluster: str, node_id: str) -> str:
    """``/kvpool/<cluster>/nodes/<node-id>``."""
    return nodes_prefix(cluster) + check_name("node id", node_id)


def config_key(cluster: str) -> str:
    """``/kvpool/<cluster>/config``."""
    return cluster_prefix(cluster) + "config"


def check_address(address: str) -> str:
    """Return ``address`` if it is ``host:port`` (IPv6 hosts in brackets) with a port in 1..65535.

    Raises:
        ValueError: it is not.
    """
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid address {address!r}: expected host:port")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"invalid address {address!r}: write IPv6 hosts as [addr]:port")
    return address


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One daemon as the cluster sees it.

    Args:
        node_id: placement id; also the last part of the record's key.
        address: gRPC control-plane ``host:port`` clients connect to.
        data_endpoints: transport name (``tcp``, ``ucx``, ``shm``) -> address.
        state: joining, active or draining.
        capacity_bytes: bytes of storage the node offers (all tiers).
        weight: relative share of keys in placement; > 0.
        version: the daemon's package version.
        registered_at: unix time the daemon first registered.
    Raises:
        ValueError: a field is out of range (the constructor validates).
    """

    node_id: str
    address: str
    data_endpoints: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    state: NodeState = NodeState.JOINING
    capacity_bytes: int = 0
    weight: float = 1.0
    version: str = ""
    registered_at: float = 0.0

    def __post_init__(self) -> None:
        check_name("node id", self.node_id)
        check_address(self.address)
        endpoints = dict(self.data_endpoints)
        for transport, addr in endpoints.items():
            if not isinstance(transport, str) or not _TRANSPORT_RE.fullmatch(transport):
                raise ValueError(f"invalid transport name {transport!r}")
            if not isinstance(addr, str) or not addr:
                raise ValueError(f"invalid address {addr!r} for transport {transport}")
        # Read-only, so a snapshot shared across threads cannot be changed under a reader.
        object.__setattr__(self, "data_endpoints", MappingProxyType(endpoints))
        object.__setattr__(self, "state", NodeState(self.state))
        if isinstance(self.capacity_bytes, bool) or not isinstance(self.capacity_bytes, int) or self.capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be an int >= 0, not {self.capacity_bytes!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)):
            raise ValueError(f"weight must be a number, not {self.weight!r}")
        if not math.isfinite(self.weight) or self.weight <= 0:
            raise ValueError(f"weight must be finite and > 0, not {self.weight!r}")
        object.__setattr__(self, "weight", float(self.weight))
        if not isinstance(self.version, str):
            raise ValueError("version must be a string")
        if isinstance(self.registered_at, bool) or not isinstance(self.registered_at, (int, float)):
            raise ValueError("registered_at must be a number")
        object.__setattr__(self, "registered_at", float(self.registered_at))

    def with_state(self, state: NodeState | str) -> NodeRecord:
        """A copy in ``state`` (no transition check: see :data:`STATE_TRANSITIONS`)."""
        return dataclasses.replace(self, state=NodeState(state))

    def to_json(self) -> bytes:
        """The value stored in etcd (compact JSON, sorted keys)."""
        return _dump(
            {
                "schema": SCHEMA,
                "node_id": self.node_id,
                "address": self.address,
                "data_endpoints": dict(self.data_endpoints),
                "state": self.state.value,
                "capacity_bytes": self.capacity_bytes,
                "weight": self.weight,
                "version": self.version,
                "registered_at": self.registered_at,
            }
        )

    @classmethod
    def from_json(cls, data: bytes, *, expected_id: str | None = None) -> NodeRecord:
        """Decode a stored value.

        Args:
            data: the etcd value.
            expected_id: the node id taken from the key; the record must agree.
        Raises:
            RecordError: bad JSON, wrong schema, a missing or malformed field, or an id mismatch.
        """
        obj = _load(data, "node record")
        try:
            endpoints = _field(obj, "data_endpoints", dict)
            record = cls(
                node_id=_field(obj, "node_id", str),
                address=_field(obj, "address", str),
                data_endpoints=endpoints,
                state=NodeState(_field(obj, "state", str)),
                capacity_bytes=_field(obj, "capacity_bytes", int),
                weight=_field(obj, "weight", (int, float)),
                version=_field(obj, "version", str),
                registered_at=_field(obj, "registered_at", (int, float)),
            )
        except ValueError as exc:
            raise RecordError(f"invalid node record: {exc}") from None
        if expected_id is not None and record.node_id != expected_id:
            raise RecordError(f"node record says node_id {record.node_id!r} under the key of {expected_id!r}")
        return record


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Settings every client of a cluster must agree on.

    Args:
        block_size: tokens per KV block (the engine's page size); keys cover full blocks.
        replicas: copies of each block (R), 1..16.
        write_quorum: stored copies for a put to succeed, 1..replicas.
        placement_version: bumped when the placement function changes; clients
            refuse a version they do not implement instead of misplacing keys.
    Raises:
        ValueError: a field is out of range.
    """

    block_size: int = 16
    replicas: int = 1
    write_quorum: int = 1
    placement_version: int = 1

    def __post_init__(self) -> None:
        for name in ("block_size", "replicas", "write_quorum", "placement_version"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, not {value!r}")
        if not 0 < self.block_size <= 1 << 20:
            raise ValueError(f"block_size must be in 1..{1 << 20}, not {self.block_size}")
        if not 0 < self.replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be in 1..{MAX_REPLICAS}, not {self.replicas}")
        if not 0 < self.write_quorum <= self.replicas:
            raise ValueError(f"write_quorum must be in 1..replicas ({self.replicas}), not {self.write_quorum}")
        if self.placement_version < 1:
            raise ValueError(f"placement_version must be >= 1, not {self.placement_version}")

    def to_json(self) -> bytes:
        return _dump(
            {
                "schema": SCHEMA,
                "block_size": self.block_size,
                "replicas": self.replicas,
                "write_quorum": self.write_quorum,
                "placement_version": self.placement_version,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> ClusterConfig:
        """Decode a stored value.

        Raises:
            RecordError: bad JSON, wrong schema, a missing or malformed field.
        """
        obj = _load(data, "cluster config")
        try:
            return cls(
                block_size=_field(obj, "block_size", int),
                replicas=_field(obj, "replicas", int),
                write_quorum=_field(obj, "write_quorum", int),
                placement_version=_field(obj, "placement_version", int),
            )
        except ValueError as exc:
            raise RecordError(f"invalid cluster config: {exc}") from None


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RecordError(f"{what} is not a JSON object")
    if obj.get("schema") != SCHEMA:
        raise RecordError(f"{what} has schema {obj.get('schema')!r}; this version reads schema {SCHEMA}")
    return obj


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in obj:
        raise ValueError(f"missing field {name!r}")
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"field {name!r} has the wrong type ({type(value).__name__})")
    return value
