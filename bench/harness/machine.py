"""How busy the machine was while a cell ran, and how much of that was not the benchmark.

On a shared 2-core machine another process's CPU use can halve every number, so
each cell records the cores used by everything else: ``/proc/stat`` busy time
minus the CPU time of this process and all its descendants (daemon, Redis,
socket server, client workers).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class CpuSample:
    wall_s: float
    busy_s: float  # all CPUs, whole machine
    own_s: float  # this process tree


def sample() -> CpuSample:
    return CpuSample(time.monotonic(), _machine_busy_s(), _tree_cpu_s(os.getpid()))


def foreign_cores(start: CpuSample, end: CpuSample) -> float:
    """Average cores used by processes outside this benchmark between two samples."""
    wall = max(1e-9, end.wall_s - start.wall_s)
    foreign = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
    return round(max(0.0, foreign) / wall, 2)


def process_cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU of all threads of ``pid`` (scheduler accounting, not ticks); 0 if gone."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total


def _machine_busy_s() -> float:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / _TICK


def _tree_cpu_s(root: int) -> float:
    """utime + stime of ``root`` and every live descendant."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        pid = int(entry)
        parents[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / _TICK
    return sum(t for pid, t in cpu.items() if _descends(pid, root, parents))


def _descends(pid: int, root: int, parents: dict[int, int]) -> bool:
    while pid > 1:
        if pid == root:
            return True
        pid = parents.get(pid, 0)
    return pid == root
