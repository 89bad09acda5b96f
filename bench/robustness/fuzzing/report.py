"""The fuzz run's report: what both fuzzers and the good client saw, the daemon's fate and memory."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from bench.robustness.fuzzing.good_client import GoodTally
from bench.robustness.fuzzing.tally import Tally
from bench.robustness.fuzzing.target import Memory
from tests.support.daemon import DaemonProcess

if TYPE_CHECKING:
    from bench.robustness.fuzzing.run import FuzzSettings


@dataclass
class FuzzReport:
    settings: dict
    seconds: float
    data_plane: dict
    grpc: dict
    cases_sent: int
    outcomes: dict[str, int]
    hangs: int
    hang_samples: list[str]
    fuzzer_failures: list[str]
    bad_responses: list[str]
    daemon_crashes: int
    daemon_exit: int | None
    handler_exceptions: int
    grpc_handler_errors: int
    alive_after: bool
    memory_before: dict
    memory_peak: dict
    memory_after: dict
    good_client: dict
    heap_timeline_kib: list[tuple[float, int]] = field(default_factory=list)  # (seconds, anon KiB)
    heap_growth_second_half_kib: int = 0


def _grpc_handler_errors(grpc_tally: dict) -> int:
    """Calls answered UNKNOWN or INTERNAL: something raised instead of rejecting the input.

    Typed-but-hostile messages and raw bytes that do not parse alike must get
    INVALID_ARGUMENT (see :mod:`kvpool_server.control.malformed`).
    """
    kinds = grpc_tally.get("kinds", {})
    return sum(n for k, n in kinds.items() if k.endswith((":unknown", ":internal")))


def _tracebacks(log: str) -> int:
    return log.count("Traceback") + log.count("connection handler failed")


def build_report(settings: FuzzSettings, daemon: DaemonProcess, results: dict[str, dict], took: float, alive: bool,
                 memory: tuple[Memory, Memory, Memory], good: GoodTally) -> FuzzReport:  # fmt: skip
    total = Tally()
    for tally in results.values():
        if "failed" not in tally:
            total.merge(tally)
    crashed = daemon.process.poll() is not None
    failed = [f"{name} fuzzer failed: {results[name].get('failed', 'no report')}" for name in ("data", "grpc")
              if "failed" in results.get(name, {"failed": "no report"})]  # fmt: skip
    return FuzzReport(
        settings=asdict(settings), seconds=took,
        data_plane=results.get("data", {}), grpc=results.get("grpc", {}),
        cases_sent=total.sent, outcomes=dict(total.outcomes),
        hangs=total.outcomes.get("hang", 0), hang_samples=total.hangs[:20], fuzzer_failures=failed,
        bad_responses=total.bad_responses[:20],
        daemon_crashes=int(crashed), daemon_exit=daemon.process.returncode,
        handler_exceptions=_tracebacks(daemon.log()), alive_after=alive,
        grpc_handler_errors=_grpc_handler_errors(results.get("grpc", {})),
        memory_before=asdict(memory[0]), memory_peak=asdict(memory[1]), memory_after=asdict(memory[2]),
        good_client=asdict(good),
    )  # fmt: skip


def _mib(m: dict) -> str:
    return f"rss {m['rss_kib'] / 1024:.0f} MiB (anon {m['anon_kib'] / 1024:.0f}, arena {m['shmem_kib'] / 1024:.0f})"


def print_report(report: FuzzReport) -> None:
    print(f"fuzz: {report.cases_sent} cases in {report.seconds:.1f} s "
          f"({report.cases_sent / max(report.seconds, 1e-9):.0f}/s)")  # fmt: skip
    for name in ("data_plane", "grpc"):
        outcomes = getattr(report, name).get("outcomes", {})
        listed = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        print(f"  {name:10s} {sum(outcomes.values()):7d} cases: {listed}")
    print(f"  daemon crashes {report.daemon_crashes}, hangs {report.hangs}, undecodable answers "
          f"{len(report.bad_responses)}, unhandled exceptions in log {report.handler_exceptions}, "
          f"gRPC calls answered UNKNOWN/INTERNAL {report.grpc_handler_errors}, "
          f"alive after {report.alive_after}")  # fmt: skip
    print(f"  daemon memory: before {_mib(report.memory_before)}; peak {_mib(report.memory_peak)}; "
          f"after {_mib(report.memory_after)}; heap growth over the second half of the run "
          f"{report.heap_growth_second_half_kib / 1024:.1f} MiB")  # fmt: skip
    g = report.good_client
    print(f"  good client: {g['puts']} puts, {g['gets']} gets, {g['bytes_verified'] / 2**20:.0f} MiB verified, "
          f"{g['wrong_bytes']} wrong, {g['misses']} misses, {g['refused_draining']} refused while drained, "
          f"{g['errors']} errors")  # fmt: skip
    for sample in report.fuzzer_failures + report.hang_samples + report.bad_responses + g["error_samples"]:
        print(f"    ! {sample[:300]}")
