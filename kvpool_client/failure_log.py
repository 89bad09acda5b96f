"""Says, once in a while and not on every request, that a node failed and why.

A client whose node is down or refuses its token keeps working (keys fail, lookups miss), so
without a log line a misconfigured engine quietly runs without the pool. Each (node, error
code) is logged at most once per interval; what was left unsaid is counted in the next line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvpool_client.core.errors import ErrorCode, KVPoolError

log = logging.getLogger("kvpool.client")

LOG_INTERVAL_S = 30.0


class FailureLog:
    """Rate-limited warnings of node failures; thread-safe.

    Args:
        interval_s: least time between two lines about one node and error code.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[tuple[str, ErrorCode], float] = {}
        self._quiet: dict[tuple[str, ErrorCode], int] = {}

    def note(self, node: str, exc: KVPoolError) -> bool:
        """Record that a request to ``node`` (``node_id address``) failed with ``exc``; True if logged."""
        key = (node, exc.code)
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval_s:
                self._quiet[key] = self._quiet.get(key, 0) + 1
                return False
            self._last[key] = now
            quiet = self._quiet.pop(key, 0)
        again = f" ({quiet} more since the last report)" if quiet else ""
        log.warning("kvpool node %s: %s%s", node, describe(exc), again)
        return True


def node_label(node_id: str, address: str) -> str:
    """``node-1 (10.0.0.5:7700)``, or the address alone where it is the node's id (static lists)."""
    return address if node_id == address else f"{node_id} ({address})"


def describe(exc: KVPoolError) -> str:
    """What went wrong, in words a user acts on (a rejected token says so)."""
    if exc.code is ErrorCode.UNAUTHENTICATED:
        return f"refused this client's token, or it sent none ({exc.args[0]})"
    return f"{exc.code.name}: {exc.args[0]}"
