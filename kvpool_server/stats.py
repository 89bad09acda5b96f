"""Named monotonic counters, kept per daemon and shown by GetStats."""

from __future__ import annotations

from collections import Counter


class Counters:
    """A bag of named counters; cheap enough for the hot path (one dict update)."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: Counter[str] = Counter()

    def add(self, name: str, amount: int = 1) -> None:
        self._values[name] += amount

    def get(self, name: str) -> int:
        return self._values[name]

    def snapshot(self) -> dict[str, int]:
        return dict(self._values)
