"""``namespaces``: how many blocks and bytes each namespace holds, per tier, over the nodes.

Each node walks its own indexes (an admin call); nodes are asked in parallel and summed.
An unreachable node is reported and the exit code is 3, as for ``status``.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import grpc

from kvpool_client.admin import format as fmt
from kvpool_client.admin.exits import ExitCode
from kvpool_client.admin.nodes import NodeReport, report_failures
from kvpool_client.core.auth import Credentials, open_channel
from kvpool_client.core.control import blocking_stub, translate_rpc_error
from kvpool_client.core.proto import kvpool_pb2 as pb

Usage = dict[tuple[str, str], list[int]]  # (namespace, tier) -> [blocks, bytes, nodes]


def list_node(address: str, timeout: float, credentials: Credentials) -> list[pb.NamespaceUsage] | NodeReport:
    """One node's namespaces, or a report of the error that kept us from them."""
    channel = open_channel(address, credentials)
    try:
        stub = blocking_stub(channel)
        return list(stub.ListNamespaces(pb.ListNamespacesRequest(), timeout=timeout).namespaces)
    except grpc.RpcError as exc:
        return NodeReport(address, error=translate_rpc_error(address, exc))
    finally:
        channel.close()


def show_namespaces(args: argparse.Namespace, addresses: tuple[str, ...]) -> ExitCode:
    """Print each namespace's blocks and bytes per tier, summed over ``addresses``."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(addresses)))) as pool:
        answers = list(pool.map(lambda a: list_node(a, args.timeout, args.credentials), addresses))
    usage: Usage = defaultdict(lambda: [0, 0, 0])
    for answer in answers:
        for row in answer if isinstance(answer, list) else ():
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
