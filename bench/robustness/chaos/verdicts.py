"""Verdicts on a soak run: which blocks must still read back, which are lost, what misses mean, crashes.

A block is *acknowledged* when its put returned success with the block stored on 2
nodes. It is *expected* while it is not deleted and at least one of those 2 nodes was
not SIGKILLed since its put was sent. After the faults, an expected block that reads
NOT_FOUND is lost (see ``bench/robustness/soak.py`` for the whole definition).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter

from bench.robustness.chaos.clients import Acked, WorkerResult
from bench.robustness.chaos.cluster import SoakCluster, Window
from bench.robustness.chaos.settings import NS
from kvpool_client import BlockKey, ErrorCode, KVPoolClient


def expected(record: Acked, kills: dict[str, list[float]], at: float) -> bool:
    """Whether ``record`` must still be readable at time ``at`` (see the module docstring)."""
    if record.deleted_at is not None and record.deleted_at <= at:
        return False
    survivors = [n for n in record.stored_on if not any(record.sent_at <= t <= at for t in kills.get(n, []))]
    return bool(survivors)


def final_check(cluster: SoakCluster, client: KVPoolClient, acked: list[Acked], batch: int = 64) -> dict:
    """Read every expected block again; NOT_FOUND after 3 passes is lost. Returns the counts."""
    kills = {n.name: n.killed_at for n in cluster.nodes}
    now = time.monotonic()
    pending = [a for a in acked if expected(a, kills, now)]  # the live sets and the suspects
    checked, wrong, unreached = len(pending), 0, 0
    for _ in range(3):
        missing: list[Acked] = []
        unreached = 0
        for start in range(0, len(pending), batch):
            part = pending[start : start + batch]
            got = client.get([BlockKey(NS, a.hash) for a in part])
            for record, status, buf in zip(part, got.statuses, got.buffers, strict=True):
                if status is ErrorCode.OK and buf is not None:
                    wrong += hashlib.blake2b(buf, digest_size=32).digest() != record.hash
                else:
                    missing.append(record)
                    unreached += status is not ErrorCode.NOT_FOUND
        pending = missing
        if not pending:
            break
        time.sleep(1.0)
    where = cluster.holders([a.hash for a in pending]) if pending else []
    lost = [{"hash": a.hash.hex(), "stored_on": a.stored_on, "sent_at": round(a.sent_at, 2), "held_by": w}
            for a, w in zip(pending, where, strict=True)]  # fmt: skip
    return {"checked": checked, "wrong_bytes": wrong, "lost": len(lost), "unreached_in_last_pass": unreached,
            "lost_gone": sum(1 for x in lost if not x["held_by"]),
            "lost_unreachable": sum(1 for x in lost if x["held_by"]),
            "lost_samples": lost[:10]}  # fmt: skip


def classify_run_misses(results: list[WorkerResult], acked: list[Acked], kills: dict[str, list[float]],
                        windows: list[Window]) -> dict[str, object]:  # fmt: skip
    """Reads answered NOT_FOUND during the run, by what the block's two nodes were going through.

    With one copy's node killed (its DRAM gone) and the other node stopped, a read gets
    NOT_FOUND from the first and no answer from the second: a miss by design, and the
    block must come back once the stopped node runs again (the final check sees to it).
    """
    by_hash = {a.hash: a for a in acked}
    counts: Counter[str] = Counter()
    samples: list[str] = []
    for result in results:
        for at, h, order in result.misses:
            kind = _miss_kind(by_hash[h], at, order, kills, windows)
            counts[kind] += 1
            if kind == "unexplained" and len(samples) < 5:
                near = [f"{w.fault} {w.target} {w.start - at:+.1f}..{w.end - at:+.1f}s" for w in windows
                        if w.start - 10 <= at <= w.end + 10]  # fmt: skip
                samples.append(f"{h.hex()[:16]} on {by_hash[h].stored_on}, read from {order}, "
                               f"sent {by_hash[h].sent_at - at:+.1f}s; faults near: {near}")  # fmt: skip
    return {**counts, "unexplained_samples": samples} if samples else dict(counts)


def _miss_kind(
    record: Acked, at: float, read_order: tuple[str, ...], kills: dict[str, list[float]], windows: list[Window]
) -> str:
    killed = [n for n in record.stored_on if any(record.sent_at <= t <= at for t in kills.get(n, []))]
    if len(killed) >= 2:
        return "excused: both copies' nodes killed"
    survivors = [n for n in record.stored_on if n not in killed]
    # A request sent just before SIGCONT times out after it: a second and a half of slack.
    faulty = {w.target for w in windows if w.start <= at <= w.end + 1.5 and w.fault != "disk full"}
    if all(n in faulty for n in survivors):
        return "transient: every live copy's node stopped or restarting"
    if any(n not in read_order for n in survivors if n not in faulty):
        # Written while a node was out of the membership; it came back and took a place
        # among the key's owners: the client no longer asks the healthy node holding the copy.
        return "placement moved: a healthy copy outside the client's read order"
    return "unexplained"


def crashes(cluster: SoakCluster) -> tuple[int, int, list[str]]:
    """(unexpected exits, tracebacks in logs, samples) over every incarnation of every node."""
    unexpected, tracebacks, samples = 0, 0, []
    for node in cluster.nodes:
        for inc in node.incarnations:
            code = inc.daemon.process.returncode
            if not inc.killed and code not in (0, None):
                unexpected += 1
                samples.append(f"{node.name} pid {inc.daemon.process.pid} exited {code}: {inc.log[-1500:]}")
            count = inc.log.count("Traceback")
            tracebacks += count
            if count:
                at = inc.log.index("Traceback")
                excerpt = inc.log[max(0, at - 300) : at + 1500]
                samples.append(f"{node.name} pid {inc.daemon.process.pid} traceback: {excerpt}")
    return unexpected, tracebacks, samples
