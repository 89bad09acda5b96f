"""Get throughput of each data-plane transport against memcpy, a raw socket and Redis, in one run.

Usage: ``.venv/bin/python bench/transports.py [--duration 1.0] [--out bench/results]``

Starts one kvpool daemon on this node (with its UCX listener when ucxx imports)
and, for 64 KiB, 384 KiB and 2 MiB blocks in batches of 32, with 1 and 4 client
processes, measures gets over ``tcp``, ``ucx`` (UCX over shared memory here) and
``shm`` (copied out of the daemon's arena), a raw blocking TCP ``socket`` server
(bench/harness/servers.py, no protocol beyond offsets), Redis (Debian's ``redis-server``,
persistence off; MGET with redis-py and hiredis, each value copied into its
target), and a plain ``memcpy`` of the same bytes from process memory. Each
client reads a working set of ``--working-set`` bytes (larger than the CPU
caches, so sources are cache-cold for every system) into the same 32
page-aligned destination buffers. Every system's bytes are checked once,
untimed. Prints a table and the ratios (targets: shm >= 0.5x memcpy at 384 KiB;
ucx >= 2x tcp at 1 MiB and above; 4 clients >= 1.6x one); writes
``transports.json`` to ``--out``.

A ratio of two cells of the full pass compares them minutes apart, and this
shared VM drifts by more than the targets' margins in that time. So after the full
pass, ``--rounds`` rounds measure only the cells the targets compare, every other
round in reverse order, and each target is reported as the median of its per-round
ratios (two cells seconds apart), beside its full-pass value. Each scaling target also
shows its CPU ceiling: the machine's cores over the cores its one-client cell kept
busy (clients and server), which is what four clients could reach if each get cost
what it cost alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from bench.harness.drivers import RedisDriver, SocketDriver
from bench.harness.machine import process_cpu_ns
from bench.harness.report import CEILING_NOTE, Ratio, RatioSpec, Shape, ratio_lines, scaling_ceiling
from bench.harness.servers import redis_server, socket_server
from bench.harness.workload import REGION_BYTES, BlockRef, region
from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from kvpool_client.transport.ucx import import_error as ucx_import_error
from tests.support.daemon import start_daemon

KiB, MiB = 1 << 10, 1 << 20
BLOCK_SIZES = (64 * KiB, 384 * KiB, 2 * MiB)
BATCH = 32
CLIENTS = (1, 4)
SYSTEMS = ("memcpy", "socket", "tcp", "ucx", "shm", "redis")


@dataclass(frozen=True, slots=True)
class Cell:
    system: str
    block: int
    clients: int
    gbps: float  # aggregate over the clients
    batches: int
    client_cores: float | None = None  # cores the clients kept busy while timed, all their threads
    server_cores: float | None = None  # cores the serving process kept busy meanwhile (None: no server)

    @property
    def cores(self) -> float | None:
        """Cores the cell kept busy, clients and server; None when not measured."""
        return None if self.client_cores is None else self.client_cores + (self.server_cores or 0.0)


# Each target compares two (system, block, clients) cells.
TARGETS = (
    RatioSpec("shm / memcpy, 384 KiB x32, 1 client", ("shm", 384 * KiB, 1), ("memcpy", 384 * KiB, 1), 0.5),
    RatioSpec("ucx / tcp, 2 MiB x32, 1 client", ("ucx", 2 * MiB, 1), ("tcp", 2 * MiB, 1), 2.0),
    *(
        RatioSpec(f"{system}: 4 clients / 1, 384 KiB x32", (system, 384 * KiB, 4), (system, 384 * KiB, 1), 1.6)
        for system in ("tcp", "ucx", "shm")
    ),
    # What two cores allow four processes at all: each copies its own cache-cold bytes.
    RatioSpec(
        "memcpy: 4 clients / 1, 384 KiB x32 (the machine's ceiling)",
        ("memcpy", 384 * KiB, 4),
        ("memcpy", 384 * KiB, 1),
        None,
    ),
)


@dataclass(frozen=True, slots=True)
class Job:
    system: str
    address: str
    block: int
    working_set: int
    duration_s: float
    index: int = 0  # the client's number: the raw socket server holds one region per client


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per cell")
    parser.add_argument("--working-set", default=64, type=int, help="MiB each client reads (cache-cold)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the targets' cells (0: none)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    return parser.parse_args(argv)


def worker(job: Job, barrier: mp.synchronize.Barrier, results: mp.Queue) -> None:
    """One client: load its working set, wait for the others, then get batches for the duration.

    Its connections stay open until the parent has read the server's CPU time: a
    server thread that ends with its connection takes its CPU time along.
    """
    batches = max(1, job.working_set // (job.block * BATCH))
    data = page_aligned(batches * BATCH * job.block)
    if job.system == "socket":  # the server sends its copy of this client's region
        batches = min(batches, REGION_BYTES // (job.block * BATCH))
        data = data[: batches * BATCH * job.block]
        data[:] = region(job.index)[: len(data)]
    else:
        rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        data[:] = rng.integers(0, 256, len(data), dtype=np.uint8)
    targets = [page_aligned(job.block) for _ in range(BATCH)]
    fetch, close = _fetcher(job, data, batches, targets)
    for index in range(batches):  # warm: connections, and every page mapped (a long-lived client's state)
        fetch(index)
    barrier.wait()
    started, done, cpu = time.perf_counter(), 0, time.process_time_ns()
    while time.perf_counter() - started < job.duration_s:
        fetch(done % batches)
        done += 1
    elapsed, cpu = time.perf_counter() - started, time.process_time_ns() - cpu
    fetch(1 % batches)  # untimed check of what a get returns
    expected = data[(1 % batches) * BATCH * job.block :][: BATCH * job.block]
    ok = np.array_equal(np.concatenate(targets), expected)
    results.put(Outcome(done * BATCH * job.block, elapsed, done, cpu, ok))
    barrier.wait()  # the parent has sampled the server
    close()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one client measured."""

    nbytes: int
    seconds: float
    batches: int
    cpu_ns: int  # the client process's CPU time while timed
    ok: bool  # the checked get returned the expected bytes


def page_aligned(nbytes: int) -> np.ndarray:
    """A buffer starting on a page, as arena slots, pinned buffers and large torch tensors do.

    memcpy slows down 2-3x here when source and destination differ in alignment
    (numpy's own arrays start 16 bytes into a page, arena slots on one), so every
    system gets the same aligned buffers.
    """
    raw = np.empty(nbytes + 4096, dtype=np.uint8)
    start = -raw.ctypes.data % 4096
    return raw[start : start + nbytes]


def _fetcher(job: Job, data: np.ndarray, batches: int, targets: list[np.ndarray]):  # type: ignore[no-untyped-def]
    """(fetch(batch index), close) for the job's system; kvpool systems store the data first."""
    blocks = [data[i * job.block : (i + 1) * job.block] for i in range(batches * BATCH)]
    if job.system == "memcpy":

        def copy(index: int) -> None:
            for target, source in zip(targets, blocks[index * BATCH : (index + 1) * BATCH], strict=True):
                np.copyto(target, source)

        return copy, lambda: None
    if job.system == "redis":
        return _redis_fetcher(job, blocks, targets)
    if job.system == "socket":
        driver = SocketDriver(job.address, job.index)
        requests = [driver.prepare([BlockRef(b"", (i * BATCH + j) * job.block) for j in range(BATCH)], job.block)
                    for i in range(batches)]  # fmt: skip

        def receive(index: int) -> None:
            driver.get(requests[index], targets)

        return receive, driver.close
    client = KVPoolClient(config=ClientConfig(nodes=(job.address,), transport=job.system))
    if client.transport(job.address) != job.system:
        raise RuntimeError(f"asked for {job.system}, negotiated {client.transport(job.address)}")
    keys = [BlockKey("bench@u8@raw", os.urandom(32)) for _ in blocks]
    for start in range(0, len(keys), BATCH):
        if client.put(keys[start : start + BATCH], blocks[start : start + BATCH]).stored != BATCH:
            raise RuntimeError("put failed: is the arena large enough for every client's working set?")

    def get(index: int) -> None:
        result = client.get(keys[index * BATCH : (index + 1) * BATCH], targets)
        if result.hits != BATCH:
            raise RuntimeError(f"get hit {result.hits}/{BATCH}: {result.statuses[:3]}")

    def close() -> None:
        client.delete(keys)
        client.close()

    return get, close


def _redis_fetcher(job: Job, blocks: list[np.ndarray], targets: list[np.ndarray]):  # type: ignore[no-untyped-def]
    """MGET of a batch, each value copied into its target (the caller wants bytes in its own buffers)."""
    driver = RedisDriver(job.address)
    keys = [os.urandom(16) for _ in blocks]
    for start in range(0, len(keys), BATCH):
        driver.put(keys[start : start + BATCH], [memoryview(b) for b in blocks[start : start + BATCH]])

    def get(index: int) -> None:
        driver.get(keys[index * BATCH : (index + 1) * BATCH], targets)  # copies each value into its target

    def close() -> None:
        driver.forget([BlockRef(k, 0) for k in keys])
        driver.close()

    return get, close


def run_cell(
    system: str, address: str, block: int, clients: int, args: argparse.Namespace, server_pid: int | None
) -> Cell:
    """One cell; ``server_pid``: the process serving it (None for memcpy), whose CPU time is sampled."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(clients + 1), ctx.Queue()  # this process joins: it reads the server's clock
    jobs = [Job(system, address, block, args.working_set * MiB, args.duration, i) for i in range(clients)]
    procs = [ctx.Process(target=worker, args=(job, barrier, results)) for job in jobs]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=120)
    server_ns = process_cpu_ns(server_pid) if server_pid is not None else 0
    outcomes: list[Outcome] = [results.get(timeout=120 + args.duration) for _ in procs]
    server_ns = process_cpu_ns(server_pid) - server_ns if server_pid is not None else 0  # a check get included
    barrier.wait(timeout=60)  # the clients may close their connections now
    for proc in procs:
        proc.join(30)
    if not all(o.ok for o in outcomes):
        raise RuntimeError(f"{system}: a get returned wrong bytes")
    elapsed = max(o.seconds for o in outcomes)
    gbps = sum(o.nbytes for o in outcomes) / elapsed / 1e9
    client_cores = sum(o.cpu_ns for o in outcomes) / 1e9 / elapsed
    server_cores = server_ns / 1e9 / elapsed if server_pid is not None else None
    return Cell(system, block, clients, gbps, sum(o.batches for o in outcomes), client_cores, server_cores)


def ratios(cells: list[Cell], systems: tuple[str, ...]) -> list[str]:
    """Same-run ratios: each transport against memcpy and tcp, and 4 clients against one."""
    by = {(c.system, c.block, c.clients): c.gbps for c in cells}
    lines = []
    for clients in CLIENTS:
        for block in BLOCK_SIZES:
            memcpy, tcp = by[("memcpy", block, clients)], by[("tcp", block, clients)]
            parts = [f"{s}/memcpy {by[(s, block, clients)] / memcpy:.2f}" for s in systems if s != "memcpy"]
            parts += [
                f"{s}/tcp {by[(s, block, clients)] / tcp:.2f}"
                for s in ("ucx", "shm", "socket", "redis")
                if s in systems
            ]
            lines.append(f"{clients} client(s), {block // KiB:>5} KiB: " + "  ".join(parts))
    for system in systems:
        scale = [by[(system, b, 4)] / by[(system, b, 1)] for b in BLOCK_SIZES]
        lines.append(f"{system}: 4 clients / 1 client = " + ", ".join(f"{s:.2f}" for s in scale))
    return lines


def target_shapes(systems: tuple[str, ...]) -> list[Shape]:
    """The cells the targets compare, among ``systems``, each once, in a fixed order."""
    shapes = [shape for spec in TARGETS for shape in (spec.top, spec.bottom) if shape[0] in systems]
    return list(dict.fromkeys(shapes))


def target_ratios(cells: list[Cell]) -> list[float | None]:
    """Each target's ratio among ``cells`` (None: a cell it needs is not there)."""
    by = {(c.system, c.block, c.clients): c.gbps for c in cells}
    return [by[spec.top] / by[spec.bottom] if spec.top in by and by.get(spec.bottom) else None for spec in TARGETS]


def target_ceilings(cells: list[Cell], cpus: int) -> list[float | None]:
    """Each scaling target's CPU ceiling on ``cpus`` cores (None: not a scaling target, or not measured)."""
    by = {(c.system, c.block, c.clients): c for c in cells}
    ones = [by.get(spec.bottom) if spec.scaling else None for spec in TARGETS]
    return [
        scaling_ceiling(one.cores if one else None, spec.top[2], cpus) for spec, one in zip(TARGETS, ones, strict=True)
    ]


def targets(cells: list[Cell], rounds: list[list[Cell]], cpus: int) -> tuple[list[Ratio], list[Ratio]]:
    """The targets from the full pass, and as medians of the rounds' ratios (and ceilings)."""
    pairs = zip(TARGETS, target_ratios(cells), target_ceilings(cells, cpus), strict=True)
    full = [Ratio(spec.name, value, spec.target, ceiling=ceiling) for spec, value, ceiling in pairs]
    per_round = [(target_ratios(r), target_ceilings(r, cpus)) for r in rounds]
    medians = []
    for i, spec in enumerate(TARGETS):
        values = tuple(round(v, 3) for r, _ in per_round if (v := r[i]) is not None)
        ceilings = [c for _, r in per_round if (c := r[i]) is not None]
        median = statistics.median(values) if values else None
        medians.append(Ratio(spec.name, median, spec.target, values, statistics.median(ceilings) if ceilings else None))
    return full, medians


def _line(c: Cell) -> str:
    cores = f", cores busy: clients {c.client_cores:.2f}" if c.client_cores is not None else ""
    cores += f" server {c.server_cores:.2f}" if c.server_cores is not None else ""
    return f"{c.system:>6} {c.block // KiB:>5} KiB x{BATCH} {c.clients} client(s): {c.gbps:6.2f} GB/s{cores}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    capacity = max(CLIENTS) * args.working_set * MiB + 64 * MiB
    missing = ucx_import_error()
    systems = SYSTEMS if missing is None else tuple(s for s in SYSTEMS if s != "ucx")
    if missing is not None:
        print(f"ucx left out: ucxx cannot be imported ({missing})", flush=True)
    ucx = ("--ucx-port", "0") if missing is None else ()
    daemon = start_daemon("--dram-capacity", str(capacity), "--slab-size", "4MiB", "--metrics-port", "-1", *ucx)
    cells: list[Cell] = []
    rounds: list[list[Cell]] = []
    try:
        # Redis gets twice the arena: its per-key overhead must not evict the working sets.
        with socket_server() as raw, redis_server(maxmemory=f"{2 * capacity >> 20}mb", install=True) as redis:
            if redis is None:
                print("redis left out: redis-server is not installed and apt-get could not install it", flush=True)
                systems = tuple(s for s in systems if s != "redis")
            # Each system's (address, serving process); memcpy has no server.
            servers = {"memcpy": ("", None), "socket": (raw.address, raw.pid)}
            servers |= {"redis": (redis.address, redis.pid)} if redis is not None else {}
            servers |= {name: (daemon.address, daemon.process.pid) for name in ("tcp", "ucx", "shm")}
            for clients in CLIENTS:
                for block in BLOCK_SIZES:
                    for system in systems:
                        address, pid = servers[system]
                        cells.append(run_cell(system, address, block, clients, args, pid))
                        print(_line(cells[-1]), flush=True)
            shapes = target_shapes(systems)
            for index in range(args.rounds):
                print(f"round {index + 1} of {args.rounds}", flush=True)
                rounds.append([])
                for system, block, clients in shapes[::-1] if index % 2 else shapes:
                    address, pid = servers[system]
                    rounds[-1].append(run_cell(system, address, block, clients, args, pid))
                    print(_line(rounds[-1][-1]), flush=True)
    finally:
        daemon.stop()
        daemon.remove_files()
    cpus = os.cpu_count() or 1
    full, medians = targets(cells, rounds, cpus)
    print("\n".join(["", *ratios(cells, systems), "", "Targets, full pass:", ratio_lines(full)]))
    if rounds:
        print(f"Targets, median of {len(rounds)} interleaved rounds:\n{ratio_lines(medians)}")
    print(CEILING_NOTE)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": cpus, "duration_s": args.duration, "working_set_mib": args.working_set, "batch": BATCH,
            "systems": list(systems), "load_avg_at_end": os.getloadavg()[0]}  # fmt: skip
    out = {
        "meta": meta,
        "cells": [asdict(c) for c in cells],
        "rounds": [[asdict(c) for c in r] for r in rounds],
        "targets": {"full_pass": [asdict(r) for r in full], "rounds": [asdict(r) for r in medians]},
    }
    (args.out / "transports.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
