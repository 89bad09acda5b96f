"""Fuzz a live daemon on both planes while a well-behaved client keeps using it.

One ``kvpool-server`` runs in its own process on 127.0.0.1 with small limits (64 keys
per request, 1 MiB blocks, 8 MiB frames, a 0.25 s stall timeout), so cases can reach
every limit cheaply. Then, at the same time:

- a data-plane fuzzer process drives many TCP connections (``--lanes``). Each case is
  raw bytes, a random header, a valid request, a valid request with mutations (bit
  flips, header and meta fields at and over the limits, huge counts, wrong ops,
  truncation, junk, splices), a response frame sent as a request, or a pipeline of
  valid requests. Most cases are followed by a PING sentinel and played until the
  sentinel is answered (outcome ``ok`` or ``error_frame``) or the daemon closes the
  connection (``closed``); some are cut by the client mid-frame (``client_closed``);
  some stop mid-frame and wait for the daemon to drop them (``closed``).
- a gRPC fuzzer process sends typed-but-hostile and raw-byte messages to every
  method of ``kvpool.v1.KVPool`` (and an unknown one), oversized messages, bad
  states for SetState (a drain is always undone at once) and junk to the gRPC port.
- a good client (a thread here) puts blocks whose key is the blake2b of their bytes
  and reads them back, checking every byte.

A case without an answer or a close within ``--hang-timeout`` is a hang. The daemon's
RSS is sampled throughout. Invariants: no crash, no hang, no undecodable answer, no
unhandled exception in the daemon's log, the good client sees no error.

Run: python bench/robustness/fuzz.py [--cases 100000] [--seconds 600] [--out bench/results]
(the fuzzer itself is the package ``bench/robustness/fuzzing``)
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse
import json
from dataclasses import asdict

from bench.robustness.fuzzing.report import print_report
from bench.robustness.fuzzing.run import FuzzSettings, run_fuzz


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000, help="cases over both planes")
    parser.add_argument("--seconds", type=float, default=600.0, help="stop sending new cases after this long")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lanes", type=int, default=192, help="concurrent data-plane connections")
    parser.add_argument("--grpc-share", type=float, default=0.15, help="share of the cases sent to gRPC")
    parser.add_argument(
        "--hang-timeout", type=float, default=5.0, help="seconds without answer or close that make a hang"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    settings = FuzzSettings(args.cases, args.seconds, args.seed, args.lanes, args.grpc_share, args.hang_timeout)
    report = run_fuzz(settings)
    print_report(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fuzz.json").write_text(json.dumps(asdict(report), indent=2))
    bad = report.daemon_crashes or report.hangs or report.bad_responses or report.handler_exceptions
    bad = bad or report.grpc_handler_errors
    failed = report.fuzzer_failures or report.good_client["errors"] or not report.alive_after
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
