"""``status``, ``stats`` and ``config`` against the cluster as etcd records it.

With ``--etcd`` the node list is the cluster's records in etcd (what clients place
keys over), each joined with what the node itself says on the control plane. A
node that has a record but does not answer is a row of its own, and the exit code
is 3. Without ``--etcd``, ``status`` and ``stats`` ask the static ``--nodes`` list.
"""

from __future__ import annotations

import argparse
import dataclasses

from kvpool_client.admin import format as fmt
from kvpool_client.admin import nodes
from kvpool_client.admin.exits import CliError, ExitCode
from kvpool_client.admin.namespaces import show_namespaces
from kvpool_client.admin.nodes import NodeReport
from kvpool_client.admin.session import ClusterSession, open_session
from kvpool_client.admin.tenants import show_tenants
from kvpool_client.core.membership.cluster import NodeListing
from kvpool_client.core.membership.records import ClusterConfig, NodeRecord


def record_json(record: NodeRecord) -> dict[str, object]:
    """A node record as plain JSON values (what etcd holds, less the schema number)."""
    return {
        "node_id": record.node_id,
        "state": str(record.state),
        "address": record.address,
        "data_endpoints": dict(record.data_endpoints),
        "weight": record.weight,
        "capacity_bytes": record.capacity_bytes,
        "version": record.version,
        "registered_at": record.registered_at,
    }


def config_json(config: ClusterConfig) -> dict[str, int]:
    return {
        "block_size": config.block_size,
        "replicas": config.replicas,
        "write_quorum": config.write_quorum,
        "placement_version": config.placement_version,
    }


def config_line(config: ClusterConfig | None) -> str:
    """``block_size=16 replicas=2 write_quorum=1 placement_version=1``."""
    if config is None:
        return "no config stored yet (a daemon writes the defaults when it starts)"
    return " ".join(f"{name}={value}" for name, value in config_json(config).items())


def run_status(args: argparse.Namespace) -> ExitCode:
    """With ``--etcd``: every node in etcd, its record and its live stats, under the config line."""
    if not args.etcd:
        return nodes.run_status(args)
    with open_session(args, "status") as session:
        listing = session.nodes()
        config, config_problem = _config_or_problem(session)
    records = [listing.nodes[n] for n in sorted(listing.nodes)]
    reports = nodes.probe_all(tuple(r.address for r in records), args.timeout, args.credentials) if records else []
    if args.json:
        fmt.print_json(
            {
                "cluster": args.cluster,
                "etcd": args.etcd,
                "revision": listing.revision,
                "config": None if config is None else config_json(config),
                "config_error": config_problem,
                "nodes": [_node_json(r, p) for r, p in zip(records, reports, strict=True)],
                "malformed": listing.malformed,
            }
        )
    else:
        _print_status(args.cluster, listing, config_problem or config_line(config), records, reports)
    return nodes.report_failures(reports, args.auth_token_file)


def _config_or_problem(session: ClusterSession) -> tuple[ClusterConfig | None, str | None]:
    """The config, or why it cannot be read: status still shows the nodes."""
    try:
        return session.config(), None
    except CliError as exc:
        if exc.code is not ExitCode.ERROR:
            raise
        return None, exc.message


def _print_status(
    cluster: str, listing: NodeListing, config_text: str, records: list[NodeRecord], reports: list[NodeReport]
) -> None:
    print(f"cluster {cluster}: {config_text}")
    print()
    if not records:
        print(f"no nodes registered in cluster {cluster!r}: start kvpool-server with --etcd-endpoints")
    else:
        headers = (
            "NODE",
            "STATE",
            "ADDRESS",
            "DATA",
            "WEIGHT",
            "CAPACITY",
            "DRAM USED",
            "BLOCKS",
            "HIT RATE",
            "UPTIME",
            "METRICS",
        )
        rows = [_status_row(r, p) for r, p in zip(records, reports, strict=True)]
        print(fmt.table(headers, rows, right=(4, 5, 6, 7, 8, 9)))
    for key, problem in sorted(listing.malformed.items()):
        print(f"skipped {key}: {problem}")


def _status_row(record: NodeRecord, report: NodeReport) -> tuple[object, ...]:
    endpoints = fmt.endpoints(record.data_endpoints)
    fixed = (
        record.node_id,
        _state_cell(record, report),
        record.address,
        endpoints,
        f"{record.weight:g}",
        fmt.size(record.capacity_bytes),
    )
    if report.stats is None:
        return (*fixed, "-", "-", "-", "-", "-")
    dram = report.dram()
    return (
        *fixed,
        fmt.size(dram.used_bytes),
        dram.blocks,
        fmt.percent(dram.hits, dram.hits + dram.misses),
        fmt.duration(report.stats.uptime_s),
        nodes.metrics_cell(report),
    )


def _state_cell(record: NodeRecord, report: NodeReport) -> str:
    """The state in etcd, and what is wrong with it if the node says otherwise."""
    if report.error is not None:
        return f"{record.state}, unreachable"
    live = report.info.state if report.info is not None else ""
    # The record lags the node by one etcd write; show both while they differ.
    return str(record.state) if not live or live == record.state else f"{record.state} (node: {live})"


def _node_json(record: NodeRecord, report: NodeReport) -> dict[str, object]:
    fields = record_json(record)
    if report.info is None or report.stats is None:
        return {**fields, "reachable": False, "error": str(report.error)}
    return {**fields, "reachable": True, "live_state": report.info.state, **nodes.usage_json(report)}


def run_namespaces(args: argparse.Namespace) -> ExitCode:
    """``namespaces``; with ``--etcd`` the nodes come from etcd."""
    return show_namespaces(args, _addresses(args, "namespaces"))


def run_tenants(args: argparse.Namespace) -> ExitCode:
    """``tenants``; with ``--etcd`` the nodes come from etcd."""
    return show_tenants(args, _addresses(args, "tenants"))


def _addresses(args: argparse.Namespace, command: str) -> tuple[str, ...]:
    """The nodes to ask: ``--nodes``, or with ``--etcd`` every node registered there.

    Raises:
        CliError: no node is registered.
    """
    if not args.etcd:
        return tuple(args.nodes)
    with open_session(args, command) as session:
        listing = session.nodes()
    addresses = tuple(listing.nodes[n].address for n in sorted(listing.nodes))
    if not addresses:
        raise CliError(ExitCode.NOT_FOUND, f"no nodes registered in cluster {args.cluster!r}")
    return addresses


def run_stats(args: argparse.Namespace) -> ExitCode:
    """``stats [NODE]``; with ``--etcd`` the nodes (and NODE's id) come from etcd."""
    if not args.etcd:
        return nodes.run_stats(args)
    with open_session(args, "stats") as session:
        if args.node is not None:
            addresses: tuple[str, ...] = (session.resolve(args.node).address,)
        else:
            listing = session.nodes()
            addresses = tuple(listing.nodes[n].address for n in sorted(listing.nodes))
    if not addresses:
        raise CliError(ExitCode.NOT_FOUND, f"no nodes registered in cluster {args.cluster!r}")
    return nodes.show_stats(args, addresses)


def run_config_get(args: argparse.Namespace) -> ExitCode:
    """Print the cluster config; exit 4 if none was written yet."""
    with open_session(args, "config get") as session:
        config = session.config()
    if config is None:
        raise CliError(
            ExitCode.NOT_FOUND,
            f"cluster {args.cluster!r} has no config yet: start a daemon or run `kvpoolctl config set KEY=VALUE`",
        )
    if args.json:
        fmt.print_json({"cluster": args.cluster, "config": config_json(config)})
    else:
        print(fmt.key_values(config_json(config).items()))
    return ExitCode.OK


def run_config_set(args: argparse.Namespace) -> ExitCode:
    """Change settings with compare-and-swap; exit 2 if the result is not a valid config."""
    changes = dict(args.settings)
    seen: list[ClusterConfig | None] = []

    def change(current: ClusterConfig | None) -> ClusterConfig:
        seen.append(current)  # the last one is what the successful swap replaced
        try:
            return dataclasses.replace(current or ClusterConfig(), **changes)
        except ValueError as exc:
            wanted = " ".join(f"{k}={v}" for k, v in changes.items())
            raise CliError(
                ExitCode.USAGE,
                f"cannot set {wanted}: {exc} (change several at once: config set replicas=3 write_quorum=2)",
            ) from None

    with open_session(args, "config set") as session:
        new = session.update_config(change)
    previous = seen[-1]
    # With no config stored, daemons and clients use the defaults: compare with those.
    before = config_json(previous or ClusterConfig())
    after = config_json(new)
    changed = {k: [before[k], v] for k, v in after.items() if before[k] != v}
    if args.json:
        fmt.print_json({"cluster": args.cluster, "config": after, "previous": previous and before, "changed": changed})
        return ExitCode.OK
    summary = ", ".join(f"{k} {old} -> {v}" for k, (old, v) in changed.items()) or "unchanged"
    print(f"cluster {args.cluster}: {'config created: ' if previous is None else ''}{summary}")
    print(fmt.key_values(after.items()))
    return ExitCode.OK
