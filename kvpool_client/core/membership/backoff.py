"""Bounded exponential back-off with jitter, for reconnect loops."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double from ``initial_s`` up to ``max_s``, each drawn from [d/2, d].

    The jitter keeps a fleet of clients that lost etcd together from coming back in
    lockstep; the lower bound keeps a flapping etcd from being hammered.

    Args:
        initial_s: the first delay's upper bound.
        max_s: the cap.
        rng: source of jitter (seed it in tests).
    Raises:
        ValueError: ``initial_s`` <= 0 or ``max_s`` < ``initial_s``.
    """

    def __init__(self, initial_s: float = 0.1, max_s: float = 5.0, rng: random.Random | None = None) -> None:
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError("need 0 < initial_s <= max_s")
        self.initial_s = initial_s
        self.max_s = max_s
        self._rng = rng or random.Random()
        self._bound = initial_s

    def next(self) -> float:
        """The next delay in seconds; the bound doubles after each call."""
        delay = self._rng.uniform(self._bound / 2, self._bound)
        self._bound = min(self._bound * 2, self.max_s)
        return delay

    def reset(self) -> None:
        """Back to ``initial_s`` (after a success)."""
        self._bound = self.initial_s
