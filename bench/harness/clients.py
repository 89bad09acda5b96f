"""Client worker processes: spawned once, synchronized per burst, told cell by cell what to run.

A cell runs in *bursts*. Each burst every worker runs ``burst_ops`` ops back to back
(timed, per op), then all meet at a barrier and verify what they read (untimed), so
verification never overlaps another worker's timed ops. Worker 0 decides after each
burst whether the cell's time is up; the decision is read by all after the next
barrier, so every worker runs the same number of bursts.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from typing import Any

import numpy as np
import xxhash

from bench.harness.cells import WorkerResult
from bench.harness.drivers import BenchError, Driver, open_driver
from bench.harness.machine import process_cpu_ns
from bench.harness.procs import ignore_sigint, start_shielded
from bench.harness.workload import BlockRef, CellSpec, Plan, TargetRing, poison

BARRIER_TIMEOUT_S = 120.0
WARMUP_OPS = 1  # op indices below this run untimed before the bursts
_REPLY_SLACK_S = 120.0  # preload, verification and clean-up on top of a cell's duration
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters

OpStep = Callable[[int], Any]


class CellFailed(RuntimeError):
    """A worker raised while running a cell; the message carries its traceback."""


class WorkerPool:
    """``size`` client processes (spawn context) sharing one barrier and one stop flag.

    Raises:
        CellFailed: from :meth:`run` when any worker fails the cell.
    """

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.size = size
        self._barrier = ctx.Barrier(size)
        self._stop = ctx.Value("b", 0)
        self.broken = False  # a worker missed its reply: its pipe may hold a stale answer
        self._pipes: list[Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        for index in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=worker_main, args=(index, child, self._barrier, self._stop), name=f"bench-client-{index}"
            )
            start_shielded(proc)
            child.close()
            self._pipes.append(parent)
            self._procs.append(proc)

    def run(self, spec: CellSpec) -> list[WorkerResult]:
        """Run one cell on every worker and return their results, in worker order."""
        if self.broken:
            raise CellFailed("worker pool is broken by an earlier timeout")
        self._stop.value = 0
        for pipe in self._pipes:
            pipe.send(("run", spec))
        replies = [self._reply(pipe, spec.duration_s + _REPLY_SLACK_S) for pipe in self._pipes]
        errors = [payload for kind, payload in replies if kind == "error"]
        if errors:
            self._barrier.reset()
            raise CellFailed(errors[0])
        return [payload for _, payload in replies]

    def close(self, timeout: float = 10.0) -> None:
        """Stop every worker: abort a cell in progress, ask them to exit, then terminate stragglers."""
        self._barrier.abort()
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(("exit", None))
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for pipe in self._pipes:
            pipe.close()

    def _reply(self, pipe: Connection, timeout: float) -> tuple[str, Any]:
        if not pipe.poll(timeout):
            self._barrier.abort()
            self.broken = True
            return "error", f"no reply within {timeout:.0f}s"
        try:
            reply: tuple[str, Any] = pipe.recv()
        except EOFError:
            return "error", "worker process died"
        return reply


class Pools:
    """One :class:`WorkerPool` per client count; a pool broken by a hung worker is replaced."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        self._pools: dict[int, WorkerPool] = {}
        try:
            for size in sizes:
                self._pools[size] = WorkerPool(size)
        except BaseException:
            self.close()
            raise

    def run(self, spec: CellSpec) -> list[WorkerResult]:
        """Run ``spec`` on the pool of ``spec.clients`` workers.

        Raises:
            CellFailed: a worker failed or hung (the hung pool is then replaced).
        """
        pool = self._pools[spec.clients]
        try:
            return pool.run(spec)
        finally:
            if pool.broken:
                pool.close()
                self._pools[spec.clients] = WorkerPool(spec.clients)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()

    def __enter__(self) -> Pools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- inside a worker process ---------------------------------------------------


def worker_main(index: int, pipe: Connection, barrier: threading.Barrier, stop: Synchronized[int]) -> None:
    """Serve ``("run", CellSpec)`` commands until ``("exit", None)``; never raises."""
    ignore_sigint()  # the parent owns Ctrl-C and shuts workers down
    _keep_values_in_heap()
    worker = _Worker(index, barrier, stop)
    try:
        while True:
            kind, spec = pipe.recv()
            if kind == "exit":
                return
            try:
                pipe.send(("ok", worker.run(spec)))
            except Exception:
                barrier.abort()  # release the others at once instead of at the barrier timeout
                pipe.send(("error", f"worker {index}: {traceback.format_exc()}"))
                worker.close()  # a failed connection must not carry over to the next cell
    except (EOFError, OSError):
        return  # the parent went away
    finally:
        worker.close()


class _Worker:
    """One client process's state across cells: connections and destination buffers."""

    def __init__(self, index: int, barrier: threading.Barrier, stop: Synchronized[int]) -> None:
        self.index = index
        self._barrier = barrier
        self._stop = stop
        self._ring = TargetRing()
        self._drivers: dict[tuple[str, str], Driver] = {}

    def run(self, spec: CellSpec) -> WorkerResult:
        """Store a get cell's working set, warm up, run the timed bursts, clean up."""
        driver = self._driver(spec)
        plan = Plan(spec, self.index)
        ops = 0
        try:
            if spec.op == "get":
                _store(driver, plan, plan.working_set())
            _warm_up(driver, plan, self._ring)
            result = self._bursts(driver, plan)
            ops = result.ops
            if spec.op == "put" and driver.stores:
                _read_back(driver, plan, WARMUP_OPS + ops, self._ring)
            return result
        finally:
            driver.forget(plan.written(WARMUP_OPS + ops))

    def close(self) -> None:
        """Close every connection; the next cell opens fresh ones."""
        drivers, self._drivers = list(self._drivers.values()), {}
        for driver in drivers:
            with contextlib.suppress(Exception):
                driver.close()

    def _driver(self, spec: CellSpec) -> Driver:
        slot = (spec.system, spec.endpoint)
        if slot not in self._drivers:
            self._drivers[slot] = open_driver(spec.system, spec.endpoint, self.index)
        return self._drivers[slot]

    def _bursts(self, driver: Driver, plan: Plan) -> WorkerResult:
        spec = plan.spec
        log = _BurstLog(spec.server_pids if self.index == 0 else None)
        started = 0.0
        while True:
            first = WARMUP_OPS + len(log.spans) * spec.burst_ops
            refs = [plan.refs(first + i) for i in range(spec.burst_ops)]
            step = _op_step(driver, plan, refs, self._ring.slots(spec, len(log.spans)))
            self._barrier.wait(BARRIER_TIMEOUT_S)  # everyone prepared; last burst's decision visible
            started = started or time.monotonic()
            if self._stop.value:
                break
            outputs = log.run(step, spec.burst_ops)
            self._barrier.wait(BARRIER_TIMEOUT_S)  # everyone done: verification overlaps no timed op
            log.all_done()
            if spec.op != "put":
                _verify(plan, refs, outputs)
            if self.index == 0:
                self._stop.value = int(time.monotonic() - started >= spec.duration_s)
        return log.result(spec)


@dataclass(slots=True)
class _BurstLog:
    """What one worker measured over a cell's bursts.

    Attributes:
        server_pids: the server's processes, whose CPU time this worker samples (worker 0 only).
    """

    server_pids: tuple[int, ...] | None
    latencies: list[np.ndarray] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    cpu_ns: int = 0
    server_ns: int = 0
    _server_mark: int = 0

    def run(self, step: OpStep, count: int) -> list[Any]:
        """Time one burst of ``count`` ops; returns what each op returned."""
        if self.server_pids:
            self._server_mark = _cpu_ns(self.server_pids)
        cpu_start = time.process_time_ns()
        latencies, outputs, span = _timed_burst(step, count)
        self.cpu_ns += time.process_time_ns() - cpu_start
        self.latencies.append(latencies)
        self.spans.append(span)
        return outputs

    def all_done(self) -> None:
        """Every client has finished the burst: close the server's CPU window."""
        if self.server_pids:
            self.server_ns += _cpu_ns(self.server_pids) - self._server_mark

    def result(self, spec: CellSpec) -> WorkerResult:
        ops = len(self.spans) * spec.burst_ops
        server_ns = self.server_ns if self.server_pids else None
        return WorkerResult(
            ops, ops * spec.op_bytes, np.concatenate(self.latencies), self.spans, self.cpu_ns, server_ns
        )


def _cpu_ns(pids: tuple[int, ...]) -> int:
    return sum(process_cpu_ns(pid) for pid in pids)


def _op_step(driver: Driver, plan: Plan, refs: list[list[BlockRef]], targets: list[list[np.ndarray]]) -> OpStep:
    """The timed call for op ``i`` of a burst; requests and sources are built here, untimed."""
    size = plan.spec.block_size
    requests = [driver.prepare(r, size) for r in refs]
    if plan.spec.op == "put":
        sources = [plan.sources(r) for r in refs]
        return lambda i: driver.put(requests[i], sources[i])
    poison(targets)
    return lambda i: driver.get(requests[i], targets[i])


def _timed_burst(step: OpStep, count: int) -> tuple[np.ndarray, list[Any], tuple[int, int]]:
    latencies = np.empty(count, dtype=np.int64)
    outputs: list[Any] = [None] * count
    clock = time.perf_counter_ns
    start = clock()
    for i in range(count):
        t0 = clock()
        outputs[i] = step(i)
        latencies[i] = clock() - t0
    return latencies, outputs, (start, clock())


def _verify(plan: Plan, refs: list[list[BlockRef]], outputs: list[Any]) -> None:
    """Check every block read against the checksum of the bytes it was written from.

    Raises:
        BenchError: a block's bytes differ.
    """
    for op_refs, buffers in zip(refs, outputs, strict=True):
        for ref, buffer in zip(op_refs, buffers, strict=True):
            if xxhash.xxh3_64_intdigest(buffer) != plan.expected(ref):
                raise BenchError(f"{plan.spec.system}: wrong bytes for key {ref.key.hex()} (worker {plan.worker})")


def _warm_up(driver: Driver, plan: Plan, ring: TargetRing) -> None:
    """One untimed op first: connection set-up and first touches stay out of the numbers."""
    refs = [plan.refs(i) for i in range(WARMUP_OPS)]
    targets = ring.slots(plan.spec, 0)
    step = _op_step(driver, plan, refs, targets)
    outputs = [step(i) for i in range(WARMUP_OPS)]
    if plan.spec.op != "put":
        _verify(plan, refs, outputs)


def _store(driver: Driver, plan: Plan, refs: list[BlockRef]) -> None:
    """Put ``refs`` untimed, in batches (the working set of a get cell)."""
    batch = 32
    for start in range(0, len(refs), batch):
        chunk = refs[start : start + batch]
        driver.put(driver.prepare(chunk, plan.spec.block_size), plan.sources(chunk))


def _read_back(driver: Driver, plan: Plan, ops: int, ring: TargetRing) -> None:
    """After a put cell, read the last burst's blocks back and verify them (untimed)."""
    spec = plan.spec
    first = max(WARMUP_OPS, ops - spec.burst_ops)
    refs = [plan.refs(i) for i in range(first, ops)]
    targets = ring.slots(spec, 0)
    poison(targets)
    outputs = [driver.get(driver.prepare(r, spec.block_size), t) for r, t in zip(refs, targets, strict=False)]
    _verify(plan, refs, outputs)


def _keep_values_in_heap() -> None:
    """Fix glibc's mmap and trim thresholds for this worker (no-op without glibc).

    Redis hands every value back as a new bytes object. With glibc's dynamic
    thresholds a worker's heap was in some runs trimmed and faulted in again on
    every get, which doubled Redis's client CPU in those runs only. Fixed thresholds
    keep such values in the heap: the baseline at its best in every run (kvpool and
    the raw socket allocate nothing per call).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 16 << 20)
    libc.mallopt(_M_TRIM_THRESHOLD, 256 << 20)
