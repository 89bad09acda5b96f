"""What a fuzzer saw: outcomes per case and per kind of case, and samples of the worst cases.

Fuzzer processes send their tally back as a dict (``to_dict``); the run merges them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Tally:
    """What one fuzzer saw: outcomes, per-kind outcomes, and samples of the worst cases."""

    outcomes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    hangs: list[str] = field(default_factory=list)  # hex of the case bytes, for a reproduction
    bad_responses: list[str] = field(default_factory=list)
    slowest_s: float = 0.0
    seconds_by_outcome: Counter[str] = field(default_factory=Counter)

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())

    def add(self, kind: str, outcome: str, took: float) -> None:
        self.outcomes[outcome] += 1
        self.kinds[f"{kind.split('/')[0]}:{outcome}"] += 1
        self.slowest_s = max(self.slowest_s, took)
        self.seconds_by_outcome[outcome] += took

    def to_dict(self) -> dict:
        return {"outcomes": dict(self.outcomes), "kinds": dict(self.kinds), "hangs": self.hangs,
                "bad_responses": self.bad_responses, "slowest_s": self.slowest_s,
                "seconds_by_outcome": dict(self.seconds_by_outcome)}  # fmt: skip

    def merge(self, other: dict) -> None:
        self.outcomes.update(other["outcomes"])
        self.kinds.update(other["kinds"])
        self.hangs += other["hangs"]
        self.bad_responses += other["bad_responses"]
        self.slowest_s = max(self.slowest_s, other["slowest_s"])
        self.seconds_by_outcome.update(other["seconds_by_outcome"])
