"""The faults, one at a time, and the driver that applies them in turn.

Each fault records its window on the cluster: SIGKILL a daemon and restart it on the
same ports and SSD directory; SIGSTOP one, then SIGCONT; restart etcd (same ports and
data); fill node-2's disk (the tmpfs), then free it. The driver runs a no-fault
baseline window first, then the faults with a recovery gap after each.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator

from bench.robustness.chaos.cluster import Incarnation, Node, SoakCluster, Window
from bench.robustness.chaos.settings import DISK_NODE, NODES


def kill_and_restart(cluster: SoakCluster, node: Node) -> None:
    """SIGKILL ``node``'s daemon, wait ``kill_down_s``, start it again on the same ports and SSD directory."""
    start = time.monotonic()
    old = node.incarnations[-1]
    old.killed = old.daemon.process.poll() is None  # one that died by itself is a crash, not a kill
    node.killed_at.append(time.monotonic())
    old.daemon.process.kill()
    old.daemon.process.wait(10)
    time.sleep(cluster.s.kill_down_s)
    node.incarnations.append(Incarnation(cluster.spawn(node, (old.daemon.grpc_port, old.daemon.data_port))))
    warm = sum(t.blocks for t in cluster.stats(node).tiers if t.name == "ssd")
    cluster.windows.append(
        Window("kill -9 + restart", node.name, start, time.monotonic(), f"{warm} blocks back from SSD")
    )


def stop_and_continue(cluster: SoakCluster, node: Node) -> None:
    """SIGSTOP ``node``'s daemon for ``stop_s``, then SIGCONT it."""
    start = time.monotonic()
    node.daemon.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(cluster.s.stop_s)
    finally:
        node.daemon.process.send_signal(signal.SIGCONT)
    cluster.windows.append(Window("SIGSTOP / SIGCONT", node.name, start, time.monotonic()))


def restart_etcd(cluster: SoakCluster) -> None:
    """Stop etcd for ``etcd_down_s``, then start it again (same ports and data)."""
    start = time.monotonic()
    cluster.etcd.stop()
    time.sleep(cluster.s.etcd_down_s)
    cluster.etcd.start()
    cluster.windows.append(Window("etcd restart", "etcd", start, time.monotonic()))


def fill_disk(cluster: SoakCluster, node: Node) -> None:
    """Fill ``node``'s SSD tmpfs for ``disk_full_s``, then free it; a no-op where none is mounted."""
    if cluster.mounted is None:
        return
    start = time.monotonic()
    errors_before = _ssd_io_errors(cluster, node)
    filler = node.ssd_dir / "zz-filler.tmp"
    try:
        with open(filler, "wb") as handle:
            chunk = bytes(1 << 20)
            while True:  # write until the disk is full: ENOSPC ends it
                handle.write(chunk)
    except OSError:
        pass
    try:
        time.sleep(cluster.s.disk_full_s)
        errors = _ssd_io_errors(cluster, node) - errors_before
    finally:
        filler.unlink(missing_ok=True)
    cluster.windows.append(Window("disk full", node.name, start, time.monotonic(), f"{errors} SSD write errors"))


def _ssd_io_errors(cluster: SoakCluster, node: Node) -> int:
    return sum(t.io_errors for t in cluster.stats(node).tiers if t.name == "ssd")


def chaos_plan(cluster: SoakCluster) -> Iterator[tuple[str, Callable[[], None], float]]:
    """Faults in turn, forever: (name, apply, how long it takes); the victim rotates each round."""
    s = cluster.s
    for round_ in range(1_000_000):
        kill_victim = cluster.nodes[round_ % NODES]
        stop_victim = cluster.nodes[(round_ + 1) % NODES]
        yield "kill", lambda n=kill_victim: kill_and_restart(cluster, n), s.kill_down_s + 3.0
        yield "stop", lambda n=stop_victim: stop_and_continue(cluster, n), s.stop_s
        yield "etcd", lambda: restart_etcd(cluster), s.etcd_down_s + 1.0
        if cluster.mounted is not None:
            yield "disk", lambda: fill_disk(cluster, cluster.nodes[DISK_NODE]), s.disk_full_s + 0.5


def drive_chaos(cluster: SoakCluster, started: float, deadline: float) -> Window:
    """Baseline first, then faults with gaps until ``deadline``; returns the baseline window."""
    s = cluster.s
    baseline = Window("none (baseline)", "-", started + s.warmup_s, started + s.warmup_s + s.baseline_s)
    time.sleep(max(0.0, baseline.end - time.monotonic()))
    for _, apply, needs in chaos_plan(cluster):
        if time.monotonic() + needs + 1.0 > deadline:
            break
        apply()
        time.sleep(min(s.gap_s, max(0.0, deadline - time.monotonic())))
    return baseline
