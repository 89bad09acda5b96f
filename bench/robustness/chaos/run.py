"""One soak run: the cluster, the client processes under the fault driver, then the final check."""

from __future__ import annotations

import multiprocessing as mp
import time

from bench.robustness.chaos.clients import WorkerResult, worker_main
from bench.robustness.chaos.cluster import SoakCluster, Window
from bench.robustness.chaos.faults import drive_chaos
from bench.robustness.chaos.report import build_report
from bench.robustness.chaos.settings import SoakSettings, client_config
from bench.robustness.chaos.verdicts import final_check
from kvpool_client import KVPoolClient


def run_workers(settings: SoakSettings, cluster: SoakCluster) -> tuple[list[WorkerResult], Window]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    started = time.monotonic()
    deadline = started + settings.seconds
    procs = [ctx.Process(target=worker_main, args=(i, settings, cluster.etcd.endpoint, deadline, out))
             for i in range(settings.workers)]  # fmt: skip
    for proc in procs:
        proc.start()
    try:
        baseline = drive_chaos(cluster, started, deadline)
        results = [out.get(timeout=max(1.0, deadline - time.monotonic()) + 60)[1] for _ in procs]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return results, baseline


def run_soak(settings: SoakSettings) -> dict:
    """Start the cluster, run clients under chaos, check every expected block; stops everything."""
    cluster = SoakCluster(settings)
    try:
        cluster.start()
        results, baseline = run_workers(settings, cluster)
        # The daemons' own exits are judged before anything is stopped.
        alive = {n.name: n.daemon.process.poll() is None for n in cluster.nodes}
        with KVPoolClient(config=client_config(cluster.etcd.endpoint)) as client:
            settled = cluster.wait_settled(client)
            acked = [a for r in results for a in r.acked]
            final = final_check(cluster, client, acked)
            evicted = cluster.evictions(client)
        cluster.stop()
        return build_report(settings, cluster, results, baseline, final, evicted, alive, settled)
    finally:
        cluster.stop()
