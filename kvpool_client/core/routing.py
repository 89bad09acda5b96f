"""Which nodes hold a key: weighted rendezvous (highest-random-weight) hashing.

Every client computes placement locally from the same member list and gets the same
answer, so no per-block metadata is stored anywhere. When a node comes or goes,
only the keys it owned (or now owns) move.

Node states shape placement (see :class:`~kvpool_client.core.membership.records.NodeState`):

- ``active`` nodes take writes: a key's write owners are its top ``R`` active nodes;
- ``draining`` nodes take no writes but still serve what they hold, so they keep
  their rank in a key's read order;
- ``joining`` nodes are never placed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

from kvpool_client.core.errors import UsageError
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.membership.records import NodeRecord, NodeState

_U53 = float(1 << 53)
# The placement function this client implements; a cluster config asking for another is refused.
PLACEMENT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Member:
    """A node that can hold keys.

    Args:
        node_id: placement id (hashed with the key); the address for static node lists.
        address: gRPC control-plane ``host:port``.
        weight: relative share of keys; > 0.
        state: active, draining or joining.
        data_address: tcp data-plane ``host:port`` if known (from etcd); empty: ask the node.
    """

    node_id: str
    address: str
    weight: float = 1.0
    state: NodeState = NodeState.ACTIVE
    data_address: str = ""


@dataclass(frozen=True, slots=True)
class KeyPlacement:
    """Where one key lives, each list best first.

    Attributes:
        write_owners: the top ``R`` active members: where a put writes.
        read_order: members in rendezvous order, active and draining, cut after the
            ``R``-th active one: where a get looks, in this order.
        spares: the active members ranked after the write owners: where a write
            refused by a draining owner goes instead (the owner a fresher router
            would pick).
    """

    write_owners: tuple[Member, ...]
    read_order: tuple[Member, ...]
    spares: tuple[Member, ...] = ()


def rendezvous_score(node_id: str, key_hash: bytes, weight: float) -> float:
    """Weighted HRW score: ``-weight / ln(u)`` with ``u`` uniform in (0, 1) from a hash.

    A node of twice the weight wins twice as many keys, and scores of a node do not
    depend on the other nodes, which is what makes movement minimal.
    """
    # Seeding with the node id gives each node an independent hash of the key.
    h = xxhash.xxh3_64_intdigest(key_hash, seed=_seed(node_id))
    u = ((h >> 11) + 0.5) / _U53  # 53 bits, strictly inside (0, 1): log(u) is never 0
    return -weight / math.log(u)


@functools.lru_cache(maxsize=4096)
def _seed(node_id: str) -> int:
    return xxhash.xxh3_64_intdigest(node_id.encode())


def rank(key_hash: bytes, members: Iterable[Member]) -> list[Member]:
    """``members`` in rendezvous order for ``key_hash``, best first (ties by node id)."""
    return sorted(members, key=lambda m: (-rendezvous_score(m.node_id, key_hash, m.weight), m.node_id))


def place(key_hash: bytes, members: Sequence[Member], count: int = 1) -> list[Member]:
    """The ``count`` best-ranked of ``members`` for ``key_hash``, whatever their state."""
    return rank(key_hash, members)[:count]


def place_key(key_hash: bytes, members: Sequence[Member], replicas: int) -> KeyPlacement:
    """Placement of one key over ``members``: the pure function behind every router.

    Args:
        key_hash: the block hash (the namespace does not take part).
        members: the cluster; joining members are ignored.
        replicas: ``R``, copies per key (>= 1).
    """
    return _split(rank(key_hash, (m for m in members if m.state != NodeState.JOINING)), replicas)


def _split(ranked: list[Member], replicas: int) -> KeyPlacement:
    """Cut a ranking of active and draining members into writers, readers and spares."""
    if all(m.state == NodeState.ACTIVE for m in ranked):  # the common case, made cheap
        owners = tuple(ranked[:replicas])
        return KeyPlacement(owners, owners, tuple(ranked[replicas:]))
    writers: list[Member] = []
    readers: list[Member] = []
    spares: list[Member] = []
    for member in ranked:
        active = member.state == NodeState.ACTIVE
        if len(writers) < replicas:
            readers.append(member)
            if active:
                writers.append(member)
        elif active:
            spares.append(member)
    return KeyPlacement(tuple(writers), tuple(readers), tuple(spares))


class Router(Protocol):
    """Maps a key to the nodes that hold it."""

    def placement(self, key: BlockKey) -> KeyPlacement: ...

    def members(self) -> list[Member]: ...


class RendezvousRouter:
    """Weighted rendezvous placement over a fixed set of members (immutable).

    Args:
        members: the cluster, in any order; node ids must be unique.
        replicas: ``R``, copies per key (>= 1; fewer when fewer nodes are active).
    Raises:
        UsageError: duplicate node ids or ``replicas`` < 1.
    """

    def __init__(self, members: Sequence[Member], replicas: int = 1) -> None:
        ids = [m.node_id for m in members]
        if len(set(ids)) != len(ids):
            raise UsageError(f"duplicate node ids in {ids}")
        if replicas < 1:
            raise UsageError(f"replicas must be >= 1, not {replicas}")
        self._members = sorted(members, key=lambda m: m.node_id)
        self._placeable = [m for m in self._members if m.state != NodeState.JOINING]
        self.replicas = replicas
        # With one placeable member every key lands on it: no ranking per key.
        self._only = _split(self._placeable, replicas) if len(self._placeable) == 1 else None

    def placement(self, key: BlockKey) -> KeyPlacement:
        """Where ``key`` lives: the same answer as :func:`place_key` over this router's members."""
        if self._only is not None:
            return self._only
        return _split(rank(key.hash, self._placeable), self.replicas)

    def write_owners(self, key: BlockKey) -> list[Member]:
        """The top ``R`` active members for ``key``: where a put writes."""
        return list(self.placement(key).write_owners)

    def read_order(self, key: BlockKey) -> list[Member]:
        """Active and draining members for ``key``, cut after the ``R``-th active one."""
        return list(self.placement(key).read_order)

    def members(self) -> list[Member]:
        return list(self._members)


class StaticRouter(RendezvousRouter):
    """Placement over a fixed list of node addresses (no membership service).

    Args:
        addresses: control-plane ``host:port`` of each node; the address is the
            placement id, so every client given the same list places alike.
        replicas: owners per key, clamped to 1..len(addresses).
    Raises:
        UsageError: no address, or a duplicate.
    """

    def __init__(self, addresses: Sequence[str], replicas: int = 1) -> None:
        if not addresses:
            raise UsageError("at least one node address is required")
        if len(set(addresses)) != len(addresses):
            raise UsageError(f"duplicate node addresses in {list(addresses)}")
        super().__init__([Member(a, a) for a in addresses], max(1, min(replicas, len(addresses))))
        self._order = [Member(a, a) for a in addresses]

    def members(self) -> list[Member]:
        """The members in the order given."""
        return list(self._order)


def member_of(record: NodeRecord) -> Member:
    """The placement member for a node record (its tcp data endpoint included)."""
    return Member(record.node_id, record.address, record.weight, record.state, record.data_endpoints.get("tcp", ""))
