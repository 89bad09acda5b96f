"""``tenants``: each tenant's rights, quotas and use, over the nodes (an admin call).

Each node answers from its credentials file and its indexes: the bytes of the namespaces a
tenant may write, per tier, and its data connections where it has a cap. Bytes and
connections are summed over the nodes; quotas hold per node. An unreachable node is reported
and the exit code is 3, as for ``status``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from kvpool_client.admin import format as fmt
from kvpool_client.admin.exits import ExitCode
from kvpool_client.admin.nodes import NodeReport, ask_all, report_failures
from kvpool_client.core.proto import kvpool_pb2 as pb


@dataclass
class TenantTotal:
    """One tenant over the nodes that answered."""

    first: pb.TenantUsage  # its rights and quotas, as the first node said
    dram_bytes: int = 0
    ssd_bytes: int = 0
    connections: int = 0
    nodes: list[str] = field(default_factory=list)


def show_tenants(args: argparse.Namespace, addresses: tuple[str, ...]) -> ExitCode:
    """Print each tenant's rights, quotas and use, summed over ``addresses``."""
    request = pb.ListTenantsRequest()
    answers = ask_all(addresses, args.credentials, lambda stub: stub.ListTenants(request, timeout=args.timeout))
    totals: dict[str, TenantTotal] = {}
    for address, answer in zip(addresses, answers, strict=True):
        for row in answer.tenants if isinstance(answer, pb.TenantList) else ():
            total = totals.setdefault(row.tenant, TenantTotal(row))
            total.dram_bytes += row.dram_bytes
            total.ssd_bytes += row.ssd_bytes
            total.connections += row.connections
            total.nodes.append(address)
    rows = [totals[name] for name in sorted(totals)]
    if args.json:
        fmt.print_json({"tenants": [_json(t) for t in rows]})
    else:
        table = [
            (
                t.first.tenant,
                ",".join(t.first.namespaces),
                ",".join(t.first.rights),
                _used(t.dram_bytes, t.first.dram_quota),
                _used(t.ssd_bytes, t.first.ssd_quota),
                f"{t.connections}" + (f" (cap {t.first.connection_cap}/node)" if t.first.connection_cap else ""),
                len(t.nodes),
            )
            for t in rows
        ]
        headers = ("TENANT", "NAMESPACES", "RIGHTS", "DRAM", "SSD", "CONNECTIONS", "NODES")
        print(fmt.table(headers, table, right=(6,)))
    return report_failures([a for a in answers if isinstance(a, NodeReport)], args.auth_token_file)


def _used(nbytes: int, quota: int) -> str:
    return fmt.size(nbytes) + (f" (quota {fmt.size(quota)}/node)" if quota else "")


def _json(total: TenantTotal) -> dict[str, object]:
    first = total.first
    return {
        "tenant": first.tenant,
        "namespaces": list(first.namespaces),
        "rights": list(first.rights),
        "dram_bytes": total.dram_bytes,
        "ssd_bytes": total.ssd_bytes,
        "connections": total.connections,
        "quotas_per_node": {"dram": first.dram_quota, "ssd": first.ssd_quota, "connections": first.connection_cap},
        "nodes": total.nodes,
    }
