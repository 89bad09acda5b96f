"""One fuzz run: a daemon, the two fuzzer processes and the good client at once.

The daemon's memory is sampled throughout; everything started is stopped at the end.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.robustness.fuzzing.control import grpc_fuzzer
from bench.robustness.fuzzing.dataplane import data_fuzzer
from bench.robustness.fuzzing.good_client import GoodClient
from bench.robustness.fuzzing.report import FuzzReport, build_report
from bench.robustness.fuzzing.target import DAEMON_FLAGS, Memory, answers_both_planes
from tests.support.daemon import DaemonProcess, start_daemon


@dataclass(frozen=True, slots=True)
class FuzzSettings:
    """One run's shape: cases over both planes, a time limit, concurrency and the hang timeout."""

    cases: int = 100_000
    seconds: float = 600.0
    seed: int = 1
    lanes: int = 192
    grpc_share: float = 0.15
    hang_timeout: float = 5.0


def _spawn_fuzzers(daemon: DaemonProcess, settings: FuzzSettings) -> tuple[list[mp.Process], mp.Queue]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    grpc_cases = int(settings.cases * settings.grpc_share)
    data_args = (daemon.data_address, settings.cases - grpc_cases, settings.seconds, settings.seed,
                 settings.lanes, settings.hang_timeout, out)  # fmt: skip
    grpc_args = (daemon.address, grpc_cases, settings.seconds, settings.seed + 1, settings.hang_timeout, out)
    procs = [ctx.Process(target=data_fuzzer, args=data_args), ctx.Process(target=grpc_fuzzer, args=grpc_args)]
    for proc in procs:
        proc.start()
    return procs, out


def _collect(
    procs: list[mp.Process], out: mp.Queue, daemon: DaemonProcess, limit_s: float, timeline: list[tuple[float, int]]
) -> tuple[dict, Memory]:
    """Wait for both fuzzers' tallies, sampling the daemon's memory into ``timeline``; stops early if it dies."""
    results: dict[str, dict] = {}
    peak, started = Memory(), time.monotonic()
    deadline = time.monotonic() + limit_s
    while len(results) < len(procs) and time.monotonic() < deadline and daemon.process.poll() is None:
        try:
            name, tally = out.get(timeout=0.5)
            results[name] = tally
        except Exception:
            pass
        now = Memory.of(daemon.process.pid) if daemon.process.poll() is None else peak
        timeline.append((round(time.monotonic() - started, 1), now.anon_kib))
        peak = Memory(
            max(peak.rss_kib, now.rss_kib), max(peak.anon_kib, now.anon_kib), max(peak.shmem_kib, now.shmem_kib)
        )
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    return results, peak


def run_fuzz(settings: FuzzSettings) -> FuzzReport:
    """Start a daemon, fuzz it as configured, and report. Everything started is stopped."""
    shm = Path(tempfile.mkdtemp(prefix="kvfuzz-", dir="/dev/shm"))
    try:
        daemon = start_daemon(*DAEMON_FLAGS, "--shm-dir", str(shm))
    except BaseException:
        shutil.rmtree(shm, ignore_errors=True)
        raise
    good = GoodClient(daemon.address, settings.seed + 2)
    procs: list[mp.Process] = []
    try:
        good.start()
        time.sleep(0.5)  # the good client's working set is in before the abuse starts
        before, started = Memory.of(daemon.process.pid), time.monotonic()
        procs, out = _spawn_fuzzers(daemon, settings)
        timeline: list[tuple[float, int]] = []
        results, peak = _collect(procs, out, daemon, settings.seconds + 60, timeline)
        took = time.monotonic() - started
        time.sleep(1.0)  # the good client runs on briefly after the abuse
        good.stop_event.set()
        good.join(15)
        alive = answers_both_planes(daemon)
        after = Memory.of(daemon.process.pid) if daemon.process.poll() is None else Memory()
        report = build_report(settings, daemon, results, took, alive, (before, peak, after), good.tally)
        report.heap_timeline_kib = timeline[:: max(1, len(timeline) // 20)]
        half = timeline[len(timeline) // 2][1] if timeline else 0
        report.heap_growth_second_half_kib = (timeline[-1][1] - half) if timeline else 0
        return report
    finally:
        good.stop_event.set()
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        daemon.stop()
        daemon.remove_files()
        shutil.rmtree(shm, ignore_errors=True)
