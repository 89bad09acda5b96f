"""Single-block gets over TCP, kvpool against Redis (and references), in interleaved rounds.

Usage: ``.venv/bin/python bench/single_gets.py [--rounds 5] [--duration 1.5] [--sizes 64KiB,384KiB]``

The cells are those of ``bench/blocks.py`` (same harness, servers, drivers and checks:
one client process, one key per call, cache-cold blocks, page-aligned destinations,
every block verified): kvpool's blocking client over TCP, redis-py with hiredis
(GET, then a copy into the destination), and the references below. Each round
measures every (system, size) once, every other round in reverse order, so a noisy
stretch of the machine falls on every system. Prints, per cell, the medians over
the rounds of GB/s and of the client's and the server's CPU per get (microseconds,
user + kernel), then per size kvpool's ratios to Redis with their targets: GB/s
(the median of the per-round ratios; >= 1.5) and CPU per get, client + server
(below Redis's); for reference, the GB/s over Redis's of ``kvpool-wire`` (the same
daemon read with its one-key frames over a plain socket, none of the SDK: what a Python
client of it gets at most) and of the raw socket (Python at both ends, no protocol).
Writes ``single_gets.json`` to ``--out``.
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
from contextlib import ExitStack
from dataclasses import asdict
from datetime import UTC, datetime

from bench import blocks
from bench.harness.cells import Cell
from bench.harness.clients import Pools
from bench.harness.report import Ratio
from bench.harness.servers import REPO_ROOT, Endpoint, kvpool_daemon, redis_server, socket_server
from bench.harness.workload import KiB, MiB

SYSTEMS = ("kvpool", "kvpool-wire", "redis", "socket")
REFERENCES = {  # beside kvpool's ratio, what they show
    "kvpool-wire": "the daemon read with its one-key frames over a plain socket, no SDK",
    "socket": "Python at both ends, no protocol",
}
GBPS_TARGET = 1.5  # kvpool's single gets over TCP against Redis's, at every size
_UNITS = {"KiB": KiB, "MiB": MiB}


def parse_size(text: str) -> int:
    """``64KiB``, ``2MiB`` or a byte count."""
    for unit, factor in _UNITS.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every cell")
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per cell")
    parser.add_argument("--sizes", default="64KiB,384KiB", help="block sizes, comma-separated")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ",".join(SYSTEMS))
    parser.add_argument("--dram-capacity", default="3GiB", help="kvpool DRAM arena, also Redis maxmemory")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install a missing redis-server")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="output folder")
    return parser.parse_args(argv)


def start_servers(stack: ExitStack, args: argparse.Namespace, systems: list[str]) -> dict[str, Endpoint | None]:
    endpoints: dict[str, Endpoint | None] = {}
    if {"kvpool", "kvpool-wire"} & set(systems):
        daemon = stack.enter_context(kvpool_daemon(args.dram_capacity, "4MiB"))
        endpoints["kvpool"] = endpoints["kvpool-wire"] = daemon
    if "redis" in systems:
        maxmemory = args.dram_capacity.lower().replace("ib", "b")
        endpoints["redis"] = stack.enter_context(redis_server(maxmemory, not args.no_install))
    if "socket" in systems:
        endpoints["socket"] = stack.enter_context(socket_server())
    return endpoints


def run_rounds(args: argparse.Namespace, systems: list[str], sizes: list[int]) -> dict[tuple[str, int], list[Cell]]:
    """Every (system, size) cell once per round; (system, size) -> its cells, round by round."""
    with ExitStack() as stack:
        pools = stack.enter_context(Pools((1,)))
        endpoints = start_servers(stack, args, systems)
        shapes = [(system, "get", size, 1, 1) for system in systems for size in sizes]
        cells = blocks.run_rounds(shapes, endpoints, pools, args.rounds, args.duration)
    return {(system, size): runs for (system, _, size, _, _), runs in cells.items()}


def _median(cells: list[Cell], field: str) -> float | None:
    values = [getattr(c, field) for c in cells if c.ok and getattr(c, field) is not None]
    return statistics.median(values) if values else None


def summary(cells: dict[tuple[str, int], list[Cell]], sizes: list[int]) -> list[str]:
    """The table of medians, then kvpool's ratios to Redis per size."""
    lines = [
        "| system | block | GB/s | client CPU us/get | server CPU us/get | client + server |",
        "|---|---|---|---|---|---|",
    ]
    for (system, size), runs in cells.items():
        gbps, client, server = (_median(runs, f) for f in ("gbps", "client_cpu_us", "server_cpu_us"))
        both = client + server if client is not None and server is not None else None
        lines.append(
            f"| {system} | {size // KiB} KiB | {_fmt(gbps, 2)} | {_fmt(client)} | {_fmt(server)} | {_fmt(both)} |"
        )
    for size in sizes:
        ours, theirs = cells.get(("kvpool", size)), cells.get(("redis", size))
        if not ours or not theirs:
            continue
        per_round = blocks.paired_ratios(ours, theirs)
        cpu = [_cpu(c) for c in (ours, theirs)]
        cpu_ratio = cpu[0] / cpu[1] if cpu[0] is not None and cpu[1] else None
        speed = Ratio("GB/s", _mid(per_round), GBPS_TARGET)
        lines.append(
            f"{size // KiB} KiB single get, kvpool / Redis: GB/s {_fmt(speed.value, 2)} "
            f"(rounds {', '.join(f'{r:.2f}' for r in per_round)}; target >= {GBPS_TARGET}: {speed.verdict}); "
            f"CPU per get (client + server) {_fmt(cpu_ratio, 2)} (target < 1: {_below_one(cpu_ratio)})"
        )
        for system, what in REFERENCES.items():
            if reference := cells.get((system, size)):
                ratio = _fmt(_mid(blocks.paired_ratios(reference, theirs)), 2)
                lines.append(f"{size // KiB} KiB, {system} / Redis: GB/s {ratio} ({what})")
    return lines


def _below_one(ratio: float | None) -> str:
    return "n/a" if ratio is None else "ok" if ratio < 1 else "ABOVE TARGET"


def _cpu(runs: list[Cell]) -> float | None:
    client, server = _median(runs, "client_cpu_us"), _median(runs, "server_cpu_us")
    return client + server if client is not None and server is not None else None


def _mid(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    if set(systems) - set(SYSTEMS):
        raise SystemExit(f"unknown systems: {', '.join(sorted(set(systems) - set(SYSTEMS)))}")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    started = datetime.now(UTC).isoformat(timespec="seconds")
    cells = run_rounds(args, systems, sizes)
    lines = summary(cells, sizes)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    document = {
        "meta": {"started": started, "rounds": args.rounds, "duration_s": args.duration, "cpus": os.cpu_count()},
        "cells": {f"{system} {size}": [asdict(c) for c in runs] for (system, size), runs in cells.items()},
        "summary": lines,
    }
    (args.out / "single_gets.json").write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
