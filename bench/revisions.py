"""Side-by-side request cost of two revisions: the checkout against another commit.

Each round starts, for each revision in turn, a daemon from that revision's code and a
client process that imports the same revision, and measures 384 KiB gets (one block,
and batches of 32) over each transport, and puts of new blocks as large (one, and 32 at
a time; a put takes the same path whatever the transport): wall time per call, and the
CPU the client and the daemon spent per call. Rounds alternate the revisions, so drift of
a noisy machine falls on both; the medians over the rounds are compared as ratios (new /
base).

The base revision is checked out with ``git worktree`` into a temporary folder, removed
at the end, with its optional C extensions built in place as the checkout's are. Both
revisions run in this interpreter's environment.

Gets land in bytearrays (``--into``: also ``numpy`` arrays, placed 16 bytes past a 64-byte
boundary as numpy's allocator usually places them, and ``torch`` tensors, 64-byte aligned,
measured side by side; the arena's blocks are page-aligned).

``--cold MIB`` measures cache-cold single gets instead: the daemon holds MIB MiB of distinct
blocks and one client reads each of them once per pass, in a shuffled order (none read within
the client's 0.5 s of known locations, none in the CPU's caches: a scheduler's lookups, an
engine's per-layer loads), against memcpy out of a region as large, read in the same order into
the same destination, in the same process. The first pass (``first-touch``) also maps each
page of the arena into the client's page tables; the passes after it, one per destination
kind, find them mapped. It prints GB/s and the ratio to that memcpy for each revision.

``--instructions`` counts instead the instructions the client process runs per call, in the
same cells, under valgrind's callgrind (each cell's count with no calls taken from its count with
calls): the client's own cost, which the machine's speed does not reach (the daemon runs natively;
the kernel's side of each socket call is not counted, and a TCP cell's count still varies by a few
percent with how often a socket call returns short).

Run: python bench/revisions.py --base HEAD~3 [--new HEAD] [--rounds 3] [--transports tcp,shm]
     [--into bytearray,numpy,torch] [--block 393216] [--cold 512] [--instructions]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BLOCK = 384 * 1024
GETS = 2000  # blocks read per (transport, batch) measurement

# Runs in a fresh interpreter whose sys.path starts with one revision's tree.
_MEASURE = r"""
import json, os, shutil, sys, time
tree, transports, block, gets = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
kinds = sys.argv[5].split(",")
sys.path.insert(0, tree)
from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from tests.support.daemon import start_daemon  # every revision's tests have it

def destinations(kind, count):  # count buffers of kind
    if kind == "numpy":  # 16 past a 64-byte boundary, where numpy's allocator usually puts them
        import numpy
        raw = [numpy.empty(block + 64, numpy.uint8) for _ in range(count)]
        return [a[(16 - a.ctypes.data) % 64 :][:block] for a in raw]
    if kind == "torch":
        import torch
        return [torch.empty(block, dtype=torch.uint8) for _ in range(count)]
    return [bytearray(block) for _ in range(count)]

def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

daemon = start_daemon("--dram-capacity", "256MiB", "--log-level", "warning")
out = {}
try:
    for transport in transports:
        for batch in (1, 32):
            with KVPoolClient(config=ClientConfig(nodes=(daemon.address,), transport=transport)) as client:
                keys = [BlockKey("revisions", bytes([i]) * 32) for i in range(batch)]
                client.put(keys, [os.urandom(block) for _ in keys]).raise_for_errors()
                for kind in kinds:
                    into = destinations(kind, len(keys))
                    for _ in range(100):
                        client.get(keys, into)
                    calls = gets // batch
                    daemon_cpu, mine, started = cpu_s(daemon.process.pid), time.process_time(), time.perf_counter()
                    for _ in range(calls):
                        client.get(keys, into)
                    wall = time.perf_counter() - started
                    mine, daemon_cpu = time.process_time() - mine, cpu_s(daemon.process.pid) - daemon_cpu
                    cell = f"{transport} x{batch}" + (f" {kind}" if kinds != ["bytearray"] else "")
                    out[cell] = [1e6 * wall / calls, 1e6 * mine / calls, 1e6 * daemon_cpu / calls]
                # Puts of new keys (evicting once the arena is full, as in steady use); one path whatever the transport.
                if transport == transports[0]:
                    blocks, calls = [os.urandom(block) for _ in keys], gets // batch
                    new_keys = [[BlockKey("revisions-put", c.to_bytes(4, "little") + bytes([i]) * 28)
                                 for i in range(batch)] for c in range(calls)]
                    daemon_cpu, mine, started = cpu_s(daemon.process.pid), time.process_time(), time.perf_counter()
                    for batch_keys in new_keys:
                        client.put(batch_keys, blocks)
                    wall = time.perf_counter() - started
                    mine, daemon_cpu = time.process_time() - mine, cpu_s(daemon.process.pid) - daemon_cpu
                    out[f"put x{batch}"] = [1e6 * wall / calls, 1e6 * mine / calls, 1e6 * daemon_cpu / calls]
finally:
    daemon.stop()
    shutil.rmtree(daemon.workdir, ignore_errors=True)
print(json.dumps(out))
"""


# Cache-cold single gets (--cold): every block read once, shuffled, against memcpy in the same order.
_MEASURE_COLD = r"""
import json, os, random, shutil, sys, time
tree, transports, block, cold_mib = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
kinds = sys.argv[5].split(",")
sys.path.insert(0, tree)
import numpy
from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from tests.support.daemon import start_daemon  # every revision's tests have it

def destination(kind):  # as in the hot measurement
    if kind == "numpy":
        raw = numpy.empty(block + 64, numpy.uint8)
        return raw[(16 - raw.ctypes.data) % 64 :][:block]
    if kind == "torch":
        import torch
        return torch.empty(block, dtype=torch.uint8)
    return bytearray(block)

def as_array(target):
    return target.numpy() if hasattr(target, "numpy") else numpy.frombuffer(target, numpy.uint8)

def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

count = (cold_mib << 20) // block
region = numpy.random.default_rng(7).integers(0, 255, count * block, dtype=numpy.uint8)
# Room for every transport's blocks at once, slab by slab: reads through the shared arena reach the
# eviction order up to half a second late, so the first pass's blocks may well outrank the next one's.
slabs = -(-count // max(1, (4 << 20) // block)) * len(transports)
daemon = start_daemon("--dram-capacity", f"{slabs * 4 + 64}MiB", "--slab-size", "4MiB", "--log-level", "warning")
out = {}
try:
    for transport in transports:
        with KVPoolClient(config=ClientConfig(nodes=(daemon.address,), transport=transport)) as client:
            keys = [BlockKey(f"cold-{transport}@u8@raw", i.to_bytes(8, "little") * 4) for i in range(count)]
            for start in range(0, count, 16):
                views = [memoryview(region[i * block : (i + 1) * block]) for i in range(start, min(count, start + 16))]
                client.put(keys[start : start + len(views)], views).raise_for_errors()
            warm = [BlockKey("warm@u8@raw", bytes([i]) * 32) for i in range(8)]
            client.put(warm, [bytes(block)] * 8).raise_for_errors()
            for kind in ["first-touch", *kinds]:  # the first pass also maps each page into this process
                target = destination(kinds[0] if kind == "first-touch" else kind)
                order = random.Random(kind).sample(range(count), count)
                for _ in range(3):
                    client.get(warm, [destination(kinds[0]) for _ in warm])  # connections made
                time.sleep(0.6)  # every location learned before has expired
                daemon_cpu, mine, started = cpu_s(daemon.process.pid), time.process_time(), time.perf_counter()
                for i in order:
                    got = client.get([keys[i]], [target])
                wall = time.perf_counter() - started
                mine, daemon_cpu = time.process_time() - mine, cpu_s(daemon.process.pid) - daemon_cpu
                assert got.ok, f"{transport} {kind}: the last get answered {got.statuses} {got.causes}"
                assert bytes(as_array(target)) == bytes(region[order[-1] * block : (order[-1] + 1) * block])
                out[f"{transport} {kind}"] = [1e6 * wall / count, 1e6 * mine / count, 1e6 * daemon_cpu / count]
    for kind in kinds:
        target, order = as_array(destination(kind)), random.Random(kind).sample(range(count), count)
        started = time.perf_counter()
        for i in order:
            numpy.copyto(target, region[i * block : (i + 1) * block])
        out[f"memcpy {kind}"] = [1e6 * (time.perf_counter() - started) / count, 0.0, 0.0]
finally:
    daemon.stop()
    shutil.rmtree(daemon.workdir, ignore_errors=True)
print(json.dumps(out))
"""


# Runs under callgrind: one cell's calls (a get of a batch of blocks, or a put of new ones), after a warm-up.
_COUNT = r"""
import os, shutil, sys
tree, transport, op = sys.argv[1], sys.argv[2], sys.argv[4]
batch, calls, block = int(sys.argv[3]), int(sys.argv[5]), int(sys.argv[6])
sys.path.insert(0, tree)
from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from tests.support.daemon import start_daemon

daemon = start_daemon("--dram-capacity", "256MiB", "--log-level", "warning")
try:
    with KVPoolClient(config=ClientConfig(nodes=(daemon.address,), transport=transport)) as client:
        keys = [BlockKey("revisions", bytes([i]) * 32) for i in range(batch)]
        blocks = [os.urandom(block) for _ in keys]
        client.put(keys, blocks).raise_for_errors()
        into = [bytearray(block) for _ in keys]
        fresh = [[BlockKey("revisions-put", c.to_bytes(4, "little") + bytes([i]) * 28) for i in range(batch)]
                 for c in range(calls + 20)]
        for c in range(20):
            client.get(keys, into) if op == "get" else client.put(fresh[calls + c], blocks)
        for c in range(calls):
            client.get(keys, into) if op == "get" else client.put(fresh[c], blocks)
finally:
    daemon.stop()
    shutil.rmtree(daemon.workdir, ignore_errors=True)
"""
_CALLS = {1: 200, 32: 20}  # calls per cell under callgrind, by batch size


def count_instructions(tree: Path, transport: str, batch: int, op: str, block: int) -> float:
    """Instructions the client runs per call of one cell with ``tree``'s code (callgrind)."""
    totals = []
    for calls in (0, _CALLS[batch]):
        argv = ["valgrind", "--tool=callgrind", "--cache-sim=no", "--callgrind-out-file=/dev/null"]
        argv += [sys.executable, "-c", _COUNT, str(tree), transport, str(batch), op, str(calls), str(block)]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=tree, timeout=900)
        found = re.search(r"Collected : ([\d,]+)", done.stderr)
        if done.returncode or found is None:
            raise SystemExit(f"counting {tree} failed:\n{done.stderr[-3000:]}")
        totals.append(int(found.group(1).replace(",", "")))
    return (totals[1] - totals[0]) / _CALLS[batch]


def _report_instructions(trees: dict[str, Path], args: argparse.Namespace) -> None:
    """Client instructions per call of each cell, base and new, and their ratio."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    cells = [(t, b, "get") for t in args.transports.split(",") for b in (1, 32)] + [("tcp", b, "put") for b in (1, 32)]
    jobs = [(rev, cell) for cell in cells for rev in ("base", "new")]
    with ThreadPoolExecutor(2) as pool:  # each count is one process; the daemons idle between calls
        found = pool.map(lambda job: count_instructions(trees[job[0]], *job[1], args.block), jobs)
        counts = dict(zip(jobs, found, strict=True))
    print(f"{args.block // 1024} KiB gets and puts: client instructions per call (callgrind), new/base in brackets")
    for transport, batch, op in cells:
        base, new = (counts[(rev, (transport, batch, op))] for rev in ("base", "new"))
        name = f"{transport} x{batch}" if op == "get" else f"put x{batch}"
        print(f"{name:8s} {base:10.0f} -> {new:10.0f} ({_ratio(new, base)})")


def measure(
    tree: Path, transports: str, block: int = BLOCK, into: str = "bytearray", cold_mib: int = 0
) -> dict[str, list[float]]:
    """One measurement of every cell with ``tree``'s code: cell -> [wall, client CPU, daemon CPU] us per call."""
    argv = [sys.executable, "-c", _MEASURE, str(tree), transports, str(block), str(GETS), into]
    if cold_mib:
        argv = [sys.executable, "-c", _MEASURE_COLD, str(tree), transports, str(block), str(cold_mib), into]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tree, timeout=600)
    if done.returncode:
        raise SystemExit(f"measuring {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare the checkout with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transports", default="tcp,shm")
    parser.add_argument("--new", default=None, help="a commit to measure instead of the checkout (as it is on disk)")
    parser.add_argument("--into", default="bytearray", help="comma-separated destinations: bytearray, numpy, torch")
    parser.add_argument("--block", type=int, default=BLOCK, help="bytes per block")
    parser.add_argument(
        "--cold",
        type=int,
        default=0,
        metavar="MIB",
        help="cache-cold single gets over MIB MiB of blocks, each read once, against memcpy",
    )
    parser.add_argument("--instructions", action="store_true", help="count client instructions per call (valgrind)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvpool-base-") as scratch:
        trees = {"base": _worktree(Path(scratch) / "base", args.base)}
        trees["new"] = _worktree(Path(scratch) / "new", args.new) if args.new else REPO
        try:
            if args.instructions:
                _report_instructions(trees, args)
                return
            runs: dict[str, list[dict[str, list[float]]]] = {"base": [], "new": []}
            for _ in range(args.rounds):
                for rev in ("base", "new"):
                    runs[rev].append(measure(trees[rev], args.transports, args.block, args.into, args.cold))
        finally:
            for tree in trees.values():
                if tree != REPO:
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    if args.cold:
        _report_cold(runs, args)
        return
    print(
        f"{args.block // 1024} KiB gets and puts, medians of {args.rounds} alternating rounds; us per call, "
        "new/base in brackets"
    )
    for cell in runs["base"][0]:
        base_m, new_m = (
            [statistics.median(r[cell][i] for r in runs[rev]) for i in range(3)] for rev in ("base", "new")
        )
        wall, client, daemon = (f"{b:6.0f} -> {n:6.0f} ({_ratio(n, b)})" for b, n in zip(base_m, new_m, strict=True))
        print(f"{cell:8s} wall {wall} | client CPU {client} | daemon CPU {daemon}")


def _report_cold(runs: dict[str, list[dict[str, list[float]]]], args: argparse.Namespace) -> None:
    """GB/s of each revision's cold single gets and their ratio to memcpy of the same round."""
    print(
        f"{args.block // 1024} KiB cache-cold single gets over {args.cold} MiB, medians of {args.rounds} "
        "alternating rounds: GB/s (x memcpy of the same round), then CPU us per get (client + daemon)"
    )
    first = args.into.split(",")[0]
    for cell in (c for c in runs["base"][0] if not c.startswith("memcpy")):
        memcpy_cell = "memcpy " + cell.split(" ", 1)[1].replace("first-touch", first)
        line = []
        for rev in ("base", "new"):
            speed = [args.block / r[cell][0] / 1e3 for r in runs[rev]]
            ratio = [r[memcpy_cell][0] / r[cell][0] for r in runs[rev]]
            cpu = [r[cell][1] + r[cell][2] for r in runs[rev]]
            line.append(
                f"{rev} {statistics.median(speed):5.2f} (x{statistics.median(ratio):.2f}) "
                f"{statistics.median(cpu):5.0f} us"
            )
        print(f"{cell:16s} " + " | ".join(line))
    for cell in (c for c in runs["base"][0] if c.startswith("memcpy")):
        speed = [args.block / r[cell][0] / 1e3 for rev in ("base", "new") for r in runs[rev]]
        print(f"{cell:16s} {statistics.median(speed):5.2f} GB/s")


def _worktree(path: Path, commit: str) -> Path:
    """``commit`` checked out at ``path``, its optional C extensions built in place as the checkout's
    are (a revision without them would measure its pure-Python fallbacks)."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(path), commit], check=True)
    build = [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_ext", "--inplace"]
    subprocess.run(build, cwd=path, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


def _ratio(new: float, base: float) -> str:
    """``new / base``; n/a when the base spent nothing measurable (a shm get the daemon never sees)."""
    return f"{new / base:.2f}" if base else " n/a"


if __name__ == "__main__":
    main()
