"""``status`` and ``stats``: what each node says about itself on the control plane.

Nodes are asked in parallel, so one unreachable node costs one timeout, not one
per node. An unreachable node is a row of its own, and the exit code is 3.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from kvpool_client.admin import format as fmt
from kvpool_client.admin.exits import CliError, ExitCode, unreachable
from kvpool_client.core.auth import Credentials, open_channel
from kvpool_client.core.control import blocking_stub, translate_rpc_error
from kvpool_client.core.errors import KVPoolError
from kvpool_client.core.proto import kvpool_pb2 as pb

_MAX_PARALLEL = 16
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node's ServerInfo and Stats, or the error that kept us from them."""

    address: str
    info: pb.ServerInfo | None = None
    stats: pb.Stats | None = None
    error: KVPoolError | None = None

    def dram(self) -> pb.TierStats:
        """The DRAM tier's stats (empty if the node reports none)."""
        tiers = self.stats.tiers if self.stats is not None else ()
        return next((t for t in tiers if t.name == "dram"), pb.TierStats(name="dram"))


def ask(address: str, credentials: Credentials, call: Callable[[Any], T]) -> T | NodeReport:
    """What ``call`` (given the node's stub) returns, or a report of the error that kept us from it;
    never raises for a node failure."""
    channel = open_channel(address, credentials)
    try:
        return call(blocking_stub(channel))
    except grpc.RpcError as exc:
        return NodeReport(address, error=translate_rpc_error(address, exc))
    finally:
        channel.close()


def ask_all(addresses: tuple[str, ...], credentials: Credentials, call: Callable[[Any], T]) -> list[T | NodeReport]:
    """:func:`ask` each address in parallel; answers in the order given."""
    return _each(addresses, lambda address: ask(address, credentials, call))


def probe(address: str, timeout: float, credentials: Credentials) -> NodeReport:
    """Ask one node for its ServerInfo and Stats; never raises for a node failure."""

    # ControlClient.server_info keeps only what the data plane needs; status wants all of ServerInfo.
    def both(stub: Any) -> tuple[pb.ServerInfo, pb.Stats]:
        info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout)
        return info, stub.GetStats(pb.GetStatsRequest(), timeout=timeout)

    answer = ask(address, credentials, both)
    return answer if isinstance(answer, NodeReport) else NodeReport(address, *answer)


def probe_all(addresses: tuple[str, ...], timeout: float, credentials: Credentials) -> list[NodeReport]:
    """:func:`probe` each address in parallel; reports in the order given."""
    return _each(addresses, lambda address: probe(address, timeout, credentials))


def _each(addresses: tuple[str, ...], work: Callable[[str], T]) -> list[T]:
    """``work`` of each address, in parallel threads; results in the order given."""
    with ThreadPoolExecutor(max_workers=max(1, min(_MAX_PARALLEL, len(addresses)))) as pool:
        return list(pool.map(work, addresses))


def run_status(args: argparse.Namespace) -> ExitCode:
    """One row per node: identity, endpoints, DRAM use, blocks, hit rate, uptime."""
    reports = probe_all(args.nodes, args.timeout, args.credentials)
    if args.json:
        fmt.print_json({"nodes": [_status_json(r) for r in reports]})
    else:
        headers = ("NODE", "ADDRESS", "STATE", "DATA", "DRAM USED", "BLOCKS", "HIT RATE", "UPTIME", "METRICS")
        print(fmt.table(headers, [_status_row(r) for r in reports], right=(5, 6, 7)))
    return report_failures(reports, args.auth_token_file)


def run_stats(args: argparse.Namespace) -> ExitCode:
    """Every counter and tier of each node, or of the one node ``args.node`` names."""
    addresses = args.nodes
    if args.node is not None:
        addresses = (resolve(args.node, args.nodes, args.timeout, args.credentials),)
    return show_stats(args, addresses)


def show_stats(args: argparse.Namespace, addresses: tuple[str, ...]) -> ExitCode:
    """Print every counter and tier of each of ``addresses``; exit 3 if one is unreachable."""
    reports = probe_all(addresses, args.timeout, args.credentials)
    if args.json:
        fmt.print_json({"nodes": [_stats_json(r) for r in reports]})
    else:
        print("\n\n".join(_stats_text(r) for r in reports))
    return report_failures(reports, args.auth_token_file)


def resolve(node: str, addresses: tuple[str, ...], timeout: float, credentials: Credentials) -> str:
    """The control address of ``node``: an address as is, else the node whose id it is.

    Raises:
        CliError: NOT_FOUND if no reachable node in ``addresses`` has that id.
    """
    if ":" in node:
        return node
    reports = probe_all(addresses, timeout, credentials)
    for report in reports:
        if report.info is not None and report.info.node_id == node:
            return report.address
    down = [r.address for r in reports if r.error is not None]
    also = f" ({len(down)} unreachable: {', '.join(down)})" if down else ""
    raise CliError(ExitCode.NOT_FOUND, f"no node with id {node!r} among --nodes{also}: run `kvpoolctl status`")


def report_failures(reports: list[NodeReport], token_file: str | None) -> ExitCode:
    """Print one line per node that failed (a rejected token named as such); the exit code to return."""
    errors = [unreachable(r.address, r.error) for r in reports if r.error is not None]
    if token_file:
        errors = [e.with_token_sent(token_file) for e in errors]
    for error in errors:
        print(f"kvpoolctl: error: {error.message}", file=sys.stderr)
    return max((e.code for e in errors), default=ExitCode.OK)  # unreachable (3) outranks a missing token (2)


def _status_row(report: NodeReport) -> tuple[object, ...]:
    if report.info is None or report.stats is None:
        return ("-", report.address, "unreachable", "-", "-", "-", "-", "-", "-")
    dram = report.dram()
    endpoints = fmt.endpoints({e.transport: e.address for e in report.info.endpoints})
    used = f"{fmt.size(dram.used_bytes)} / {fmt.size(dram.capacity_bytes)}"
    hit_rate = fmt.percent(dram.hits, dram.hits + dram.misses)
    return (
        report.info.node_id,
        report.address,
        report.info.state or "-",
        endpoints,
        used,
        dram.blocks,
        hit_rate,
        fmt.duration(report.stats.uptime_s),
        metrics_cell(report),
    )


def _status_json(report: NodeReport) -> dict[str, object]:
    if report.info is None or report.stats is None:
        return {"address": report.address, "reachable": False, "error": str(report.error)}
    info = report.info
    return {
        "address": report.address,
        "reachable": True,
        "node_id": info.node_id,
        "version": info.version,
        "state": info.state,
        "data_endpoints": {e.transport: e.address for e in info.endpoints},
        **usage_json(report),
    }


def metrics_cell(report: NodeReport) -> str:
    """Where the node's /metrics answers; ``-`` when it serves none (``metrics_port: -1``)."""
    return report.info.metrics_url if report.info is not None and report.info.metrics_url else "-"


def usage_json(report: NodeReport) -> dict[str, object]:
    """DRAM use, hits, uptime and /metrics URL of a node that answered (JSON fields shared by status views)."""
    assert report.stats is not None
    dram = report.dram()
    lookups = dram.hits + dram.misses
    return {
        "dram_used_bytes": dram.used_bytes,
        "dram_capacity_bytes": dram.capacity_bytes,
        "blocks": dram.blocks,
        "hits": dram.hits,
        "misses": dram.misses,
        "hit_rate": dram.hits / lookups if lookups else None,
        "uptime_s": report.stats.uptime_s,
        "metrics_url": report.info.metrics_url if report.info is not None else "",
    }


def _stats_text(report: NodeReport) -> str:
    if report.stats is None:
        return f"node {report.address}: unreachable"
    stats = report.stats
    title = f"node {stats.node_id} at {report.address}, up {fmt.duration(stats.uptime_s)}"
    tier_headers = ("TIER", "CAPACITY", "USED", "BLOCKS", "HITS", "MISSES", "HIT RATE", "EVICTIONS")
    tier_rows = [
        (
            t.name,
            fmt.size(t.capacity_bytes),
            fmt.size(t.used_bytes),
            t.blocks,
            t.hits,
            t.misses,
            fmt.percent(t.hits, t.hits + t.misses),
            t.evictions,
        )
        for t in stats.tiers
    ]
    # The node reports every counter it declares; the table shows those that moved (--json: all).
    moved: list[tuple[str, int | str]] = [(name, value) for name, value in sorted(stats.counters.items()) if value]
    counters = moved or [("(none yet)", "")]
    return "\n\n".join(
        (
            title,
            fmt.table(tier_headers, tier_rows, right=range(1, 8)),
            fmt.table(("COUNTER", "VALUE"), counters, right=(1,)),
        )
    )


def _stats_json(report: NodeReport) -> dict[str, object]:
    if report.stats is None:
        return {"address": report.address, "reachable": False, "error": str(report.error)}
    stats = report.stats
    tiers = [
        {
            "name": t.name,
            "capacity_bytes": t.capacity_bytes,
            "used_bytes": t.used_bytes,
            "blocks": t.blocks,
            "hits": t.hits,
            "misses": t.misses,
            "evictions": t.evictions,
        }
        for t in stats.tiers
    ]
    return {
        "address": report.address,
        "reachable": True,
        "node_id": stats.node_id,
        "uptime_s": stats.uptime_s,
        "tiers": tiers,
        "counters": dict(sorted(stats.counters.items())),
    }
