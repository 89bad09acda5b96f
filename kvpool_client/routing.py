"""Which node owns a key: weighted rendezvous (highest-random-weight) hashing.

Every client computes placement locally from the same node list and gets the same
answer, so no per-block metadata is stored anywhere. When a node comes or goes,
only the keys it owned (or now owns) move.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

from kvpool_client.errors import UsageError
from kvpool_client.keys import BlockKey

_U53 = float(1 << 53)


@dataclass(frozen=True, slots=True)
class Member:
    """A node that can own keys: its placement id, control address and weight."""

    node_id: str
    address: str
    weight: float = 1.0


def rendezvous_score(node_id: str, key_hash: bytes, weight: float) -> float:
    """Weighted HRW score: ``-weight / ln(u)`` with ``u`` uniform in (0, 1) from a hash.

    A node of twice the weight wins twice as many keys, and scores of a node do not
    depend on the other nodes, which is what makes movement minimal.
    """
    # Seeding with the node id gives each node an independent hash of the key.
    h = xxhash.xxh3_64_intdigest(key_hash, seed=xxhash.xxh3_64_intdigest(node_id.encode()))
    u = ((h >> 11) + 0.5) / _U53  # 53 bits, strictly inside (0, 1): log(u) is never 0
    return -weight / math.log(u)


def place(key_hash: bytes, members: Sequence[Member], count: int = 1) -> list[Member]:
    """The ``count`` owners of ``key_hash``, best first."""
    ranked = sorted(members, key=lambda m: rendezvous_score(m.node_id, key_hash, m.weight), reverse=True)
    return ranked[:count]


class Router(Protocol):
    """Maps a key to the nodes that should hold it, best first."""

    def owners(self, key: BlockKey) -> list[Member]: ...

    def members(self) -> list[Member]: ...


class StaticRouter:
    """Placement over a fixed list of node addresses (no membership service).

    Args:
        addresses: control-plane ``host:port`` of each node; the address is the
            placement id, so every client given the same list places alike.
        replicas: owners per key.
    """

    def __init__(self, addresses: Sequence[str], replicas: int = 1) -> None:
        if not addresses:
            raise UsageError("at least one node address is required")
        if len(set(addresses)) != len(addresses):
            raise UsageError(f"duplicate node addresses in {list(addresses)}")
        self._members = [Member(a, a) for a in addresses]
        self._replicas = max(1, min(replicas, len(addresses)))

    def owners(self, key: BlockKey) -> list[Member]:
        if len(self._members) == 1:
            return list(self._members)
        return place(key.hash, self._members, self._replicas)

    def members(self) -> list[Member]:
        return list(self._members)
