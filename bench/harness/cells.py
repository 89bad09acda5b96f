"""Result cells: what each worker measured, and one cell's summary over its workers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.harness.workload import CellSpec


@dataclass(frozen=True, slots=True)
class WorkerResult:
    """One worker's timed part of a cell.

    Attributes:
        latencies_ns: duration of each op, in order.
        bursts: (start, end) ``perf_counter_ns`` of each burst; the clock is
            system-wide, so bursts of different workers line up.
    """

    ops: int
    nbytes: int
    latencies_ns: np.ndarray
    bursts: list[tuple[int, int]]
    cpu_ns: int  # this client's CPU time (user + kernel) inside the timed bursts
    server_cpu_ns: int | None  # the server's, over the same bursts (worker 0 only measures it)


@dataclass(frozen=True, slots=True)
class Cell:
    """One row of the results; metrics are ``None`` when the cell could not run."""

    system: str
    op: str
    block_size: int
    batch: int
    clients: int
    gbps: float | None = None  # 1e9 bytes per second, all clients together
    ops_per_s: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    client_cpu_us: float | None = None  # CPU per op, all clients: user + kernel
    server_cpu_us: float | None = None  # CPU per op of the server process
    ops: int = 0
    seconds: float = 0.0  # timed wall time (bursts only; verification excluded)
    foreign_cores: float | None = None  # CPU used by other processes meanwhile: noise
    attempts: int = 1  # runs of this cell; the least disturbed one is kept
    error: str | None = None
    dest_offset: int = 0  # get destinations' offset from a page (see CellSpec)

    @property
    def ok(self) -> bool:
        return self.error is None


def summarize(spec: CellSpec, results: list[WorkerResult]) -> Cell:
    """Aggregate the workers of one cell.

    Throughput divides all bytes by the timed wall time: for each burst, from the
    first worker's start to the last worker's end (all workers run the same bursts,
    fenced by a barrier), summed over bursts.
    """
    seconds = _timed_wall_ns(results) / 1e9
    ops = sum(r.ops for r in results)
    latencies = np.concatenate([r.latencies_ns for r in results]) / 1e3
    server_ns = [r.server_cpu_ns for r in results if r.server_cpu_ns is not None]
    return Cell(
        spec.system,
        spec.op,
        spec.block_size,
        spec.batch,
        spec.clients,
        gbps=sum(r.nbytes for r in results) / seconds / 1e9,
        ops_per_s=ops / seconds,
        p50_us=float(np.percentile(latencies, 50)),
        p99_us=float(np.percentile(latencies, 99)),
        client_cpu_us=sum(r.cpu_ns for r in results) / ops / 1e3,
        server_cpu_us=sum(server_ns) / ops / 1e3 if server_ns else None,
        ops=ops,
        seconds=seconds,
        dest_offset=spec.dest_offset,
    )


def missing(spec: CellSpec, error: str) -> Cell:
    shape = (spec.system, spec.op, spec.block_size, spec.batch, spec.clients)
    return Cell(*shape, error=error, dest_offset=spec.dest_offset)


def _timed_wall_ns(results: list[WorkerResult]) -> int:
    bursts = zip(*(r.bursts for r in results), strict=True)
    return sum(max(end for _, end in burst) - min(start for start, _ in burst) for burst in bursts)
