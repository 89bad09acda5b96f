"""How full a tier is: the figures every tier reports the same way."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TierUsage:
    capacity_bytes: int
    used_bytes: int  # DRAM: bytes of allocated slots; SSD: bytes of segment files
    blocks: int
