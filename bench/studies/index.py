"""The daemon's index at scale: bytes per block, operations per second, SSD rebuild time.

For each block count, a fresh interpreter builds a real DRAM tier (a real arena file,
allocated but never written: the index is what is measured, not the blocks' bytes)
and fills it with blocks of the smallest slot (4 KiB) under 32-byte keys, as the
SDK's sha256 block hashes are. It reports the process's resident memory growth per
block, puts, gets (pin and release of a random stored block) and puts that evict,
per second. Then it writes the same number of records into SSD segment files and
opens an SSD tier on them: the rebuild's time (wall, and CPU: on a shared machine the
CPU figure is the one that does not depend on the load) and the memory its index takes per
block.

``--base REV`` runs the same measurements on another revision's code (checked out
with ``git worktree`` into a temporary folder), alternating with this checkout's,
so the ratios compare like with like on a noisy machine.

Run: python bench/studies/index.py [--blocks 1000000,10000000] [--base REV] [--rounds 1]

Last run 2026-12-02, against the dict-based index it replaced; its results are in
docs/performance.md, "The index at scale" (docs/architecture.md cites them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SLOT = 4096
SLAB = 16 * 1024 * 1024
NAMESPACE = "Qwen2.5-0.5B@bf16@L24-KV2-H2-D64-T16-LKHTD@tp0of1"
GETS = 200_000
EVICTING_PUTS = 100_000


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _key(i: int) -> tuple[str, bytes]:
    import hashlib

    return NAMESPACE, hashlib.sha256(i.to_bytes(8, "little")).digest()


def probe_dram(blocks: int, directory: str) -> dict[str, float]:
    """Fill a DRAM tier with ``blocks`` 4 KiB blocks; memory and rates (runs inside the probe)."""
    import gc
    import random
    import time

    from kvpool_server.alloc.arena import SharedArena
    from kvpool_server.alloc.slab import SlabAllocator
    from kvpool_server.stats import Counters
    from kvpool_server.tiers.dram import DramTier

    capacity = -(-blocks * SLOT // SLAB) * SLAB
    arena = SharedArena(directory, "bench-index-arena", capacity, prefault=False)
    try:
        tier = DramTier(arena, SlabAllocator(capacity, SLAB), Counters())
        gc.collect()
        before = _rss()
        started = time.perf_counter()
        for i in range(blocks):
            entry = tier.reserve(_key(i), SLOT)
            tier.commit(entry, known_checksum=i)  # type: ignore[arg-type]
        put_s = time.perf_counter() - started
        gc.collect()
        grown = _rss() - before
        picks = [random.Random(7).randrange(blocks) for _ in range(GETS)]
        started = time.perf_counter()
        for i in picks:
            tier.release(tier.acquire(_key(i)))  # type: ignore[arg-type]
        get_s = time.perf_counter() - started
        started = time.perf_counter()
        for i in range(blocks, blocks + EVICTING_PUTS):
            tier.commit(tier.reserve(_key(i), SLOT), known_checksum=i)  # type: ignore[arg-type]
        evict_s = time.perf_counter() - started
        stored = tier.usage().blocks
    finally:
        arena.close()
    return {
        "bytes_per_block": grown / blocks,
        "puts_per_s": blocks / put_s,
        "gets_per_s": GETS / get_s,
        "evicting_puts_per_s": EVICTING_PUTS / evict_s,
        "stored": stored,
    }


def probe_ssd(blocks: int, directory: str) -> dict[str, float]:
    """Write ``blocks`` records to segment files, then time an SSD tier's rebuild on them."""
    import gc
    import time

    from kvpool_server.stats import Counters
    from kvpool_server.tiers.segments import SegmentLog
    from kvpool_server.tiers.ssd import SsdConfig, SsdTier

    payload = bytes(16)
    segment = 256 * 1024 * 1024
    log = SegmentLog(directory, segment, False)
    for i in range(blocks):
        log.append(NAMESPACE, _key(i)[1], payload, payload_sum=0)
    disk = log.stats().bytes
    log.close()
    gc.collect()
    before = _rss()
    started, cpu = time.perf_counter(), time.process_time()
    tier = SsdTier(SsdConfig(directory, max(3 * segment, 2 * disk), segment, False), Counters())
    rebuild_s, rebuild_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    gc.collect()
    grown = _rss() - before
    indexed = tier.usage().blocks
    tier.close()
    return {
        "rebuild_s": rebuild_s,
        "rebuild_cpu_s": rebuild_cpu_s,
        "bytes_per_block": grown / blocks,
        "indexed": indexed,
        "disk_bytes": disk,
    }


def _probe(tree: Path, tier: str, blocks: int) -> dict[str, float]:
    """One measurement in a fresh interpreter that imports ``tree``'s kvpool."""
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-index-", dir="/var/tmp") as directory:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(
            [sys.executable, __file__, "--probe", tier, "--blocks", str(blocks), "--dir", directory],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode:
        raise RuntimeError(f"{tier} probe at {blocks} blocks ({tree}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", default="1000000,10000000", help="comma-separated block counts")
    parser.add_argument("--base", help="a revision to compare with, e.g. HEAD~5")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tiers", default="dram,ssd")
    parser.add_argument("--probe", choices=["dram", "ssd"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe = probe_dram if args.probe == "dram" else probe_ssd
        print(json.dumps(probe(int(args.blocks), args.dir)))
        return
    trees = {"this": REPO}
    with tempfile.TemporaryDirectory(prefix="kvpool-base-") as scratch:
        if args.base:
            base = Path(scratch) / "base"
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(base), args.base], check=True
            )
            trees["base"] = base
        try:
            _report(trees, [int(b) for b in args.blocks.split(",")], args.tiers.split(","), args.rounds)
        finally:
            if args.base:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(trees["base"])], check=False
                )


def _report(trees: dict[str, Path], counts: list[int], tiers: list[str], rounds: int) -> None:
    for blocks in counts:
        for tier in tiers:
            for round_ in range(rounds):
                results = {name: _probe(tree, tier, blocks) for name, tree in trees.items()}
                for name, figures in results.items():
                    shown = ", ".join(
                        f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v:,}" for k, v in figures.items()
                    )
                    print(f"{tier} {blocks:>11,} blocks, round {round_ + 1}, {name}: {shown}", flush=True)
                if "base" in results:
                    this, base = results["this"], results["base"]
                    ratios = ", ".join(
                        f"{k} {this[k] / base[k]:.2f}x"
                        for k in this
                        if k in base and base[k] and k not in ("stored", "indexed", "disk_bytes")
                    )
                    print(f"{tier} {blocks:>11,} blocks, round {round_ + 1}, this / base: {ratios}", flush=True)


if __name__ == "__main__":
    main()
