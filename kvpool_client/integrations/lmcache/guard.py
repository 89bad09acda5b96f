"""The boundary between the pool and LMCache's calls: a failure becomes a miss, never an exception.

LMCache runs every remote call on its storage event loop or on the engine's thread; an
exception there is logged by LMCache, but it also cancels sibling work and, in a get,
costs every chunk of the batch. The connector answers each call through :class:`Guard`
instead: the call's "nothing" answer (a miss, False, 0) and one warning per kind of
failure and call every ``interval_s`` (a dead pool fails every call until it is back).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger("kvpool_client.integrations.lmcache")

LOG_INTERVAL_S = 10.0


class Guard:
    """Runs pool calls, turning their exceptions into a given answer and rate-limited warnings.

    Args:
        interval_s: least time between two warnings about one call and exception type.
        clock: monotonic seconds.
    """

    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()  # the loop thread and the engine's threads both report
        self._last: dict[tuple[str, str], float] = {}
        self._quiet: dict[tuple[str, str], int] = {}

    def call(self, what: str, run: Callable[[], T], otherwise: T) -> T:
        """``run()``, or ``otherwise`` if it raised."""
        try:
            return run()
        except Exception as exc:  # a broken pool must not break the engine
            self.failed(what, exc)
            return otherwise

    async def wait(self, what: str, run: Awaitable[T], otherwise: T) -> T:
        """``await run``, or ``otherwise`` if it raised. Cancellation still propagates:
        LMCache cancels a get that outlived its ``blocking_timeout_secs``."""
        try:
            return await run
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken pool must not break the engine
            self.failed(what, exc)
            return otherwise

    def failed(self, what: str, exc: BaseException | str) -> None:
        """Report that ``what`` failed (an exception, or a description of the statuses)."""
        kind = type(exc).__name__ if isinstance(exc, BaseException) else "status"
        key = (what, kind)
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval_s:
                self._quiet[key] = self._quiet.get(key, 0) + 1
                return
            self._last[key] = now
            quiet = self._quiet.pop(key, 0)
        again = f" ({quiet} more since the last report)" if quiet else ""
        log.warning("kvpool LMCache plugin: %s failed, answered as a miss: %s%s", what, exc, again)
