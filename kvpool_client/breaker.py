"""Per-node circuit breaker: stop sending to a node the moment it fails, probe it later.

A connection error or a timeout opens a node's circuit at once, so the next request
goes straight to a replica instead of paying the same failure again (the etcd lease
of a dead node takes seconds to expire; a hung node would cost a full timeout per
request). After a back-off one probe request is let through (half-open): its
success closes the circuit, its failure re-opens it with a longer back-off.

Pure state and an injected clock: no I/O, no sleeping, safe from any thread.
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvpool_client.core.errors import KVPoolError, NodeUnavailable, RequestTimeout


class CircuitState(enum.StrEnum):
    """Where a node's circuit stands."""

    CLOSED = "closed"  # healthy: every request goes through
    OPEN = "open"  # failed recently: requests skip it until the back-off ends
    HALF_OPEN = "half_open"  # back-off over, one probe is in flight


@dataclass(slots=True)
class _Circuit:
    failures: int = 0  # consecutive failures; 0 means closed
    retry_at: float = 0.0  # when the next probe may go (open)
    probe_since: float | None = None  # when the in-flight probe was let through


class CircuitBreaker:
    """Tracks which nodes to skip, by node id.

    Args:
        clock: monotonic seconds (inject a fake in tests).
        initial_backoff_s: back-off after the first failure.
        max_backoff_s: cap; the back-off doubles per consecutive failure up to it.
        jitter: each back-off is drawn from ``[d * (1 - jitter), d]`` so clients that
            saw a node die together do not probe it in lockstep; 0 disables.
        probe_timeout_s: a probe that has not reported after this long is presumed
            lost (its caller was cancelled) and another one is let through.
        rng: source of jitter (seed it in tests).
    Raises:
        ValueError: non-positive back-offs, ``max < initial`` or jitter outside [0, 1).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        jitter: float = 0.2,
        probe_timeout_s: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial_backoff_s <= max_backoff_s or probe_timeout_s <= 0:
            raise ValueError("need 0 < initial_backoff_s <= max_backoff_s and probe_timeout_s > 0")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        self._clock = clock
        self._initial = initial_backoff_s
        self._max = max_backoff_s
        self._jitter = jitter
        self._probe_timeout = probe_timeout_s
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._circuits: dict[str, _Circuit] = {}

    def allow(self, node_id: str) -> bool:
        """May a request go to ``node_id`` now?

        True for a closed circuit. For an open one, False until its back-off ends;
        then True once (that caller carries the probe and must report it with
        :meth:`success` or :meth:`failure`), False for everyone else meanwhile.
        """
        if node_id not in self._circuits:  # closed: no lock on every request (a dict read is atomic)
            return True
        with self._lock:
            circuit = self._circuits.get(node_id)
            if circuit is None:
                return True
            now = self._clock()
            if circuit.probe_since is not None and now - circuit.probe_since < self._probe_timeout:
                return False
            if now < circuit.retry_at:
                return False
            circuit.probe_since = now
            return True

    def success(self, node_id: str) -> None:
        """The node answered: close its circuit."""
        if node_id not in self._circuits:  # closed already, the common case
            return
        with self._lock:
            self._circuits.pop(node_id, None)

    def failure(self, node_id: str) -> float:
        """The node could not be reached or did not answer in time: open its circuit.

        Returns:
            The back-off in seconds before the next probe.
        """
        with self._lock:
            circuit = self._circuits.setdefault(node_id, _Circuit())
            now = self._clock()
            if circuit.failures and now < circuit.retry_at and circuit.probe_since is None:
                return circuit.retry_at - now  # requests already in flight: one outage, one step
            circuit.failures += 1
            backoff = self.backoff(circuit.failures)
            circuit.retry_at = self._clock() + backoff
            circuit.probe_since = None
            return backoff

    def record(self, node_id: str, error: KVPoolError) -> bool:
        """Account for a request that ended in ``error``.

        Returns:
            True when the node is unreachable or hung: the caller should also drop
            its pooled connections. Any other error is an answer, which closes the circuit.
        """
        if isinstance(error, (NodeUnavailable, RequestTimeout)):
            self.failure(node_id)
            return True
        self.success(node_id)
        return False

    def backoff(self, failures: int) -> float:
        """The back-off after ``failures`` consecutive failures (>= 1), jitter applied."""
        bound = min(self._max, self._initial * 2.0 ** min(failures - 1, 62))
        return bound * (1 - self._jitter * self._rng.random())

    def state(self, node_id: str) -> CircuitState:
        """The node's circuit as of now (no side effect)."""
        with self._lock:
            circuit = self._circuits.get(node_id)
            if circuit is None:
                return CircuitState.CLOSED
            probing = circuit.probe_since is not None and self._clock() - circuit.probe_since < self._probe_timeout
            return CircuitState.HALF_OPEN if probing else CircuitState.OPEN

    def open_nodes(self) -> list[str]:
        """Ids of the nodes whose circuit is not closed, sorted."""
        with self._lock:
            return sorted(self._circuits)

    def reset(self, node_id: str) -> None:
        """Forget a node's failures (it was replaced: new address or new process)."""
        self.success(node_id)

    def gate(self) -> Callable[[str], bool]:
        """:meth:`allow` memoized per node: one decision per node for one round of requests.

        A planner asks about a node once per key; the memo makes every key of a round
        agree, and claims a half-open node's single probe at most once.
        """
        decided: dict[str, bool] = {}

        def usable(node_id: str) -> bool:
            verdict = decided.get(node_id)
            if verdict is None:
                verdict = decided[node_id] = self.allow(node_id)
            return verdict

        return usable
