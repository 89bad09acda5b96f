"""Large batches to one node over one connection or several at once, in interleaved rounds.

Usage: ``.venv/bin/python bench/streams.py [--rounds 5] [--duration 1.0] [--sizes 384KiB,2MiB]
[--clients 1,4] [--ops get,put]``

The cells are those of ``bench/blocks.py`` (same harness, servers, drivers and checks:
cache-cold blocks, page-aligned destinations, every block verified), batches of 32 blocks:
kvpool's blocking client as configured by default (``kvpool``: a node's share of a batch of
8 MiB and more goes out as up to ``streams_per_node`` = 2 frames at once, each on its own
connection), the same client with ``streams_per_node=1`` (``kvpool-one-stream``: one frame),
and the raw socket stream. Each round measures every cell once, every other round in
reverse order. Prints per cell the medians over the rounds of GB/s and of the client's and
the server's CPU per batch (microseconds), then per shape the medians of the per-round
ratios: kvpool / one stream, and each of them / the raw socket. Writes ``streams.json`` to
``--out``.
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
from bench.blocks import RoundShape
from bench.harness.cells import Cell
from bench.harness.clients import Pools
from bench.harness.servers import REPO_ROOT, kvpool_daemon, socket_server
from bench.harness.workload import KiB
from bench.single_gets import parse_size

BATCH = 32
SYSTEMS = ("kvpool", "kvpool-one-stream", "socket")
RATIOS = (("kvpool", "kvpool-one-stream"), ("kvpool", "socket"), ("kvpool-one-stream", "socket"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every cell")
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per cell")
    parser.add_argument("--sizes", default="384KiB,2MiB", help="block sizes, comma-separated")
    parser.add_argument("--clients", default="1,4", help="client processes per cell, comma-separated")
    parser.add_argument("--ops", default="get,put", help="get, put or both")
    parser.add_argument("--dram-capacity", default="3GiB", help="the kvpool daemon's DRAM arena")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="output folder")
    return parser.parse_args(argv)


def shapes(ops: list[str], sizes: list[int], clients: list[int]) -> list[RoundShape]:
    return [(system, op, size, BATCH, n) for op in ops for size in sizes for n in clients for system in SYSTEMS]


def run(args: argparse.Namespace, cells_of: list[RoundShape], clients: list[int]) -> dict[RoundShape, list[Cell]]:
    with ExitStack() as stack:
        pools = stack.enter_context(Pools(tuple(clients)))
        daemon = stack.enter_context(kvpool_daemon(args.dram_capacity, "4MiB"))
        endpoints = {"kvpool": daemon, "kvpool-one-stream": daemon, "socket": stack.enter_context(socket_server())}
        stack.callback(pools.close)  # clients leave before the servers they talk to stop
        return blocks.run_rounds(cells_of, endpoints, pools, args.rounds, args.duration)


def summary(cells: dict[RoundShape, list[Cell]]) -> list[str]:
    """The table of medians, then per (op, size, clients) the medians of the per-round ratios."""
    lines = [
        "| system | op | block | clients | GB/s | client CPU us/batch | server CPU us/batch |",
        "|---|---|---|---|---|---|---|",
    ]
    for (system, op, size, _, clients), runs in cells.items():
        medians = [_median([getattr(c, f) for c in runs if c.ok]) for f in ("gbps", "client_cpu_us", "server_cpu_us")]
        figures = " | ".join(_fmt(v, 2 if i == 0 else 0) for i, v in enumerate(medians))
        lines.append(f"| {system} | {op} | {size // KiB} KiB | {clients} | {figures} |")
    for op, size, batch, clients in dict.fromkeys((op, s, b, n) for _, op, s, b, n in cells):
        parts = []
        for top, bottom in RATIOS:
            ours, theirs = cells.get((top, op, size, batch, clients)), cells.get((bottom, op, size, batch, clients))
            if ours and theirs:
                rounds = blocks.paired_ratios(ours, theirs)
                values = ", ".join(f"{r:.2f}" for r in rounds)
                parts.append(f"{top} / {bottom} {_fmt(_median(rounds), 2)} (rounds {values})")
        lines.append(f"{op} {size // KiB} KiB x{batch}, {clients} client(s): " + "; ".join(parts))
    return lines


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    clients = sorted({int(n) for n in args.clients.split(",") if n})
    ops = [op for op in args.ops.split(",") if op]
    if set(ops) - {"get", "put"}:
        raise SystemExit(f"unknown ops: {', '.join(sorted(set(ops) - {'get', 'put'}))}")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    cells = run(args, shapes(ops, sizes, clients), clients)
    lines = summary(cells)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    document = {
        "meta": {"started": started, "rounds": args.rounds, "duration_s": args.duration, "cpus": os.cpu_count()},
        "cells": {" ".join(map(str, shape)): [asdict(c) for c in runs] for shape, runs in cells.items()},
        "summary": lines,
    }
    (args.out / "streams.json").write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
