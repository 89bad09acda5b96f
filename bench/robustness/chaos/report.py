"""The soak's report: throughput per fault window against the baseline, and every verdict's count."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.robustness.chaos.clients import WorkerResult
from bench.robustness.chaos.cluster import SoakCluster, Window
from bench.robustness.chaos.settings import SoakSettings
from bench.robustness.chaos.verdicts import classify_run_misses, crashes


@dataclass
class WindowRow:
    fault: str
    target: str
    seconds: float
    ok_ops_per_s: float
    ratio_to_baseline: float
    misses: int
    unreached: int
    note: str = ""


def window_rows(windows: list[Window], baseline: Window, events: list[tuple]) -> list[WindowRow]:
    def rate(w: Window) -> tuple[float, int, int]:
        rows = [e for e in events if w.start <= e[0] < w.end]
        span = max(w.end - w.start, 1e-9)
        return sum(e[3] for e in rows) / span, sum(e[4] for e in rows), sum(e[5] for e in rows)

    base_rate, base_miss, base_unreached = rate(baseline)
    out = [WindowRow(baseline.fault, "-", baseline.end - baseline.start, base_rate, 1.0, base_miss, base_unreached)]
    for w in windows:
        ops, misses, unreached = rate(w)
        ratio = ops / base_rate if base_rate else 0.0
        out.append(WindowRow(w.fault, w.target, w.end - w.start, ops, ratio, misses, unreached, w.note))
    return out


def build_report(settings: SoakSettings, cluster: SoakCluster, results: list[WorkerResult], baseline: Window,
                 final: dict, evicted: dict[str, int], alive: dict[str, bool], settled: bool) -> dict:  # fmt: skip
    events = sorted(e for r in results for e in r.events)
    kills = {n.name: n.killed_at for n in cluster.nodes}
    acked = [a for r in results for a in r.acked]
    unexpected, tracebacks, samples = crashes(cluster)
    rows = window_rows(cluster.windows, baseline, events)
    return {
        "settings": asdict(settings),
        "disk_fault": "applied" if any(w.fault == "disk full" for w in cluster.windows)
        else f"skipped: {cluster.disk_skip_reason or 'no time left'}",
        "requests": len(events), "block_ops_ok": sum(e[3] for e in events),
        "acked_blocks": len(acked), "puts_below_quorum": sum(r.below_quorum for r in results),
        "verified_before_delete": sum(r.verified_before_delete for r in results),
        "suspects": sum(len(r.suspects) for r in results),
        "deletes_unreached": sum(r.deletes_unreached for r in results),
        "wrong_bytes": sum(e[6] for e in events) + final["wrong_bytes"],
        "wrong_bytes_during_run": sum(e[6] for e in events),
        "lost_blocks": final["lost"], "final_check": final,
        "misses_during_run": classify_run_misses(results, acked, kills, cluster.windows),
        "unexpected_crashes": unexpected + sum(1 for ok in alive.values() if not ok),
        "daemons_alive_at_end": alive, "membership_settled": settled,
        "tracebacks_in_logs": tracebacks, "crash_samples": samples[:6],
        "client_exceptions": sum(len(r.exceptions) for r in results),
        "client_exception_samples": [x for r in results for x in r.exceptions][:10],
        "dram_evictions": evicted,
        "windows": [asdict(r) for r in rows],
    }  # fmt: skip


def print_report(report: dict) -> None:
    print(f"soak: {report['requests']} requests, {report['block_ops_ok']} block ops ok, "
          f"{report['acked_blocks']} blocks acknowledged on 2 nodes ({report['verified_before_delete']} read back "
          f"before their delete, the rest checked at the end), "
          f"{report['puts_below_quorum']} puts below quorum")  # fmt: skip
    print(f"{'fault':22s} {'target':8s} {'secs':>6s} {'ok ops/s':>9s} {'vs base':>8s} {'misses':>7s} {'unreached':>9s}")
    for w in report["windows"]:
        print(f"{w['fault']:22s} {w['target']:8s} {w['seconds']:6.1f} {w['ok_ops_per_s']:9.1f} "
              f"{w['ratio_to_baseline']:8.2f} {w['misses']:7d} {w['unreached']:9d}  {w['note']}")  # fmt: skip
    final = report["final_check"]
    print(f"wrong bytes {report['wrong_bytes']}; lost blocks {report['lost_blocks']} of {final['checked']} expected "
          f"(gone {final['lost_gone']}, unreachable {final['lost_unreachable']}); "
          f"unexpected crashes {report['unexpected_crashes']}; "
          f"tracebacks in logs {report['tracebacks_in_logs']}")  # fmt: skip
    print(f"misses during the run: {report['misses_during_run']}; DRAM evictions {report['dram_evictions']}; "
          f"client exceptions {report['client_exceptions']}; disk fault {report['disk_fault']}")  # fmt: skip
    for sample in final["lost_samples"] + report["crash_samples"] + report["client_exception_samples"]:
        print(f"  ! {str(sample)[:1500]}")
