"""Soak under chaos: 3 daemons with R=2, clients checking every byte, faults one at a time.

Setup: an etcd and 3 daemons on 127.0.0.1, each with a small DRAM arena and an SSD
tier (64 MiB in 4 MiB segments; node-2's SSD directory is a tmpfs mount, so its disk
can be filled). Client processes use replicas=2, write_quorum=2. Each one puts batches
of new blocks whose key is the blake2b of their bytes (so any read can be checked),
reads back random blocks it has stored, and deletes its oldest blocks to keep its live
set bounded: the whole working set, twice over, stays far below the DRAM of the pool,
so nothing is evicted (checked at the end from each node's counters).

After a no-fault baseline window, a chaos driver applies faults in turn, one at a time,
each followed by a recovery gap: SIGKILL a daemon and restart it on the same ports and
SSD directory; SIGSTOP one, then SIGCONT; restart etcd (same ports and data); fill
node-2's disk (the tmpfs), then free it.

Counted:
- wrong bytes: a read returned OK with bytes whose blake2b is not the key. Must be 0.
- lost blocks: a block is *acknowledged* when its put returned success with the block
  stored on 2 nodes. It is *expected* while it is not deleted and at least one of
  those 2 nodes was not SIGKILLed since its put was sent (a kill empties a node's DRAM;
  its SSD keeps only what the demoter had copied). DRAM is a cache, so an eviction
  would excuse a miss too; the run is sized so none happens and reports evictions.
  After the faults end and the membership settles, every expected block is read once
  more (up to 3 passes, to ride out a breaker still open): one that reads NOT_FOUND
  is lost. Each lost block is also asked for on every node directly, which tells
  "gone" (no node has it) from "unreachable" (a node holds it, but not one the
  client reads from). Must be 0. Misses during fault windows are reported apart.
- unexpected crashes: a daemon that exited without the driver killing it, or exited
  non-zero on the final SIGTERM. Tracebacks in the daemons' logs are counted and shown.
- throughput: successful block operations (acknowledged puts and verified gets) per
  second in each fault window, against the baseline window of the same run.

Prints a table and writes bench/results/soak.json.

Run: python bench/robustness/soak.py [--seconds 120] [--workers 3] [--out bench/results]
(the soak itself is the package ``bench/robustness/chaos``)
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse
import json

from bench.robustness.chaos.report import print_report
from bench.robustness.chaos.run import run_soak
from bench.robustness.chaos.settings import SoakSettings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the clients run")
    parser.add_argument("--workers", type=int, default=3, help="client processes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    report = run_soak(SoakSettings(seconds=args.seconds, workers=args.workers, seed=args.seed))
    print_report(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=2, default=str))
    bad = report["wrong_bytes"] or report["lost_blocks"] or report["unexpected_crashes"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
