"""Each tenant's share of a node's data plane: bytes per second, as a token bucket its connections share.

A tenant with ``quotas.rate`` is served at most that many bytes per second (sent and received
together) over all its data connections to the node: after each request its bytes are charged,
and a connection in debt waits before its next request is read. So one tenant flooding within
its rights leaves the node's CPU to the others, as its byte quotas leave them the memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

_BURST_S = 0.1  # a bucket holds this many seconds of its rate: short bursts go at full speed


class Bucket:
    """A token bucket of ``rate`` bytes per second; :meth:`charge` says how long to wait."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._capacity = rate * _BURST_S
        self._tokens = self._capacity
        self._at = clock()
        self._lock = threading.Lock()  # a tenant's connections are served by every worker thread

    def charge(self, nbytes: int) -> float:
        """Take ``nbytes``; the seconds to wait before the next request (0: none)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._capacity, self._tokens + (now - self._at) * self.rate) - nbytes
            self._at = now
            return -self._tokens / self.rate if self._tokens < 0 else 0.0


class TenantRates:
    """The buckets of the tenants with a rate, made at first use and kept while the rate stays."""

    def __init__(self) -> None:
        self._buckets: dict[str, Bucket] = {}
        self._lock = threading.Lock()

    def bucket(self, tenant: str, rate: int) -> Bucket:
        with self._lock:
            found = self._buckets.get(tenant)
            if found is None or found.rate != rate:
                found = self._buckets[tenant] = Bucket(rate)
            return found
