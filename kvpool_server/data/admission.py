"""What the daemon admits before it spends memory on a peer: connections, and put bytes in flight.

A put's slots are reserved one block at a time as its bytes arrive (see the session), so a
peer that announces much and sends nothing holds one slot, not the arena. Across every
connection, the bytes reserved for puts not yet committed stay under a budget (a share of the
arena): past it a block is refused with ``OVERLOADED``, a retryable answer, and its payload
is discarded into one sink every session shares (its contents never matter), so refused bytes
cost no memory per connection. Connections are capped per daemon and per peer address.

Thread-safe: the data plane's worker loops run on several threads.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from kvpool_server.stats import Counters
from kvpool_server.tenants.rates import TenantRates

SINK_BYTES = 1 << 20  # refused payload is read through this, in pieces


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Attributes:
    inflight_put_bytes: most slot bytes reserved by puts whose payload is still arriving.
    connections: most data connections at once (every transport together).
    connections_per_peer: most data connections from one peer address.
    """

    inflight_put_bytes: int
    connections: int
    connections_per_peer: int


TENANT_SHARE = 0.5  # of the put budget one tenant (with limited rights) may hold in flight


class Admission:
    """The daemon-wide budgets every data connection draws from.

    Args:
        limits: the budgets.
        counters: where refusals are counted (``connections_refused``, ``puts_overloaded``).
    """

    def __init__(self, limits: AdmissionLimits, counters: Counters) -> None:
        self.limits = limits
        self._counters = counters
        self._lock = threading.Lock()
        self._inflight = 0
        self._connections: Counter[str] = Counter()
        self._tenants: Counter[str] = Counter()  # proven connections per tenant with a cap
        self._tenant_inflight: Counter[str] = Counter()  # put bytes in flight per tenant
        self.rates = TenantRates()  # the byte rates of tenants that have one
        self.sink = memoryview(bytearray(SINK_BYTES))  # shared: what lands in it is dropped

    @property
    def inflight_put_bytes(self) -> int:
        return self._inflight

    def connect(self, peer: str) -> bool:
        """Admit a connection from ``peer`` (``host:port``); False: over a limit, close it."""
        host = peer_host(peer)
        with self._lock:
            total = sum(self._connections.values())
            if total >= self.limits.connections or self._connections[host] >= self.limits.connections_per_peer:
                admitted = False
            else:
                self._connections[host] += 1
                admitted = True
        if not admitted:
            self._counters.add("connections_refused")
        return admitted

    def disconnect(self, peer: str) -> None:
        host = peer_host(peer)
        with self._lock:
            self._connections[host] -= 1
            if self._connections[host] <= 0:
                del self._connections[host]

    def join(self, tenant: str, cap: int) -> bool:
        """Admit a connection that proved ``tenant``'s token; False (counted): the tenant holds ``cap``
        connections already, close it."""
        with self._lock:
            admitted = self._tenants[tenant] < cap
            if admitted:
                self._tenants[tenant] += 1
        if not admitted:
            self._counters.add("connections_refused")
        return admitted

    def tenant_connections(self) -> dict[str, int]:
        """The data connections of each tenant that has a cap, now."""
        with self._lock:
            return dict(self._tenants)

    def leave(self, tenant: str) -> None:
        """A connection :meth:`join` admitted ended."""
        with self._lock:
            self._tenants[tenant] -= 1
            if self._tenants[tenant] <= 0:
                del self._tenants[tenant]

    def take(self, nbytes: int, tenant: str = "") -> bool:
        """Reserve ``nbytes`` of the put budget; False (counted): over it, refuse the block.

        A ``tenant`` (one with limited rights) may hold at most :data:`TENANT_SHARE` of the
        budget: one tenant's stalled or flooding puts leave the rest to the others.
        """
        limit = self.limits.inflight_put_bytes
        with self._lock:
            admitted = self._inflight + nbytes <= limit and (
                not tenant or self._tenant_inflight[tenant] + nbytes <= limit * TENANT_SHARE
            )
            if admitted:
                self._inflight += nbytes
                if tenant:
                    self._tenant_inflight[tenant] += nbytes
        if not admitted:
            self._counters.add("puts_overloaded")
        return admitted

    def give(self, nbytes: int, tenant: str = "") -> None:
        """Return ``nbytes`` taken by :meth:`take` (the block was committed or aborted)."""
        with self._lock:
            self._inflight -= nbytes
            if tenant:
                self._tenant_inflight[tenant] -= nbytes
                if self._tenant_inflight[tenant] <= 0:
                    del self._tenant_inflight[tenant]


def peer_host(peer: str) -> str:
    """The address part of ``host:port`` (``[v6]:port`` too): connections are counted per host."""
    return peer.rpartition(":")[0] or peer
