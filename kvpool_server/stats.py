"""Named monotonic counters (declared in :mod:`kvpool_server.metric_names`) and request latency
histograms, kept per daemon."""

from __future__ import annotations

import difflib
import threading
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

from kvpool_server.metric_names import COUNTER_KEYS


class UnknownCounter(LookupError):
    """A counter key that :mod:`kvpool_server.metric_names` does not declare: a programming error."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        nearest = difflib.get_close_matches(name, list(known), n=1)
        hint = f" (did you mean {nearest[0]!r}?)" if nearest else ""
        super().__init__(f"counter {name!r} is not declared in kvpool_server/metric_names.py{hint}")


class Counters:
    """The daemon's named counters, every one declared in :mod:`kvpool_server.metric_names`.

    All keys start at zero, so GetStats can name every counter from the first call,
    and an undeclared key raises :class:`UnknownCounter` instead of
    starting a series that ``/metrics`` would never export. ``+=`` on a dict entry is
    a read-modify-write that a thread switch can split, so updates take a lock
    (uncontended: well under a microsecond).
    """

    __slots__ = ("_values", "_lock")

    def __init__(self) -> None:
        self._values: dict[str, int] = dict.fromkeys(COUNTER_KEYS, 0)
        self._lock = threading.Lock()

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to ``name``. Raises: UnknownCounter: ``name`` is not declared."""
        with self._lock:
            try:
                self._values[name] += amount
            except KeyError:
                raise UnknownCounter(name, self._values) from None

    def get(self, name: str) -> int:
        """The value of ``name``. Raises: UnknownCounter: ``name`` is not declared."""
        try:
            return self._values[name]
        except KeyError:
            raise UnknownCounter(name, self._values) from None

    def snapshot(self, *, zeros: bool = False) -> dict[str, int]:
        """The counters that have moved; with ``zeros``, every declared counter (GetStats, /metrics)."""
        with self._lock:
            return dict(self._values) if zeros else {name: value for name, value in self._values.items() if value}


# Upper bounds in seconds: the first resolve small gets on loopback, the middle batches of MiBs,
# the last requests that stalled.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


@dataclass(slots=True)
class Histogram:
    """Counts per bucket (the last is +Inf) and the sum of observed values."""

    counts: list[int]
    total: float = 0.0

    def cumulative(self) -> list[int]:
        return list(accumulate(self.counts))


class Latencies:
    """Request durations per operation, bucketed for a Prometheus histogram."""

    __slots__ = ("_bounds", "_by_op", "_lock")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self._bounds = bounds
        self._by_op: dict[str, Histogram] = {}
        self._lock = threading.Lock()

    @property
    def bounds(self) -> tuple[float, ...]:
        return self._bounds

    def observe(self, op: str, seconds: float) -> None:
        slot = bisect_left(self._bounds, seconds)
        with self._lock:
            histogram = self._by_op.get(op)
            if histogram is None:
                histogram = self._by_op[op] = Histogram([0] * (len(self._bounds) + 1))
            histogram.counts[slot] += 1
            histogram.total += seconds

    def snapshot(self) -> dict[str, Histogram]:
        with self._lock:
            return {op: Histogram(list(h.counts), h.total) for op, h in self._by_op.items()}
