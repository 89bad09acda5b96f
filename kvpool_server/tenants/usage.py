"""What each tenant holds on a node: what ``kvpoolctl tenants`` and the metrics show."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvpool_server.tenants.credentials import Credentials, Right, Tenant


@dataclass(frozen=True, slots=True)
class TenantUse:
    """One tenant's use of a node: per tier, the bytes of every namespace it may write (what its
    quota bounds; DRAM: their slots), and its data connections where it has a cap."""

    tenant: Tenant
    tier_bytes: dict[str, int]
    connections: int


def tenant_use(
    credentials: Credentials, namespace_bytes: Mapping[str, Mapping[str, int]], connections: Mapping[str, int]
) -> list[TenantUse]:
    """Every tenant's use, by name, from each tier's bytes per namespace and the capped tenants' connections."""
    return [
        TenantUse(
            tenant,
            {
                tier: sum(n for namespace, n in usage.items() if tenant.may(Right.WRITE, namespace))
                for tier, usage in namespace_bytes.items()
            },
            connections.get(tenant.name, 0),
        )
        for tenant in credentials.tenants
    ]
