"""Named monotonic counters, kept per daemon and shown by GetStats."""

from __future__ import annotations

import threading
from collections import Counter


class Counters:
    """A bag of named counters, updated from every data-plane thread.

    ``+=`` on a dict entry is a read-modify-write that a thread switch can split,
    so updates take a lock (uncontended: well under a microsecond).
    """

    __slots__ = ("_values", "_lock")

    def __init__(self) -> None:
        self._values: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def get(self, name: str) -> int:
        return self._values[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
