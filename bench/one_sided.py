"""Gets and puts over the one-sided data plane (NIXL) beside tcp, shm and memcpy, in one run.

Usage: ``.venv/bin/python bench/one_sided.py [--duration 1.0] [--rounds 5] [--out bench/results]``

Starts one kvpool daemon with ``--nixl-enabled`` and, with one client process per cell,
measures 384 KiB gets of one block and of batches of 32 (and batch-32 gets of 64 KiB and
2 MiB blocks), and 384 KiB puts of one block and of 32, over ``nixl`` (the client reads and
writes the daemon's arena itself: UCX's ``cma`` on one host, or what ``UCX_TLS`` allows),
``tcp`` and ``shm`` (gets only: a same-node client's puts go over tcp), against a plain
``memcpy`` of the same bytes between the client's own buffers, and against ``cma``: the one
READ or WRITE per batch a nixl get or put makes, and nothing else (places located, or slots
reserved, once): the transport's own ceiling on this machine. The nixl client registers
its buffers once, as an engine registers its KV cache. Gets read a working set larger than
the CPU caches; puts write fresh keys (the arena evicts the oldest). Every cell's bytes are
checked once, untimed. Cells run in ``--rounds`` rounds, every other round in reverse order;
each figure is the median over the rounds, each ratio the median of its per-round ratios.
Besides GB/s, each cell reports the daemon's CPU per GB moved and the client's.

Targets (issue 37): daemon CPU <= 0.01 s per GB over nixl; nixl single 384 KiB get >= 0.8x
memcpy, batch-32 >= 0.9x, batch-32 put >= 0.8x. On one host this measures cma, the kernel
copying between two processes: what RDMA between hosts does without either CPU is not
measurable here (no RDMA NIC); with ``UCX_TLS=tcp`` UCX emulates one-sided reads on the
daemon's CPU, a correctness check rather than a speed figure.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import itertools
import json
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from bench.harness.machine import process_cpu_ns
from bench.transports import page_aligned
from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from kvpool_client.core.wire import (
    LocateRequest,
    LocateResponse,
    PeerRequest,
    PeerResponse,
    ReserveRequest,
    ReserveResponse,
)
from kvpool_client.transport.nixl import LocalAgent, RemoteArena
from kvpool_client.transport.shm import SlotLocation
from tests.support.daemon import start_daemon
from tests.support.rawwire import RawConnection

KiB, MiB = 1 << 10, 1 << 20
BLOCK = 384 * KiB


@dataclass(frozen=True, slots=True)
class Shape:
    system: str  # memcpy, cma (the bare transfers nixl makes: the transport's ceiling), tcp, shm or nixl
    op: str  # get or put
    block: int
    batch: int

    @property
    def name(self) -> str:
        return f"{self.system} {self.op} {self.block // KiB} KiB x{self.batch}"


SHAPES = tuple(
    Shape(system, op, block, batch)
    for op, block, batch in (
        ("get", BLOCK, 1),
        ("get", BLOCK, 32),
        ("get", 64 * KiB, 32),
        ("get", 2 * MiB, 32),
        ("put", BLOCK, 1),
        ("put", BLOCK, 32),
    )
    for system in ("memcpy", "cma", "tcp", "shm", "nixl")
    if not (op == "put" and system in ("shm", "memcpy"))  # memcpy's get cell is the put's baseline too
)
# (label, numerator, denominator, target): each ratio is taken round by round.
TARGETS = (
    ("nixl / memcpy, 384 KiB get x1", Shape("nixl", "get", BLOCK, 1), Shape("memcpy", "get", BLOCK, 1), 0.8),
    ("nixl / memcpy, 384 KiB get x32", Shape("nixl", "get", BLOCK, 32), Shape("memcpy", "get", BLOCK, 32), 0.9),
    ("nixl / memcpy, 384 KiB put x32", Shape("nixl", "put", BLOCK, 32), Shape("memcpy", "get", BLOCK, 32), 0.8),
    ("nixl / memcpy, 384 KiB put x1", Shape("nixl", "put", BLOCK, 1), Shape("memcpy", "get", BLOCK, 1), None),
    ("nixl / tcp, 384 KiB get x32", Shape("nixl", "get", BLOCK, 32), Shape("tcp", "get", BLOCK, 32), None),
    ("nixl / tcp, 384 KiB put x32", Shape("nixl", "put", BLOCK, 32), Shape("tcp", "put", BLOCK, 32), None),
    ("nixl / shm, 384 KiB get x32", Shape("nixl", "get", BLOCK, 32), Shape("shm", "get", BLOCK, 32), None),
    # The transport's own ceiling here, and kvpool's share of it.
    ("cma / memcpy, 384 KiB READ x1", Shape("cma", "get", BLOCK, 1), Shape("memcpy", "get", BLOCK, 1), None),
    ("cma / memcpy, 384 KiB READ x32", Shape("cma", "get", BLOCK, 32), Shape("memcpy", "get", BLOCK, 32), None),
    ("cma / memcpy, 384 KiB WRITE x32", Shape("cma", "put", BLOCK, 32), Shape("memcpy", "get", BLOCK, 32), None),
    ("nixl / cma, 384 KiB get x1", Shape("nixl", "get", BLOCK, 1), Shape("cma", "get", BLOCK, 1), None),
    ("nixl / cma, 384 KiB get x32", Shape("nixl", "get", BLOCK, 32), Shape("cma", "get", BLOCK, 32), None),
    ("nixl / cma, 384 KiB put x32", Shape("nixl", "put", BLOCK, 32), Shape("cma", "put", BLOCK, 32), None),
)


@dataclass(frozen=True, slots=True)
class Cell:
    shape: Shape
    gbps: float
    ops: int
    client_s_per_gb: float  # the client's CPU seconds per GB moved
    daemon_s_per_gb: float | None  # the daemon's (None: memcpy has none)


@dataclass(frozen=True, slots=True)
class Job:
    shape: Shape
    address: str
    working_set: int
    duration_s: float


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per cell")
    parser.add_argument("--working-set", type=int, default=96, help="MiB each get cell reads (cache-cold)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every cell, alternating order")
    parser.add_argument("--capacity", default="2GiB", help="the daemon's DRAM arena")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    return parser.parse_args(argv)


def worker(job: Job, barrier: mp.synchronize.Barrier, results: mp.Queue) -> None:
    """One client: its blocks stored (gets) or made (puts), then ops for the duration, then a check."""
    shape = job.shape
    per_op = shape.block * shape.batch
    rounds = max(2, job.working_set // per_op)
    data = page_aligned(rounds * per_op)
    data[:] = np.random.default_rng(int.from_bytes(os.urandom(8), "little")).integers(0, 256, len(data), np.uint8)
    blocks = [data[i * shape.block : (i + 1) * shape.block] for i in range(rounds * shape.batch)]
    targets = [page_aligned(shape.block) for _ in range(shape.batch)]
    run, check, close = _operations(job, blocks, targets)
    for index in range(rounds):  # warm: connections, pages, the node's agent
        run(index)
    barrier.wait()
    started, done, cpu = time.perf_counter(), 0, time.process_time_ns()
    while time.perf_counter() - started < job.duration_s:
        run(done % rounds)
        done += 1
    elapsed, cpu = time.perf_counter() - started, time.process_time_ns() - cpu
    ok = check()
    results.put((done * per_op, elapsed, done, cpu, ok))
    barrier.wait()  # the parent has sampled the daemon
    close()


def _operations(job: Job, blocks: list[np.ndarray], targets: list[np.ndarray]):  # type: ignore[no-untyped-def]
    """(run(index), check(), close()) of the job's cell."""
    shape, batch = job.shape, job.shape.batch
    if shape.system == "memcpy":

        def copy(index: int) -> None:
            for target, source in zip(targets, blocks[index * batch : (index + 1) * batch], strict=True):
                np.copyto(target, source)

        def copied() -> bool:
            copy(1)
            return all(np.array_equal(t, s) for t, s in zip(targets, blocks[batch : 2 * batch], strict=True))

        return copy, copied, lambda: None
    if shape.system == "cma":
        return _bare_transfers(job, blocks, targets)
    client = KVPoolClient(config=ClientConfig(nodes=(job.address,), transport=shape.system))
    if client.transport(job.address) != shape.system:
        raise RuntimeError(f"asked for {shape.system}, negotiated {client.transport(job.address)}")
    for buffer in (*targets, blocks[0].base if blocks[0].base is not None else blocks[0]):
        client.register(buffer)  # an engine registers its cache once (used by nixl only)
    namespace = "bench@u8@raw"
    if shape.op == "get":
        keys = [BlockKey(namespace, os.urandom(32)) for _ in blocks]
        for start in range(0, len(keys), 32):
            if client.put(keys[start : start + 32], blocks[start : start + 32]).stored != len(keys[start : start + 32]):
                raise RuntimeError("put failed: is the arena large enough for the working set?")

        def get(index: int) -> None:
            result = client.get(keys[index * batch : (index + 1) * batch], targets)
            if result.hits != batch:
                raise RuntimeError(f"get hit {result.hits}/{batch}: {result.statuses[:3]}")

        def got() -> bool:
            get(1)
            return all(np.array_equal(t, s) for t, s in zip(targets, blocks[batch : 2 * batch], strict=True))

        return get, got, client.close
    fresh = (BlockKey(namespace, os.urandom(24) + n.to_bytes(8, "little")) for n in itertools.count())
    last: list[BlockKey] = []

    def put(index: int) -> None:
        last[:] = [next(fresh) for _ in range(batch)]
        result = client.put(last, blocks[index * batch : (index + 1) * batch])
        if result.stored != batch:
            raise RuntimeError(f"put stored {result.stored}/{batch}: {result.statuses[:3]}")

    def stored() -> bool:
        put(1)
        got = client.get(last, targets)
        return got.hits == batch and all(
            np.array_equal(t, s) for t, s in zip(targets, blocks[batch : 2 * batch], strict=True)
        )

    return put, stored, client.close


def _bare_transfers(job: Job, blocks: list[np.ndarray], targets: list[np.ndarray]):  # type: ignore[no-untyped-def]
    """The one READ (get) or WRITE (put) per batch that a nixl get or put makes, and nothing else:
    places located (gets) or slots reserved (puts, never committed) once, untimed."""
    shape, batch = job.shape, job.shape.batch
    client = KVPoolClient(config=ClientConfig(nodes=(job.address,), transport="tcp"))
    data = client.server_info(job.address).data_endpoints["tcp"]
    raw = RawConnection(data)
    local = LocalAgent(30.0)
    for buffer in (*targets, blocks[0].base if blocks[0].base is not None else blocks[0]):
        local.register(memoryview(buffer).cast("B"))  # registered, as a nixl client's are
    arena = RemoteArena(local)
    peer = raw.request(PeerRequest(1)).message
    assert isinstance(peer, PeerResponse)
    arena.connect(peer)
    namespace = "bench@u8@raw"
    if shape.op == "get":
        keys = [BlockKey(namespace, os.urandom(32)) for _ in blocks]
        client.put(keys, blocks).raise_for_errors()
        located = []
        for start in range(0, len(keys), batch):
            answer = raw.request(LocateRequest(2, namespace, [k.hash for k in keys[start : start + batch]])).message
            assert isinstance(answer, LocateResponse)
            places = zip(answer.offsets, answer.lengths, answer.generations, strict=True)
            located.append([SlotLocation(o, n, g) for o, n, g in places])

        def read(index: int) -> None:
            arena.copy_all(list(zip(located[index], map(memoryview, targets), strict=True)))

        def got() -> bool:
            read(1)
            return all(np.array_equal(t, s) for t, s in zip(targets, blocks[batch : 2 * batch], strict=True))

        return read, got, lambda: (raw.close(), arena.close(), client.close())
    keys = [BlockKey(namespace, os.urandom(32)) for _ in range(batch)]
    reserved = raw.request(ReserveRequest(3, namespace, [k.hash for k in keys], [shape.block] * batch)).message
    assert isinstance(reserved, ReserveResponse) and set(reserved.statuses) == {0}, reserved
    views = [memoryview(b) for b in blocks]

    def write(index: int) -> None:
        arena.write_all(list(zip(reserved.offsets, views[index * batch : (index + 1) * batch], strict=True)))

    def written() -> bool:
        write(1)
        slots = zip(reserved.offsets, targets, strict=True)
        arena.copy_all([(SlotLocation(offset, shape.block, 0), memoryview(t)) for offset, t in slots])
        return all(np.array_equal(t, s) for t, s in zip(targets, blocks[batch : 2 * batch], strict=True))

    return write, written, lambda: (raw.close(), arena.close(), client.close())


def run_cell(job: Job, daemon_pid: int) -> Cell:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    process = ctx.Process(target=worker, args=(job, barrier, results))
    process.start()
    barrier.wait(timeout=180)
    daemon_ns = process_cpu_ns(daemon_pid)
    nbytes, elapsed, ops, cpu_ns, ok = results.get(timeout=180 + job.duration_s)
    daemon_ns = process_cpu_ns(daemon_pid) - daemon_ns  # the untimed check included: a small overcount
    barrier.wait(timeout=60)
    process.join(60)
    if not ok:
        raise RuntimeError(f"{job.shape.name}: wrong bytes")
    gb = nbytes / 1e9
    daemon = None if job.shape.system == "memcpy" else daemon_ns / 1e9 / gb
    return Cell(job.shape, gb / elapsed, ops, cpu_ns / 1e9 / gb, daemon)


def median_cells(rounds: list[list[Cell]]) -> list[Cell]:
    """Each shape's median over the rounds."""
    out = []
    for shape in SHAPES:
        cells = [c for r in rounds for c in r if c.shape == shape]
        daemon = [c.daemon_s_per_gb for c in cells if c.daemon_s_per_gb is not None]
        out.append(
            Cell(
                shape,
                statistics.median(c.gbps for c in cells),
                sum(c.ops for c in cells),
                statistics.median(c.client_s_per_gb for c in cells),
                statistics.median(daemon) if daemon else None,
            )
        )
    return out


def ratio_lines(rounds: list[list[Cell]]) -> list[str]:
    lines = []
    for label, top, bottom, target in TARGETS:
        per_round = []
        for cells in rounds:
            by = {c.shape: c.gbps for c in cells}
            per_round.append(by[top] / by[bottom])
        value = statistics.median(per_round)
        verdict = "" if target is None else f"  (target >= {target}: {'met' if value >= target else 'NOT met'})"
        spread = ", ".join(f"{r:.2f}" for r in per_round)
        lines.append(f"{label}: {value:.2f} [rounds: {spread}]{verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    daemon = start_daemon(
        "--dram-capacity", args.capacity, "--slab-size", "4MiB", "--metrics-port", "-1", "--nixl-enabled"
    )
    rounds: list[list[Cell]] = []
    try:
        for number in range(args.rounds):
            order = SHAPES if number % 2 == 0 else tuple(reversed(SHAPES))
            cells = []
            for shape in order:
                job = Job(shape, daemon.address, args.working_set * MiB, args.duration)
                cell = run_cell(job, daemon.process.pid)
                cells.append(cell)
                d = "-" if cell.daemon_s_per_gb is None else f"{cell.daemon_s_per_gb:.4f}"
                print(
                    f"round {number + 1} {shape.name:28} {cell.gbps:6.2f} GB/s  "
                    f"client {cell.client_s_per_gb:.3f} CPU-s/GB  daemon {d} CPU-s/GB",
                    flush=True,
                )
            rounds.append(cells)
    finally:
        daemon.stop()
        daemon.remove_files()
    medians = median_cells(rounds)
    print(f"\nmedians of {args.rounds} rounds (UCX_TLS={os.environ.get('UCX_TLS', 'UCX default')}):")
    for cell in medians:
        d = "-" if cell.daemon_s_per_gb is None else f"{cell.daemon_s_per_gb:.4f}"
        print(f"  {cell.shape.name:28} {cell.gbps:6.2f} GB/s  client {cell.client_s_per_gb:.3f}  daemon {d} CPU-s/GB")
    lines = ratio_lines(rounds)
    print("\nratios (median of per-round ratios):")
    for line in lines:
        print(f"  {line}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "one_sided.json"
    out.write_text(
        json.dumps(
            {
                "ucx_tls": os.environ.get("UCX_TLS", ""),
                "rounds": [[asdict(c) for c in r] for r in rounds],
                "medians": [asdict(c) for c in medians],
                "ratios": lines,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
