"""What TLS on the TCP data plane costs: put and get throughput, plain TCP against TLS, in one run.

Usage: ``.venv/bin/python bench/data_tls.py [--rounds 5] [--duration 1.0] [--out bench/results]``

Starts two daemons on loopback, one plain and one with ``data_tls`` (certificates made
by the openssl CLI), and one blocking client per daemon over ``tcp`` (shm off, so every
byte crosses the socket). For 384 KiB and 2 MiB blocks in batches of 32 it alternates
plain and TLS passes for ``--rounds`` rounds, so drift on this shared machine hits both
alike, and reports the median GB/s of each and the TLS/plain ratio. Every block read
back is compared with what was put, untimed. Writes ``data_tls.json`` to ``--out``.
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
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass

from bench.harness.pki import issue, make_ca
from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from kvpool_client.core.auth import TlsFiles
from tests.support.daemon import start_daemon

KiB, MiB = 1 << 10, 1 << 20
BLOCK_SIZES = (384 * KiB, 2 * MiB)
BATCH = 32
SYSTEMS = ("plain", "tls")


@dataclass(frozen=True, slots=True)
class Cell:
    op: str
    block: int
    plain_gbps: float
    tls_gbps: float

    @property
    def ratio(self) -> float:
        return self.tls_gbps / self.plain_gbps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating plain/TLS passes per cell")
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per pass")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    return parser.parse_args(argv)


@contextmanager
def clients() -> Iterator[dict[str, KVPoolClient]]:
    """A plain and a TLS daemon, each with its client; everything is stopped and removed at exit."""
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-tls-") as work, ExitStack() as stack:
        directory = Path(work)
        ca = make_ca(directory, "ca")
        cert, key = issue(directory, "server", ca)
        flags = ("--dram-capacity", "512MiB", "--slab-size", "4MiB", "--tls-cert-file", str(cert),
                 "--tls-key-file", str(key))  # fmt: skip
        pools = {}
        for system in SYSTEMS:
            daemon = start_daemon(*flags, *(["--data-tls"] if system == "tls" else []))
            stack.callback(daemon.remove_files)
            stack.callback(daemon.stop)
            config = ClientConfig(nodes=(daemon.address,), tls=TlsFiles(str(ca[0])), transport="tcp")
            pools[system] = stack.enter_context(KVPoolClient(config=config))
        yield pools


def passes(pool: KVPoolClient, block: int, seed: int) -> tuple[Callable[[], int], Callable[[], int]]:
    """A put pass and a get pass over one batch of ``block``-byte blocks; each returns bytes moved."""
    keys = [BlockKey("bench@tls", seed.to_bytes(4, "little") + i.to_bytes(4, "little")) for i in range(BATCH)]
    blocks = [os.urandom(block) for _ in range(BATCH)]
    targets = [bytearray(block) for _ in range(BATCH)]

    def put() -> int:
        pool.delete(keys)
        pool.put(keys, blocks).raise_for_errors()
        return BATCH * block

    def get() -> int:
        got = pool.get(keys, targets)
        if not got.ok:
            raise RuntimeError(f"get failed: {got.statuses}")
        return BATCH * block

    put()
    get()
    if [bytes(t) for t in targets] != blocks:
        raise AssertionError("a block read back differs from what was put")
    return put, get


def rate(run: Callable[[], int], duration: float) -> float:
    moved, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < duration:
        moved += run()
    return moved / elapsed / 1e9


def measure(pools: dict[str, KVPoolClient], rounds: int, duration: float) -> list[Cell]:
    cells = []
    for block in BLOCK_SIZES:
        runs = {system: passes(pool, block, seed) for seed, (system, pool) in enumerate(pools.items())}
        for index, op in enumerate(("put", "get")):
            samples: dict[str, list[float]] = {system: [] for system in SYSTEMS}
            for round_ in range(rounds):
                order = SYSTEMS if round_ % 2 == 0 else SYSTEMS[::-1]
                for system in order:
                    samples[system].append(rate(runs[system][index], duration))
            cells.append(Cell(op, block, *(statistics.median(samples[s]) for s in SYSTEMS)))
    return cells


def table(cells: list[Cell]) -> str:
    lines = ["| op | block x batch | plain TCP GB/s | TLS GB/s | TLS / plain |", "|---|---|---:|---:|---:|"]
    for cell in cells:
        size = f"{cell.block // KiB} KiB" if cell.block < MiB else f"{cell.block // MiB} MiB"
        lines.append(
            f"| {cell.op} | {size} x{BATCH} | {cell.plain_gbps:.2f} | {cell.tls_gbps:.2f} | {cell.ratio:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with clients() as pools:
        cells = measure(pools, args.rounds, args.duration)
    print(table(cells))
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"rounds": args.rounds, "duration_s": args.duration,
              "cells": [asdict(c) | {"ratio": c.ratio} for c in cells]}  # fmt: skip
    (args.out / "data_tls.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
