"""``top``: a live per-node view of the pool, refreshed every ``--interval`` seconds.

Each refresh asks every node for its ServerInfo and Stats (the calls ``status``
makes) in parallel, and compares them with the refresh before: requests per
second, block bytes in and out per second, and the hit rate of the lookups made
in that interval. Before a node's second sample its hit rate is the one since it
started, and its rates are blank. With ``--etcd`` the node list is re-read from
etcd at every refresh, so nodes that join or leave show up.

On a terminal the screen is redrawn in place; otherwise (a pipe, a file) each
refresh is printed after a blank line, and ``--json`` prints one object a line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime

from kvpool_client.admin import format as fmt
from kvpool_client.admin import nodes
from kvpool_client.admin.exits import ExitCode
from kvpool_client.admin.inputs import positive_float_arg, positive_int_arg
from kvpool_client.admin.nodes import NodeReport
from kvpool_client.admin.session import ClusterSession, open_session

DEFAULT_INTERVAL_S = 2.0
_CLEAR = "\033[H\033[2J"
_HEADERS = ("NODE", "ADDRESS", "STATE", "DRAM USED", "USE", "BLOCKS", "HIT RATE", "REQ/S", "IN/S", "OUT/S", "UPTIME")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``top``'s own options."""
    parser.add_argument(
        "--interval",
        type=positive_float_arg,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between refreshes (default: {DEFAULT_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--count", type=positive_int_arg, metavar="N", help="stop after N refreshes (default: until Ctrl-C)"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """One node's report and when it was taken (``time.monotonic``)."""

    at: float
    report: NodeReport


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRow:
    """What ``top`` shows for one node: its use now, and its rates since the previous sample.

    Rates are None before a node's second sample (or after it restarted); ``hit_rate``
    is None when no lookup was made.
    """

    address: str
    node_id: str | None
    state: str
    used_bytes: int = 0
    capacity_bytes: int = 0
    blocks: int = 0
    hit_rate: float | None = None
    requests_per_s: float | None = None
    bytes_in_per_s: float | None = None
    bytes_out_per_s: float | None = None
    uptime_s: float | None = None
    error: str | None = None

    def cells(self) -> tuple[object, ...]:
        if self.error is not None:
            return (self.node_id or "-", self.address, "unreachable", *("-",) * 8)
        return (
            self.node_id or "-",
            self.address,
            self.state or "-",
            f"{fmt.size(self.used_bytes)} / {fmt.size(self.capacity_bytes)}",
            _ratio(self.used_bytes, self.capacity_bytes),
            self.blocks,
            "-" if self.hit_rate is None else f"{100 * self.hit_rate:.1f}%",
            _rate(self.requests_per_s, lambda r: f"{r:.1f}"),
            _rate(self.bytes_in_per_s, _bytes_rate),
            _rate(self.bytes_out_per_s, _bytes_rate),
            fmt.duration(self.uptime_s or 0),
        )

    def as_json(self) -> dict[str, object]:
        if self.error is not None:
            return {"address": self.address, "node_id": self.node_id, "reachable": False, "error": self.error}
        return {
            "address": self.address,
            "node_id": self.node_id,
            "reachable": True,
            "state": self.state,
            "dram_used_bytes": self.used_bytes,
            "dram_capacity_bytes": self.capacity_bytes,
            "blocks": self.blocks,
            "hit_rate": self.hit_rate,
            "requests_per_s": self.requests_per_s,
            "bytes_in_per_s": self.bytes_in_per_s,
            "bytes_out_per_s": self.bytes_out_per_s,
            "uptime_s": self.uptime_s,
        }


def _ratio(part: int, whole: int) -> str:
    return "-" if whole == 0 else f"{100 * part / whole:.0f}%"


def _rate(value: float | None, show: Callable[[float], str]) -> str:
    return "-" if value is None else show(value)


def _bytes_rate(value: float) -> str:
    return fmt.size(int(value))


def _bytes_out(report: NodeReport) -> int:
    """Block bytes served: over TCP, and located for same-node readers to copy (shm)."""
    return sum(_counter(report, name) for name in ("bytes_out", "bytes_out_shm", "bytes_out_nixl"))


def _requests(report: NodeReport) -> int:
    assert report.stats is not None
    return sum(int(v) for k, v in report.stats.counters.items() if k.startswith("requests_"))


def _counter(report: NodeReport, name: str) -> int:
    assert report.stats is not None
    return int(report.stats.counters.get(name, 0))


def node_row(current: Sample, previous: Sample | None) -> NodeRow:
    """The row for ``current``, with rates over the time since ``previous`` (same node, or None).

    A previous sample from before a restart (uptime went down), or an unreachable one,
    gives no rates: counters start again at zero after a restart.
    """
    report = current.report
    if report.info is None or report.stats is None:
        return NodeRow(report.address, None, "", error=str(report.error))
    dram = report.dram()
    now = NodeRow(
        report.address,
        report.info.node_id,
        report.info.state,
        dram.used_bytes,
        dram.capacity_bytes,
        dram.blocks,
        uptime_s=report.stats.uptime_s,
    )
    before = previous.report if previous is not None else None
    elapsed = current.at - previous.at if previous is not None else 0.0
    if before is None or before.stats is None or elapsed <= 0 or before.stats.uptime_s > report.stats.uptime_s:
        lookups = dram.hits + dram.misses
        return dataclasses.replace(now, hit_rate=dram.hits / lookups if lookups else None)
    old = before.dram()
    hits, misses = dram.hits - old.hits, dram.misses - old.misses
    return dataclasses.replace(
        now,
        hit_rate=hits / (hits + misses) if hits + misses else None,
        requests_per_s=(_requests(report) - _requests(before)) / elapsed,
        bytes_in_per_s=(_counter(report, "bytes_in") - _counter(before, "bytes_in")) / elapsed,
        bytes_out_per_s=(_bytes_out(report) - _bytes_out(before)) / elapsed,
    )


def render(rows: list[NodeRow], title: str) -> str:
    """The screen: a title line, the node table, and a total line."""
    reachable = [r for r in rows if r.error is None]
    used = sum(r.used_bytes for r in reachable)
    capacity = sum(r.capacity_bytes for r in reachable)
    rates = [r.requests_per_s for r in reachable if r.requests_per_s is not None]
    total = f"{len(reachable)}/{len(rows)} nodes reachable, {fmt.size(used)} / {fmt.size(capacity)} used" + (
        f", {sum(rates):.1f} req/s" if rates else ""
    )
    if not rows:
        return f"{title}\n\nno nodes: start kvpool-server, or check --nodes / --etcd"
    table = fmt.table(_HEADERS, [r.cells() for r in rows], right=(3, 4, 5, 6, 7, 8, 9, 10))
    return f"{title}\n{total}\n\n{table}"


class _Source:
    """Where the node addresses come from: etcd (re-read each refresh) or ``--nodes``."""

    def __init__(self, args: argparse.Namespace, session: ClusterSession | None) -> None:
        self._args = args
        self._session = session

    @property
    def label(self) -> str:
        if self._session is not None:
            return f"cluster {self._args.cluster} (etcd {self._args.etcd})"
        return f"{len(self._args.nodes)} node(s) from --nodes"

    def addresses(self) -> tuple[str, ...]:
        if self._session is None:
            return tuple(self._args.nodes)
        listing = self._session.nodes()
        return tuple(listing.nodes[n].address for n in sorted(listing.nodes))


def run_top(args: argparse.Namespace) -> ExitCode:
    """Refresh until Ctrl-C or ``--count``; exit 3 if a node was unreachable at the last refresh."""
    with _session(args) as session:
        return _loop(args, _Source(args, session))


@contextlib.contextmanager
def _session(args: argparse.Namespace) -> Iterator[ClusterSession | None]:
    if not args.etcd:
        yield None
        return
    with open_session(args, "top") as session:
        yield session


def _loop(args: argparse.Namespace, source: _Source) -> ExitCode:
    tty = not args.json and sys.stdout.isatty()
    previous: dict[str, Sample] = {}
    reports: list[NodeReport] = []
    refreshes = 0
    try:
        while True:
            started = time.monotonic()
            addresses = source.addresses()
            reports = nodes.probe_all(addresses, args.timeout, args.credentials) if addresses else []
            now = time.monotonic()
            samples = {r.address: Sample(now, r) for r in reports}
            rows = [node_row(s, previous.get(a)) for a, s in samples.items()]
            previous = {a: s for a, s in samples.items() if s.report.stats is not None}
            refreshes += 1
            _show(args, source, rows, tty, refreshes)
            if args.count is not None and refreshes >= args.count:
                break
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    return nodes.report_failures(reports, args.auth_token_file)


def _show(args: argparse.Namespace, source: _Source, rows: list[NodeRow], tty: bool, refresh: int) -> None:
    stamp = datetime.now()
    if args.json:
        record = {"time": stamp.timestamp(), "refresh": refresh, "nodes": [r.as_json() for r in rows]}
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()
        return
    title = f"kvpoolctl top: {source.label}, every {args.interval:g} s, {stamp:%H:%M:%S}"
    screen = render(rows, title)
    if tty:
        sys.stdout.write(_CLEAR + screen + "\n(Ctrl-C to quit)\n")
    else:
        sys.stdout.write(("\n" if refresh > 1 else "") + screen + "\n")
    sys.stdout.flush()
