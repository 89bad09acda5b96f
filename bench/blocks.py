"""Block put/get benchmark of kvpool on loopback, against Mooncake Store and memcpy, raw TCP and Redis baselines.

Usage: ``.venv/bin/python bench/blocks.py [--quick] [--out bench/results]``

One run starts a kvpool daemon, redis-server, a raw socket server and Mooncake's master
and store node (bench/mooncake_peer), spawns 1 and
4 client processes (``kvpool`` reads over TCP, ``kvpool-shm`` out of the daemon's
shared arena, as a client on its node does), and measures every (system, op, block size, batch, clients)
cell for a bounded time. Every block a get returns is verified against the
checksum of the bytes it was written from (untimed). Writes ``blocks.json``,
``blocks.md`` and ``blocks_{get,put}.png`` to ``--out`` and prints the table and
the target ratios. Everything started is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import os
import platform
import signal
import subprocess
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from bench import mooncake_peer
from bench.harness import machine, report
from bench.harness.cells import Cell, missing, summarize
from bench.harness.clients import CellFailed, Pools
from bench.harness.servers import REPO_ROOT, Endpoint, kvpool_daemon, redis_server, socket_server
from bench.harness.workload import CellSpec, KiB, MiB
from bench.mooncake_peer.servers import mooncake_servers
from kvpool_server.config import parse_byte_size

BLOCK_SIZES = (64 * KiB, 384 * KiB, 2 * MiB)
BATCHES = (1, 32)
CLIENTS = (1, 4)
SYSTEMS = ("memcpy", "socket", "kvpool", "kvpool-shm", "redis", *mooncake_peer.SYSTEMS)
DEST_OFFSETS = (0, 16, 64)  # get destinations' offsets from a page; all but 0 for one client's reads only
FULL_DURATION_S = 1.5
QUICK_DURATION_S = 0.2
NOISY_CORES = 0.25  # other processes' CPU above which a cell is measured again
MAX_RETRIES = 2
RATIO_ROUNDS = 3  # after the full pass: rounds of only the cells the target ratios compare, interleaved


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_DURATION_S} s per cell instead of {FULL_DURATION_S}"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="output folder")
    parser.add_argument("--duration", type=float, default=None, help="seconds per cell (overrides --quick)")
    parser.add_argument("--dram-capacity", default="3GiB", help="kvpool DRAM arena, also Redis maxmemory")
    parser.add_argument("--slab-size", default="4MiB", help="kvpool slab size")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ",".join(SYSTEMS))
    parser.add_argument(
        "--retry-budget", type=float, default=None, help="seconds for re-measuring cells disturbed by other processes"
    )
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="do not apt-get install a missing redis-server or the libraries Mooncake links",
    )
    parser.add_argument(
        "--dest-offsets",
        default=",".join(map(str, DEST_OFFSETS)),
        help="offsets from a page of get destinations; each one but 0 adds the reads of one client",
    )
    parser.add_argument(
        "--ratio-rounds",
        type=int,
        default=None,
        help=f"rounds of the cells the target ratios compare, after the full pass ({RATIO_ROUNDS}; --quick: 0)",
    )
    return parser.parse_args(argv)


def plan_cells(
    endpoints: dict[str, Endpoint | None], systems: list[str], duration_s: float, dest_offsets: tuple[int, ...] = (0,)
) -> list[CellSpec]:
    """Every cell of the run, grouped by system so each server is busy in one stretch.

    Reads go into page-aligned destinations; a one-client read is followed by the same
    read into destinations at each other offset of ``dest_offsets``.
    """
    specs: list[CellSpec] = []
    for system in systems:
        ops = ("copy",) if system == "memcpy" else ("put", "get")
        for clients in CLIENTS:
            for block in BLOCK_SIZES:
                for batch in BATCHES:
                    for op in ops:
                        spec = _spec(endpoints.get(system), system, op, block, batch, clients, duration_s)
                        specs.append(spec)
                        if op != "put" and clients == 1:
                            specs += [replace(spec, tag=os.urandom(8), dest_offset=o) for o in dest_offsets if o]
    return specs


def plan_ratio_round(
    endpoints: dict[str, Endpoint | None], systems: list[str], duration_s: float, index: int
) -> list[CellSpec]:
    """One round of the cells the target ratios compare; every other round in reverse, so
    that over the rounds no system is always measured first."""
    specs = [
        _spec(endpoints.get(system), system, report.read_op(system), report.RATIO_BLOCK, batch, clients, duration_s)
        for system, batch, clients in report.ratio_shapes(systems)
    ]
    return specs[::-1] if index % 2 else specs


def _spec(
    server: Endpoint | None, system: str, op: str, block: int, batch: int, clients: int, duration_s: float
) -> CellSpec:
    """A cell with fresh keys (a new tag), reading from ``server`` (None: memcpy, or not running)."""
    if server is None:
        return CellSpec(system, op, block, batch, clients, "", duration_s, os.urandom(8))
    return CellSpec(system, op, block, batch, clients, server.address, duration_s, os.urandom(8), server.pid,
                    also_server_pids=server.also)  # fmt: skip


RoundShape = tuple[str, str, int, int, int]  # (system, op, block size, batch, clients)


def run_rounds(
    shapes: Sequence[RoundShape], endpoints: dict[str, Endpoint | None], pools: Pools, rounds: int, duration_s: float
) -> dict[RoundShape, list[Cell]]:
    """Each shape measured once per round, every other round in reverse order, so a noisy stretch
    of the machine falls on every shape; shape -> its cells, round by round."""
    cells: dict[RoundShape, list[Cell]] = {shape: [] for shape in shapes}
    for index in range(rounds):
        for shape in shapes[::-1] if index % 2 else shapes:
            system, op, block, batch, clients = shape
            server = endpoints.get(system)
            cell = run_cell(_spec(server, system, op, block, batch, clients, duration_s), pools, server is not None)
            cells[shape].append(cell)
            line = progress_line(0, 0, cell, 0.0).split("] ", 1)[1]
            print(f"round {index + 1}: {line}", file=sys.stderr, flush=True)
    return cells


def paired_ratios(tops: Sequence[Cell], bottoms: Sequence[Cell]) -> list[float]:
    """GB/s of each round's ``tops`` cell over its ``bottoms`` cell (:func:`run_rounds`), where both measured one."""
    return [a.gbps / b.gbps for a, b in zip(tops, bottoms, strict=True) if a.ok and b.ok and a.gbps and b.gbps]


def run_cell(spec: CellSpec, pools: Pools, available: bool) -> Cell:
    if not available:
        return missing(spec, f"{spec.system} server unavailable")
    before = machine.sample()
    try:
        cell = summarize(spec, pools.run(spec))
        return replace(cell, foreign_cores=machine.foreign_cores(before, machine.sample()))
    except CellFailed as exc:
        print(f"  FAILED: {exc}", file=sys.stderr)
        return missing(spec, str(exc).strip().splitlines()[-1])


@dataclass(slots=True)
class RetryBudget:
    """Seconds a run may spend measuring disturbed cells again."""

    seconds: float


def measure(spec: CellSpec, pools: Pools, available: bool, budget: RetryBudget) -> Cell:
    """Run a cell; while other processes disturbed it and retry time is left, run it again.

    Keeps the least disturbed attempt. Each attempt writes fresh keys.
    """
    best = run_cell(spec, pools, available)
    attempts = 1
    while _disturbed(best) and attempts <= MAX_RETRIES and budget.seconds > 0:
        started = time.monotonic()
        again = run_cell(replace(spec, tag=os.urandom(8)), pools, available)
        budget.seconds -= time.monotonic() - started
        attempts += 1
        if again.ok and (again.foreign_cores or 0.0) < (best.foreign_cores or 0.0):
            best = again
    return replace(best, attempts=attempts)


def _disturbed(cell: Cell) -> bool:
    return cell.ok and (cell.foreign_cores or 0.0) > NOISY_CORES


def progress_line(index: int, total: int, cell: Cell, elapsed: float) -> str:
    shape = f"{cell.system:6} {cell.op:4} {report.size_label(cell.block_size):>7} x{cell.batch:<2} c{cell.clients}"
    shape += f" page+{cell.dest_offset}" if cell.dest_offset else ""
    if not cell.ok:
        return f"[{index:2}/{total}] {shape}: missing ({cell.error})"
    server = f"{cell.server_cpu_us:.0f}" if cell.server_cpu_us is not None else "-"
    return (
        f"[{index:2}/{total}] {shape}: {cell.gbps:5.2f} GB/s {cell.ops_per_s:7.0f} ops/s "
        f"p50/p99 {cell.p50_us:.0f}/{cell.p99_us:.0f} us, cpu/op client {cell.client_cpu_us:.0f} server {server} us, "
        f"other load {cell.foreign_cores} ({cell.attempts}x, {elapsed:.1f} s)"
    )


def start_everything(
    stack: ExitStack, args: argparse.Namespace, systems: list[str]
) -> tuple[dict[str, Endpoint | None], Pools]:
    """Client pools first (they import in the background while servers start), then servers."""
    pools = stack.enter_context(Pools(CLIENTS))
    endpoints: dict[str, Endpoint | None] = {}
    if {"kvpool", "kvpool-shm"} & set(systems):
        daemon = stack.enter_context(kvpool_daemon(args.dram_capacity, args.slab_size))
        endpoints["kvpool"] = endpoints["kvpool-shm"] = daemon  # one daemon, two ways to read it
    if "redis" in systems:
        endpoints["redis"] = stack.enter_context(
            redis_server(args.dram_capacity.lower().replace("ib", "b"), not args.no_install)
        )
    if "socket" in systems:
        endpoints["socket"] = stack.enter_context(socket_server())
    if set(mooncake_peer.SYSTEMS) & set(systems):
        capacity = parse_byte_size(args.dram_capacity)
        servers = stack.enter_context(mooncake_servers(capacity, not args.no_install))
        endpoints |= servers.endpoints() if servers else dict.fromkeys(mooncake_peer.SYSTEMS)
    stack.callback(pools.close)  # on the way out, clients leave before the servers they talk to stop
    return endpoints, pools


def run_all(
    args: argparse.Namespace,
    systems: list[str],
    duration_s: float,
    retry_s: float,
    cells: list[Cell],
    rounds: list[list[Cell]],
    ratio_rounds: int,
) -> None:
    """Run every cell, then ``ratio_rounds`` rounds of the ratios' cells, appending to
    ``cells`` and ``rounds`` as they finish (kept on Ctrl-C)."""
    with ExitStack() as stack:
        started = time.monotonic()
        endpoints, pools = start_everything(stack, args, systems)
        print(f"servers and clients up in {time.monotonic() - started:.1f} s", file=sys.stderr)
        budget = RetryBudget(retry_s)
        offsets = tuple(int(o) for o in args.dest_offsets.split(",") if o)
        run_cells(plan_cells(endpoints, systems, duration_s, offsets), endpoints, pools, budget, cells)
        for index in range(ratio_rounds):
            print(f"ratio round {index + 1} of {ratio_rounds}", file=sys.stderr)
            rounds.append([])
            run_cells(plan_ratio_round(endpoints, systems, duration_s, index), endpoints, pools, budget, rounds[-1])


def run_cells(
    specs: list[CellSpec], endpoints: dict[str, Endpoint | None], pools: Pools, budget: RetryBudget, cells: list[Cell]
) -> None:
    for index, spec in enumerate(specs, 1):
        started = time.monotonic()
        available = spec.system == "memcpy" or endpoints.get(spec.system) is not None
        cell = measure(spec, pools, available, budget)
        cells.append(cell)
        print(progress_line(index, len(specs), cell, time.monotonic() - started), file=sys.stderr, flush=True)


def run_meta(
    args: argparse.Namespace, duration_s: float, started: str, seconds: float, cells: list[Cell]
) -> dict[str, Any]:
    loads = [c.foreign_cores for c in cells if c.foreign_cores is not None]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    return {
        "started": started,
        "seconds": round(seconds, 1),
        "quick": args.quick,
        "duration_s": duration_s,
        "cpus": os.cpu_count() or 1,
        "python": platform.python_version(),
        "commit": commit.stdout.strip(),
        "dram_capacity": args.dram_capacity,
        "slab_size": args.slab_size,
        "mean_other_load_cores": round(sum(loads) / len(loads), 2) if loads else None,
    }


def write_outputs(out: Path, cells: list[Cell], meta: dict[str, Any], rounds: list[list[Cell]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / "blocks.json", cells, meta, rounds)
    report.write_markdown(out / "blocks.md", cells, meta, rounds)
    plots = report.write_plots(out, cells)
    print(report.markdown_table(cells))
    print("\nRatios (this run, from the cells above):")
    print(report.ratio_lines(report.ratios(cells, meta["cpus"])))
    if rounds:
        print(f"\nRatios over {len(rounds)} interleaved rounds of only the cells they compare (median):")
        print(report.ratio_lines(report.round_ratios(rounds, meta["cpus"])))
    print(report.CEILING_NOTE, report.SCALING_NOTE)
    if alignment := report.alignment_lines(cells):
        print(f"\nDestinations at offsets from a page (ratio to page+0):\n{alignment}")
    print(f"\nWrote {out / 'blocks.json'}, {out / 'blocks.md'}, " + ", ".join(str(p) for p in plots))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # clean up on kill as on Ctrl-C
    args = parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems: {', '.join(sorted(unknown))}")
    duration_s = args.duration or (QUICK_DURATION_S if args.quick else FULL_DURATION_S)
    started, t0 = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    cells: list[Cell] = []
    rounds: list[list[Cell]] = []
    ratio_rounds = args.ratio_rounds if args.ratio_rounds is not None else (0 if args.quick else RATIO_ROUNDS)
    status = 0
    try:
        retry_s = args.retry_budget if args.retry_budget is not None else (10.0 if args.quick else 45.0)
        run_all(args, systems, duration_s, retry_s, cells, rounds, ratio_rounds)
    except KeyboardInterrupt:
        print("\ninterrupted: everything stopped; writing the cells measured so far", file=sys.stderr)
        status = 130
    write_outputs(args.out, cells, run_meta(args, duration_s, started, time.monotonic() - t0, cells), rounds)
    return status


if __name__ == "__main__":
    sys.exit(main())
