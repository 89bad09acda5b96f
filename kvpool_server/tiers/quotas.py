"""Quotas a tier's blocks count against: a namespace's own, and a group's over several namespaces (a tenant's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QuotaGroup:
    """Blocks that share a quota: one namespace's, or those of every namespace a tenant writes."""

    name: str
    limit: int  # most bytes the group's blocks may hold in the tier
    covers: Callable[[str], bool]  # whether a namespace's blocks are the group's

    def held(self, namespace_bytes: Mapping[str, int]) -> int:
        """What the group's blocks hold, from the tier's bytes per namespace."""
        return sum(n for namespace, n in namespace_bytes.items() if self.covers(namespace))


GroupQuotas = Callable[[str], Sequence[QuotaGroup]]
"""The groups' quotas a block of a namespace counts against, besides its namespace's."""


def quota_groups(namespace: str, namespace_quota: int, groups: GroupQuotas | None) -> list[QuotaGroup]:
    """Every quota a block of ``namespace`` counts against in a tier: its namespace's (0: none), then its groups'."""
    found = [QuotaGroup(namespace, namespace_quota, namespace.__eq__)] if namespace_quota else []
    if groups is not None:
        found += groups(namespace)
    return found
