"""What one daemon process moves per core: GB/s per daemon CPU-second, for gets and puts.

Usage: ``.venv/bin/python bench/capacity.py [--rounds 3] [--duration 0.4] [--out bench/results]``

One kvpool daemon, 1 and 4 client processes (``bench/harness/clients.py``, the cells of
``bench/blocks.py``: cache-cold blocks from a 64 MiB region per client into a 64 MiB
destination ring, both twice the L3; every block read is verified, untimed). Gets over
``tcp`` and ``shm`` (copied out of the arena by a client on the daemon's node), puts over
``tcp`` only: an ``shm`` client puts through the same socket. Blocks of 64 KiB, 384 KiB
and 2 MiB, one per request or 32. Destinations lie 64 bytes past a page: 64-byte aligned
as torch's allocations are, not page-aligned.

Every shape is measured once per round, every other round in reverse order; a shape's
figures are medians over the rounds. The daemon's CPU per op is its threads' scheduler
time (``/proc/<pid>/task/*/schedstat``, nanoseconds) inside the timed bursts, as the
block benchmark takes it; ``/proc/<pid>/stat`` (utime, stime: 10 ms ticks) is read
around each whole cell as well, for the share of the daemon's time spent in user space
(Python, under the GIL) rather than in the kernel (socket copies). Prints the table, the
CPU ceiling of four clients over one on this machine's cores and the fraction of it
they reach, and writes ``capacity.json`` to ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import os
import statistics
import subprocess
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from bench import blocks
from bench.harness import report
from bench.harness.cells import Cell
from bench.harness.clients import Pools
from bench.harness.servers import REPO_ROOT, kvpool_daemon
from bench.harness.workload import CellSpec, KiB, MiB

SIZES = (64 * KiB, 384 * KiB, 2 * MiB)
BATCHES = (1, 32)
CLIENTS = (1, 4)
WAYS = (("kvpool", "get"), ("kvpool-shm", "get"), ("kvpool", "put"))  # (system, op); shm puts go over tcp
DEST_OFFSET = 64  # destinations' offset from a page: 64-byte aligned, as torch allocates
NICS_GBPS = {"100 Gbit": 12.5, "400 Gbit": 50.0}  # line rate in 1e9 bytes per second
_MIN_LEFT_CORES = 0.5  # the least a run is credited with when other processes load the machine
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Shape:
    """One measured shape: a way of reading or writing, a block size, a batch and clients."""

    system: str  # ``kvpool`` (tcp) or ``kvpool-shm``
    op: str
    block: int
    batch: int
    clients: int

    @property
    def transport(self) -> str:
        return "shm" if self.system == "kvpool-shm" else "tcp"

    @property
    def op_bytes(self) -> int:
        return self.block * self.batch

    @property
    def label(self) -> str:
        return f"{self.op} {self.transport} {report.size_label(self.block)} x{self.batch} c{self.clients}"


@dataclass(frozen=True, slots=True)
class DaemonTimes:
    """The daemon process's user and kernel CPU seconds (all threads) at one moment."""

    user_s: float
    system_s: float


@dataclass(frozen=True, slots=True)
class Measured:
    """One cell of one round, with the daemon's utime and stime over the whole cell."""

    shape: Shape
    round: int
    cell: Cell
    user_s: float
    system_s: float


@dataclass(frozen=True, slots=True)
class Row:
    """A shape's medians over its rounds.

    Attributes:
        daemon_cores: cores the daemon kept busy (ops/s x its CPU per op).
        user_share: the daemon's user time over its user + kernel time, whole cells.
        gil_cap_gbps: op bytes over the daemon's user CPU per op: what one process could
            move if its user time (Python, under the GIL) filled one core and its kernel
            copies ran beside it on other cores. An upper bound of one daemon process.
    """

    shape: Shape
    rounds: int
    gbps: float
    client_us: float
    daemon_us: float
    daemon_gbps_per_core: float | None
    client_gbps_per_core: float | None
    daemon_cores: float
    user_share: float | None
    gil_cap_gbps: float | None
    other_load: float | None  # cores other processes used meanwhile (median)


@dataclass(frozen=True, slots=True)
class Scaling:
    """Four clients over one, per round: the ratio, its CPU ceiling and the fraction reached.

    Attributes:
        ceiling: :func:`bench.harness.report.scaling_ceiling` of the one-client cell, on all cores.
        left_ceiling: the same on the cores other processes left (cores minus their mean
            load over both cells): on a shared machine, what four clients could reach.
    """

    one: Shape
    ratio: float
    ceiling: float
    fraction: float
    left_ceiling: float
    left_fraction: float
    per_round: tuple[float, ...]


def plan_shapes() -> list[Shape]:
    """Every shape of a round, grouped by way and clients."""
    return [
        Shape(system, op, block, batch, clients)
        for system, op in WAYS for clients in CLIENTS for block in SIZES for batch in BATCHES
    ]  # fmt: skip


def per_core_gbps(op_bytes: int, cpu_us: float | None) -> float | None:
    """GB/s one core would move if every op cost ``cpu_us`` of it; None when unmeasured or zero."""
    return op_bytes / cpu_us / 1e3 if cpu_us else None


def cores_needed(line_gbps: float, gbps_per_core: float | None) -> float | None:
    """Cores of work at ``gbps_per_core`` that move ``line_gbps``."""
    return line_gbps / gbps_per_core if gbps_per_core else None


def daemon_times(pid: int) -> DaemonTimes:
    """utime and stime of ``pid``, all its threads (fields 14 and 15 of ``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return DaemonTimes(int(fields[11]) / _TICK, int(fields[12]) / _TICK)


def summarize(measured: list[Measured]) -> Row | None:
    """Medians over the rounds of one shape's cells that ran; None when none did."""
    ok = [m for m in measured if m.cell.ok and m.cell.server_cpu_us is not None]
    if not ok:
        return None
    shape = ok[0].shape
    cells = [m.cell for m in ok]
    daemon_us = _median([c.server_cpu_us for c in cells])
    user_s, system_s = sum(m.user_s for m in ok), sum(m.system_s for m in ok)
    share = user_s / (user_s + system_s) if user_s + system_s > 0 else None
    return Row(
        shape,
        len(ok),
        gbps=_median([c.gbps for c in cells]),
        client_us=_median([c.client_cpu_us for c in cells]),
        daemon_us=daemon_us,
        daemon_gbps_per_core=_median_or_none([per_core_gbps(shape.op_bytes, c.server_cpu_us) for c in cells]),
        client_gbps_per_core=per_core_gbps(shape.op_bytes, _median([c.client_cpu_us for c in cells])),
        daemon_cores=_median([c.ops_per_s * c.server_cpu_us / 1e6 for c in cells]),
        user_share=share,
        gil_cap_gbps=per_core_gbps(shape.op_bytes, daemon_us * share) if share else None,
        other_load=_median_or_none([c.foreign_cores for c in cells]),
    )


def scaling(one: list[Measured], four: list[Measured], cpus: int) -> Scaling | None:
    """Four clients over one, round by round (both cells of a round seconds apart), and medians.

    The ceiling of a round is :func:`bench.harness.report.cpu_ceiling` of its one-client cell.
    """
    ratios, ceilings, lefts = [], [], []
    for a, b in zip(one, four, strict=True):
        busy = cores_busy(a.cell)
        if not (b.cell.ok and a.cell.gbps and b.cell.gbps and busy):
            continue
        load = ((a.cell.foreign_cores or 0.0) + (b.cell.foreign_cores or 0.0)) / 2
        ratios.append(b.cell.gbps / a.cell.gbps)
        ceilings.append(min(b.shape.clients, cpus / busy))
        lefts.append(min(b.shape.clients, max(cpus - load, _MIN_LEFT_CORES) / busy))
    if not ratios:
        return None
    fractions = [r / c for r, c in zip(ratios, ceilings, strict=True)]
    left_fractions = [r / c for r, c in zip(ratios, lefts, strict=True)]
    return Scaling(
        one[0].shape, _median(ratios), _median(ceilings), _median(fractions),
        _median(lefts), _median(left_fractions), tuple(ratios),
    )  # fmt: skip


def cores_busy(cell: Cell) -> float | None:
    """Cores a cell kept busy, its clients' and the daemon's: ops/s x CPU per op."""
    if not cell.ok or cell.ops_per_s is None or cell.client_cpu_us is None:
        return None
    return cell.ops_per_s * (cell.client_cpu_us + (cell.server_cpu_us or 0.0)) / 1e6


def by_shape(measured: list[Measured]) -> dict[Shape, list[Measured]]:
    """Cells grouped by shape, in round order."""
    groups: dict[Shape, list[Measured]] = {}
    for m in sorted(measured, key=lambda m: m.round):
        groups.setdefault(m.shape, []).append(m)
    return groups


def table_lines(rows: list[Row]) -> list[str]:
    lines = [
        "| op | transport | block x batch | clients | GB/s | daemon CPU us/op | client CPU us/op "
        "| daemon GB/s per core | client GB/s per core | daemon cores busy | daemon user share | GIL cap GB/s "
        "| other load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r.shape
        lines.append(
            f"| {s.op} | {s.transport} | {report.size_label(s.block)} x{s.batch} | {s.clients} | {r.gbps:.2f} "
            f"| {r.daemon_us:.1f} | {r.client_us:.1f} "
            f"| {_fmt(r.daemon_gbps_per_core)} | {_fmt(r.client_gbps_per_core)} "
            f"| {r.daemon_cores:.2f} | {_fmt(r.user_share)} | {_fmt(r.gil_cap_gbps)} | {_fmt(r.other_load)} |"
        )
    return lines


def scaling_lines(values: list[Scaling], cpus: int) -> list[str]:
    lines = [
        f"CPU ceiling: {cpus} cores shared by the daemon and its clients; four clients over one could reach "
        "at most cores / (client + daemon cores one client kept busy) (at most 4).",
        "| shape | 4 clients / 1 (median) | each round | CPU ceiling | fraction of it "
        "| ceiling on the cores other load left | fraction of it |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in values:
        rounds = ", ".join(f"{r:.2f}" for r in v.per_round)
        shape = v.one.label.removesuffix(" c1")
        lines.append(
            f"| {shape} | {v.ratio:.2f} | {rounds} | {v.ceiling:.2f} | {v.fraction:.2f} "
            f"| {v.left_ceiling:.2f} | {v.left_fraction:.2f} |"
        )
    return lines


def sizing_lines(rows: list[Row]) -> list[str]:
    """Daemon cores a NIC's line rate takes at the one-client per-core rates."""
    names = list(NICS_GBPS)
    lines = [
        "| op | transport | block x batch | daemon GB/s per core | "
        + " | ".join(f"cores for {n}" for n in names)
        + " |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    for r in rows:
        if r.shape.clients != 1:
            continue
        need = [cores_needed(NICS_GBPS[n], r.daemon_gbps_per_core) for n in names]
        s = r.shape
        lines.append(
            f"| {s.op} | {s.transport} | {report.size_label(s.block)} x{s.batch} "
            f"| {_fmt(r.daemon_gbps_per_core)} | " + " | ".join(_fmt(n, 1) for n in need) + " |"
        )
    return lines


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# -- running ---------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every shape")
    parser.add_argument("--duration", type=float, default=0.4, help="seconds per cell")
    parser.add_argument("--dram-capacity", default="2GiB", help="the daemon's DRAM arena")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="output folder")
    return parser.parse_args(argv)


def run_rounds(args: argparse.Namespace, shapes: list[Shape]) -> list[Measured]:
    """Every shape once per round, every other round in reverse; kept so far on Ctrl-C."""
    measured: list[Measured] = []
    try:
        with ExitStack() as stack:
            pools = stack.enter_context(Pools(CLIENTS))
            daemon = stack.enter_context(kvpool_daemon(args.dram_capacity, "4MiB"))
            stack.callback(pools.close)  # clients leave before the daemon stops
            for index in range(args.rounds):
                for shape in shapes[::-1] if index % 2 else shapes:
                    measured.append(_measure(shape, index, daemon.address, daemon.pid, pools, args.duration))
                    print(f"round {index + 1}: " + blocks.progress_line(0, 0, measured[-1].cell, 0.0).split("] ", 1)[1],
                          file=sys.stderr, flush=True)  # fmt: skip
    except KeyboardInterrupt:
        print("\ninterrupted: reporting the cells measured so far", file=sys.stderr)
    return measured


def _measure(shape: Shape, index: int, address: str, pid: int, pools: Pools, duration: float) -> Measured:
    s = shape
    spec = CellSpec(s.system, s.op, s.block, s.batch, s.clients, address, duration, os.urandom(8), pid,
                    dest_offset=DEST_OFFSET)  # fmt: skip
    before = daemon_times(pid)
    cell = blocks.run_cell(spec, pools, True)
    after = daemon_times(pid)
    return Measured(shape, index, cell, after.user_s - before.user_s, after.system_s - before.system_s)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cpus = os.cpu_count() or 1
    started, t0 = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    measured = run_rounds(args, plan_shapes())
    groups = by_shape(measured)
    rows = [row for group in groups.values() if (row := summarize(group)) is not None]
    scalings = [
        v for shape, group in groups.items()
        if shape.clients == 1 and (four := groups.get(_with_clients(shape, 4)))
        and (v := scaling(group, four, cpus)) is not None
    ]  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    meta = {
        "started": started, "command": " ".join(["bench/capacity.py", *(argv if argv is not None else sys.argv[1:])]),
        "commit": commit.stdout.strip(), "cpus": cpus, "rounds": args.rounds, "duration_s": args.duration,
        "dest_offset": DEST_OFFSET, "loadavg_before": load_before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3], "seconds": round(time.monotonic() - t0),
    }  # fmt: skip
    lines = [*table_lines(rows), "", *scaling_lines(scalings, cpus), "", *sizing_lines(rows)]
    print("\n".join(lines))
    print(f"\nload average before/after: {' '.join(meta['loadavg_before'])} / {' '.join(meta['loadavg_after'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    document = {
        "meta": meta,
        "rows": [asdict(r) for r in rows],
        "scaling": [asdict(v) for v in scalings],
        "cells": [asdict(m) for m in measured],
        "summary": lines,
    }
    path = args.out / "capacity.json"
    path.write_text(json.dumps(document, indent=2))
    print(f"wrote {path}")
    return 0


def _with_clients(shape: Shape, clients: int) -> Shape:
    return Shape(shape.system, shape.op, shape.block, shape.batch, clients)


if __name__ == "__main__":
    sys.exit(main())
