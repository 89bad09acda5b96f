"""``namespaces``: how many blocks and bytes each namespace holds, per tier, over the nodes.

Each node walks its own indexes (an admin call); nodes are asked in parallel and summed.
An unreachable node is reported and the exit code is 3, as for ``status``.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from kvpool_client.admin import format as fmt
from kvpool_client.admin.exits import ExitCode
from kvpool_client.admin.nodes import NodeReport, ask_all, report_failures
from kvpool_client.core.proto import kvpool_pb2 as pb

Usage = dict[tuple[str, str], list[int]]  # (namespace, tier) -> [blocks, bytes, nodes]


def show_namespaces(args: argparse.Namespace, addresses: tuple[str, ...]) -> ExitCode:
    """Print each namespace's blocks and bytes per tier, summed over ``addresses``."""
    request = pb.ListNamespacesRequest()
    answers = ask_all(addresses, args.credentials, lambda stub: stub.ListNamespaces(request, timeout=args.timeout))
    usage: Usage = defaultdict(lambda: [0, 0, 0])
    for answer in answers:
        for row in answer.namespaces if isinstance(answer, pb.NamespaceList) else ():
            total = usage[(row.namespace, row.tier)]
            total[0] += row.blocks
            total[1] += row.bytes
            total[2] += 1
    rows = sorted(usage.items())
    if args.json:
        fmt.print_json(
            {
                "namespaces": [
                    {"namespace": ns, "tier": tier, "blocks": b, "bytes": n, "nodes": k}
                    for (ns, tier), (b, n, k) in rows
                ]
            }
        )
    else:
        table = [(ns, tier, b, fmt.size(n), k) for (ns, tier), (b, n, k) in rows]
        print(fmt.table(("NAMESPACE", "TIER", "BLOCKS", "BYTES", "NODES"), table, right=(2, 3, 4)))
    return report_failures([a for a in answers if isinstance(a, NodeReport)], args.auth_token_file)
