"""Copy throughput by method and by destination alignment: what a block's copy out of the arena costs.

Usage: ``.venv/bin/python bench/studies/copies.py [--quick] [--out bench/results]``

Last run 2026-12-02; its results and the route ``copy_into`` takes are in docs/performance.md,
"Copies by destination alignment" and "Copies at a short page distance; one-key gets over a
blocking socket in line".

The source is a page-aligned file in ``/dev/shm`` mapped read-only, as a client maps a
daemon's arena. Each block size (64 KiB, 384 KiB, 2 MiB) is copied into destinations at
offsets 0, 16 and 64 from a page, and into separately allocated torch tensors (64-byte
aligned), numpy arrays and bytearrays (16-byte aligned), by each candidate method:

- ``assign``: ``dst[:] = src`` on memoryviews (libc memcpy);
- ``memmove``: ``ctypes.memmove``; ``copyto``: numpy's ``copyto``; ``torch``: ``Tensor.copy_``;
- ``split64``: the bytes up to the destination's next 64-byte boundary, then the rest in one
  memmove (aligns the destination only: the relative alignment of the two stays);
- ``chunkN``: ``ctypes.memmove`` in pieces of N bytes (below glibc's ``rep movsb`` threshold
  for N <= 2 KiB);
- ``ufunc``: ``numpy.bitwise_or(src, 0, out=dst)``, a SIMD loop that never calls memcpy;
- ``sse2``: glibc's ``memcpy@GLIBC_2.2.5`` through ctypes, its SSE2 memmove without ``rep movsb``;
- ``copy_into``: :func:`kvpool_client.core.channels.copy.copy_into`, what the client uses: memcpy,
  or ``sse2`` for copies a few bytes past the source modulo a page where this process measured
  memcpy clearly slower (the route it took is in the header).

Hot: the same source and destination again and again (both in cache). Cold: every copy
reads and writes memory not touched for 256 MiB of copies (the L3 is 32 MiB). Rounds are
interleaved (every method and destination once per round, every other round reversed);
a cell is the median over rounds of each round's median copy time. ``ratio`` is the cell's
speed over the speed of ``assign`` into an equally aligned destination (page + 0) in the
same round: 1.0 is memcpy of equally aligned buffers. Writes ``copies.json`` and
``copies.md`` to ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse
import ctypes
import json
import mmap
import os
import platform
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from bench.harness.workload import KiB, MiB
from kvpool_client.core.channels import copy as client_copy
from kvpool_client.core.channels.copy import PAGE, SSE2_MEMMOVE, address, copy_into, short_page_distance

try:
    import torch

    torch.set_num_threads(1)  # two intra-op threads on a shared 2-core VM stall for milliseconds
    warnings.filterwarnings("ignore", "The given buffer is not writable")  # the source: torch only reads it
except ImportError:  # the torch rows and method are left out
    torch = None

SIZES = (64 * KiB, 384 * KiB, 2 * MiB)
PAGE_OFFSETS = (0, 16, 64)
RING = 128 * MiB  # per ring: source and destination rings together are 8x the L3
ROUNDS, QUICK_ROUNDS = 9, 3
COPIES_PER_ROUND = 12
REFERENCE = ("page+0", "assign")

Copy = Callable[[memoryview, memoryview, int], None]  # (dst, src, src address)


@dataclass(frozen=True, slots=True)
class Destination:
    """A kind of destination: one buffer per ring slot (the first one for hot copies)."""

    name: str
    slots: list[memoryview]
    keep: list[Any] = field(default_factory=list)  # the objects the views point into


@dataclass(slots=True)
class Cell:
    size: int
    temperature: str
    destination: str
    method: str
    relative_alignment: str  # (dst - src) mod 4096 of the slot hot copies use; cold: how many slots are short
    round_us: list[float] = field(default_factory=list)  # median copy time per round
    round_ratios: list[float] = field(default_factory=list)

    @property
    def us(self) -> float:
        return statistics.median(self.round_us)

    @property
    def gbps(self) -> float:
        return self.size / self.us / 1e3

    @property
    def ratio(self) -> float:
        return statistics.median(self.round_ratios)


def _memmove(dst: memoryview, src: memoryview, src_at: int) -> None:
    ctypes.memmove(address(dst), src_at, len(src))


def _split64(dst: memoryview, src: memoryview, src_at: int) -> None:
    head = min(-address(dst) % 64, len(src))
    dst[:head] = src[:head]
    ctypes.memmove(address(dst) + head, src_at + head, len(src) - head)


def _chunked(piece: int) -> Copy:
    def copy(dst: memoryview, src: memoryview, src_at: int) -> None:
        to, move, n = address(dst), ctypes.memmove, len(src)
        for at in range(0, n, piece):
            move(to + at, src_at + at, min(piece, n - at))

    return copy


def _torch(dst: memoryview, src: memoryview, src_at: int) -> None:
    torch.frombuffer(dst, dtype=torch.uint8).copy_(torch.frombuffer(src, dtype=torch.uint8))


METHODS: dict[str, Copy] = {
    "assign": lambda dst, src, src_at: dst.__setitem__(slice(None), src),
    "memmove": _memmove,
    "copyto": lambda dst, src, src_at: np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8)),
    "split64": _split64,
    "chunk1024": _chunked(1024),
    "chunk2048": _chunked(2048),
    "chunk4096": _chunked(4096),
    "ufunc": lambda dst, src, src_at: np.bitwise_or(np.frombuffer(src, np.uint8), 0, out=np.frombuffer(dst, np.uint8)),
    "sse2": lambda dst, src, src_at: SSE2_MEMMOVE(address(dst), src_at, len(src)),
    "copy_into": lambda dst, src, src_at: copy_into(dst, src, src_address=src_at),
}
if torch is not None:
    METHODS["torch"] = _torch
if SSE2_MEMMOVE is None:
    del METHODS["sse2"]


def source_ring(path: Path) -> tuple[mmap.mmap, int]:
    """RING random bytes in a /dev/shm file, mapped read-only, and the mapping's address."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, RING)
        with mmap.mmap(fd, RING) as writer:
            writer[:] = np.random.default_rng(7).integers(0, 256, RING, dtype=np.uint8).tobytes()
        ring = mmap.mmap(fd, RING, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
        path.unlink()
    return ring, address(memoryview(ring))


def destinations(size: int) -> list[Destination]:
    """Every destination kind, with ``RING // stride`` slots each."""
    stride = -(-(size + 64) // mmap.PAGESIZE) * mmap.PAGESIZE
    count = RING // stride
    pages = mmap.mmap(-1, count * stride)
    found = [
        Destination(f"page+{o}", [memoryview(pages)[i * stride + o :][:size] for i in range(count)], [pages])
        for o in PAGE_OFFSETS
    ]
    arrays = [np.empty(size, np.uint8) for _ in range(count)]
    found.append(Destination("numpy", [memoryview(a) for a in arrays], arrays))
    buffers = [bytearray(size) for _ in range(count)]
    found.append(Destination("bytearray", [memoryview(b) for b in buffers], buffers))
    if torch is not None:
        tensors = [torch.empty(size, dtype=torch.uint8) for _ in range(count)]
        found.append(Destination("torch", [memoryview(t.numpy()) for t in tensors], tensors))
    for dest in found:  # fault every page in now: a first touch inside a timed copy costs more than the copy
        for view in dest.slots:
            np.frombuffer(view, np.uint8).fill(1)
        # Hot copies use the first slot: make it one at a short page distance where the allocator gave any.
        dest.slots.sort(key=lambda view: not short_page_distance(address(view)))
    return found


@dataclass(slots=True)
class Cursor:
    """Next ring slots of cold copies: each copy moves to memory not touched lately."""

    source: int = 0
    destination: int = 0


def time_copies(
    copy: Copy, dest: Destination, src: memoryview, src_at: int, size: int, cold: bool, cursor: Cursor
) -> float:
    """Median seconds of one copy over COPIES_PER_ROUND copies (hot: after one untimed copy)."""
    slots = len(src) // size
    if not cold:
        copy(dest.slots[0], src[:size], src_at)
    seconds = []
    for _ in range(COPIES_PER_ROUND):
        s, d = (cursor.source % slots, cursor.destination % len(dest.slots)) if cold else (0, 0)
        cursor.source, cursor.destination = cursor.source + cold, cursor.destination + cold
        source, target = src[s * size : (s + 1) * size], dest.slots[d]
        started = time.perf_counter()
        copy(target, source, src_at + s * size)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def check(copy: Copy, name: str, dest: Destination, src: memoryview, src_at: int, size: int) -> None:
    """Every method copies every byte (checked once per destination, untimed)."""
    target = dest.slots[-1]
    target[:] = bytes(size)
    copy(target, src[size : 2 * size], src_at + size)
    if target != src[size : 2 * size]:
        raise SystemExit(f"{name} into {dest.name} copied the wrong bytes at {size} bytes")


def relative_alignment(dest: Destination, src_at: int, cold: bool) -> str:
    """(dst - src) mod 4096 of the hot slot; cold, how many of the slots lie at a short page
    distance (the source's slots are page-aligned, so each destination slot has one distance)."""
    if not cold:
        return str((address(dest.slots[0]) - src_at) % PAGE)
    short = sum(short_page_distance(address(view) - src_at) for view in dest.slots)
    return f"{short}/{len(dest.slots)} short"


def measure_size(size: int, src: memoryview, src_at: int, rounds: int, methods: list[str]) -> list[Cell]:
    dests = destinations(size)
    for dest in dests:
        for name in methods:
            check(METHODS[name], name, dest, src, src_at, size)
    cells = {
        (t, d.name, m): Cell(size, t, d.name, m, relative_alignment(d, src_at, t == "cold"))
        for t in ("hot", "cold")
        for d in dests
        for m in methods
    }
    order = [(t, d, m) for t in ("hot", "cold") for d in dests for m in methods]
    cursor = Cursor()
    for index in range(rounds):
        timed = {}
        for temperature, dest, name in order[::-1] if index % 2 else order:
            timed[temperature, dest.name, name] = time_copies(
                METHODS[name], dest, src, src_at, size, temperature == "cold", cursor
            )
        for (temperature, dest, name), seconds in timed.items():
            cell = cells[temperature, dest, name]
            cell.round_us.append(seconds * 1e6)
            cell.round_ratios.append(timed[(temperature, *REFERENCE)] / seconds)
        print(f"  {size // KiB} KiB round {index + 1}/{rounds}", file=sys.stderr, flush=True)
    return list(cells.values())


def rep_movsb_range() -> str:
    """glibc's rep movsb size range on this machine, as its loader reports it."""
    loader = "/lib64/ld-linux-x86-64.so.2"
    try:
        out = subprocess.run([loader, "--list-diagnostics"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    values = dict(line.split("=", 1) for line in out.splitlines() if "rep_movsb" in line and "=" in line)
    low = values.get("x86.cpu_features.rep_movsb_threshold")
    high = values.get("x86.cpu_features.rep_movsb_stop_threshold")
    return f"[{int(low, 16)}, {int(high, 16)}) bytes" if low and high else "unknown"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def markdown(cells: list[Cell], methods: list[str], meta: dict[str, Any]) -> str:
    lines = [
        f"# Copies ({meta['started']}, {meta['cpu']}, glibc {meta['glibc']}, rep movsb {meta['rep_movsb']}, "
        f"copy_into's short-distance route: {meta['copy_into_route']})",
        "",
        "GB/s (ratio to memcpy of equally aligned buffers, same rounds); d-s: (dst - src) mod 4096.",
        "",
    ]
    for size in dict.fromkeys(c.size for c in cells):
        for temperature in ("hot", "cold"):
            rows = [c for c in cells if c.size == size and c.temperature == temperature]
            if not rows:
                continue
            lines += [
                f"## {size // KiB} KiB, {temperature}",
                "",
                "| destination | d-s | " + " | ".join(methods) + " |",
                "|---|---|" + "---|" * len(methods),
            ]
            for dest in dict.fromkeys(c.destination for c in rows):
                by = {c.method: c for c in rows if c.destination == dest}
                values = " | ".join(f"{by[m].gbps:.1f} ({by[m].ratio:.2f})" for m in methods)
                lines.append(f"| {dest} | {by[methods[0]].relative_alignment} | {values} |")
            lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds instead of {ROUNDS}")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (overrides --quick)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="block sizes in bytes")
    results = Path(__file__).resolve().parents[1] / "results"
    parser.add_argument("--out", type=Path, default=results, help="output folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if unknown := set(methods) - set(METHODS):
        raise SystemExit(f"unknown methods: {', '.join(sorted(unknown))}")
    if "assign" not in methods:
        methods.insert(0, "assign")  # the reference
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    meta = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "glibc": platform.libc_ver()[1],
        "rep_movsb": rep_movsb_range(),
        "rounds": rounds,
        "copies_per_round": COPIES_PER_ROUND,
        "ring_bytes": RING,
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
    }
    ring, ring_at = source_ring(Path("/dev/shm") / f"kvpool-bench-copies-{os.getpid()}")
    copy_into(
        memoryview(bytearray(2 * client_copy.VECTOR_FROM))[1:][: client_copy.VECTOR_FROM],
        memoryview(ring)[: client_copy.VECTOR_FROM],
        ring_at,
    )  # the first misaligned copy measures the route
    meta["copy_into_route"] = "memcpy" if client_copy.route() is None else "sse2"
    cells: list[Cell] = []
    for size in (int(s) for s in args.sizes.split(",")):
        cells += measure_size(size, memoryview(ring), ring_at, rounds, methods)
    table = markdown(cells, methods, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "copies.md").write_text(table + "\n")
    rows = [asdict(c) | {"us": c.us, "gbps": c.gbps, "ratio": c.ratio} for c in cells]
    (args.out / "copies.json").write_text(json.dumps({"meta": meta, "cells": rows}, indent=1) + "\n")
    print(table)
    print(f"Wrote {args.out / 'copies.md'}, {args.out / 'copies.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
