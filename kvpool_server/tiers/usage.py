"""How full a tier is: the figures every tier reports the same way."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TierUsage:
    capacity_bytes: int
    used_bytes: int  # DRAM: bytes of allocated slots; SSD: bytes of segment files
    blocks: int


@dataclass(slots=True)
class NamespaceUsage:
    """One namespace's blocks and their bytes in one tier."""

    blocks: int = 0
    bytes: int = 0

    def add(self, nbytes: int) -> None:
        self.blocks += 1
        self.bytes += nbytes
