"""What one benchmark cell does: its shape, the bytes of every block, keys and checksums.

Block contents come from a deterministic random *region* per worker (64 MiB, twice
the L3 cache, so reads and writes are cache-cold). A block is a window of its
worker's region: windows never overlap inside a region and regions differ between
workers, so every block a cell stores has unique bytes and a mixed-up key shows up
as a checksum mismatch. Expected checksums are taken from the region itself, never
from what a system sends back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache

import numpy as np
import xxhash

KiB = 1 << 10
MiB = 1 << 20
REGION_BYTES = 64 * MiB  # block contents per worker
RING_BYTES = 64 * MiB  # get destinations per worker, cycled through across bursts
MAX_BURST_OPS = 64  # ops between two barriers: short enough to stop a cell on time
MAX_WORKERS = 4
_PAGE = 4096
_SEED = 20240613
_KEY = struct.Struct(">8sIQ")  # cell tag, worker, sequence number: 20 bytes


@dataclass(frozen=True, slots=True)
class CellSpec:
    """One measurement: a system, an op and a shape, run by ``clients`` processes.

    Attributes:
        system: ``kvpool``, ``kvpool-shm``, ``redis``, ``socket`` or ``memcpy``.
        op: ``put``, ``get`` or ``copy`` (memcpy).
        endpoint: ``host:port`` of the system's server; empty for memcpy.
        server_pid: the server's process, whose CPU time per op is measured; None for memcpy.
        duration_s: each cell runs bursts until this much time has passed.
        tag: unique per cell in a run, so no two cells share a key.
    """

    system: str
    op: str
    block_size: int
    batch: int
    clients: int
    endpoint: str
    duration_s: float
    tag: bytes
    server_pid: int | None = None
    dest_offset: int = 0  # get destinations start this many bytes past a page (16: numpy's and bytearrays' usual)
    also_server_pids: tuple[int, ...] = ()  # more processes of the server, CPU summed with server_pid's

    @property
    def server_pids(self) -> tuple[int, ...]:
        """Every process whose CPU per op counts as the server's."""
        return (self.server_pid, *self.also_server_pids) if self.server_pid is not None else ()

    @property
    def op_bytes(self) -> int:
        return self.block_size * self.batch

    @property
    def ring_ops(self) -> int:
        """How many ops' destinations the ring holds at once."""
        return max(1, RING_BYTES // self.op_bytes)

    @property
    def burst_ops(self) -> int:
        """Ops per burst; each has its own destinations, verified after the burst."""
        return min(self.ring_ops, MAX_BURST_OPS)

    @property
    def windows(self) -> int:
        """Distinct blocks in a worker's region at this block size."""
        return REGION_BYTES // self.block_size


@dataclass(frozen=True, slots=True)
class BlockRef:
    """One block of an op: its key and where its bytes lie in the worker's region."""

    key: bytes
    offset: int


@cache
def region(worker: int) -> np.ndarray:
    """The deterministic random bytes worker ``worker``'s blocks are cut from.

    Page-aligned, as the arena's blocks are: memcpy's copies out of it into page-aligned
    destinations are copies between equally aligned buffers.
    """
    rng = np.random.default_rng(_SEED + worker)
    words = rng.integers(0, np.iinfo(np.uint64).max, REGION_BYTES // 8, dtype=np.uint64, endpoint=True)
    aligned = page_aligned(REGION_BYTES)
    aligned[:] = words.view(np.uint8)
    return aligned


def page_aligned(nbytes: int) -> np.ndarray:
    """``nbytes`` of memory starting on a page, faulted in (numpy's own arrays start 16
    bytes into a page)."""
    raw = np.ones(nbytes + _PAGE, dtype=np.uint8)  # ones, not empty: fault the pages in now
    start = -raw.ctypes.data % _PAGE
    return raw[start : start + nbytes]


def window(data: np.ndarray, offset: int, size: int) -> memoryview:
    return data[offset : offset + size].data


@cache
def checksums(worker: int, block_size: int) -> dict[int, int]:
    """xxh3-64 of every window of ``worker``'s region, by offset."""
    data = region(worker)
    offsets = range(0, REGION_BYTES - block_size + 1, block_size)
    return {o: xxhash.xxh3_64_intdigest(window(data, o, block_size)) for o in offsets}


class Plan:
    """Which blocks each op of a cell touches, for one worker.

    A get cycles over a working set of one key per window (stored before timing);
    a put writes a fresh key every time, its bytes cycling over the windows.
    """

    def __init__(self, spec: CellSpec, worker: int) -> None:
        self.spec = spec
        self.worker = worker

    def refs(self, op_index: int) -> list[BlockRef]:
        first = op_index * self.spec.batch
        return [self._ref(seq) for seq in range(first, first + self.spec.batch)]

    def working_set(self) -> list[BlockRef]:
        """The keys a get cell reads: one per window."""
        return [self._ref(seq) for seq in range(self.spec.windows)]

    def written(self, ops: int) -> list[BlockRef]:
        """Every key the first ``ops`` ops of this cell stored (for clean-up)."""
        if self.spec.op == "get":
            return self.working_set()
        if self.spec.op == "put":
            return [self._ref(seq) for seq in range(ops * self.spec.batch)]
        return []

    def sources(self, refs: list[BlockRef]) -> list[memoryview]:
        data = region(self.worker)
        return [window(data, r.offset, self.spec.block_size) for r in refs]

    def expected(self, ref: BlockRef) -> int:
        return checksums(self.worker, self.spec.block_size)[ref.offset]

    def _ref(self, seq: int) -> BlockRef:
        is_get = self.spec.op != "put"
        key_seq = seq % self.spec.windows if is_get else seq
        offset = (seq % self.spec.windows) * self.spec.block_size
        return BlockRef(_KEY.pack(self.spec.tag, self.worker, key_seq), offset)


class TargetRing:
    """Preallocated, pre-faulted get destinations, reused by every cell of a worker."""

    def __init__(self, nbytes: int = RING_BYTES) -> None:
        # Page-aligned, as torch tensors and pinned buffers are, plus a page for a cell's
        # ``dest_offset``: numpy's own arrays start 16 bytes into a page.
        self._data = page_aligned(nbytes + _PAGE)

    def slots(self, spec: CellSpec, burst: int) -> list[list[np.ndarray]]:
        """One list of ``batch`` block-sized views per op of burst number ``burst``, each
        ``spec.dest_offset`` bytes past a page (blocks are whole pages).

        Successive bursts move on through the ring, so destinations are cache-cold.
        """
        size, batch, shift = spec.block_size, spec.batch, spec.dest_offset
        ops = ((burst * spec.burst_ops + i) % spec.ring_ops for i in range(spec.burst_ops))
        return [[self._view((op * batch + i) * size + shift, size) for i in range(batch)] for op in ops]

    def _view(self, offset: int, size: int) -> np.ndarray:
        return self._data[offset : offset + size]


def poison(targets: list[list[np.ndarray]]) -> None:
    """Zero the first bytes of each destination, so a get that writes nothing fails verification."""
    for op_targets in targets:
        for target in op_targets:
            target[:8] = 0
