"""Mooncake Store's client side in the block benchmark, one driver per way of reading it.

Each worker process imports ``mooncake.store`` from the locked venv (bench/mooncake_peer/env.py)
and opens one ``MooncakeDistributedStore`` per driver: over TCP with no segment of its own
(``setup`` with a global segment of 0 bytes: a local segment would serve reads by memcpy),
or in same-host mode (``setup_dummy`` attached to the store node). Keys are the benchmark's
key bytes in hex. Three behaviours of Mooncake shape these drivers:

- ``put`` of an existing key succeeds without storing the new bytes: the harness gives every
  cell fresh keys (a new tag per cell and per retry), so no put meets an old key.
- an object read within the last lease (10 s by default) refuses a plain ``remove``: clean-up
  removes with ``force`` and counts a key the store already evicted as gone.
- a batch naming one key twice fills only one of its destinations: a benchmark batch never
  repeats a key.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.harness.drivers import BenchError, Driver
from bench.harness.workload import RING_BYTES, BlockRef, MiB
from bench.mooncake_peer import SYSTEMS
from bench.mooncake_peer.env import installed

LOCAL_BUFFER_BYTES = 128 * MiB  # a client's transfer buffer: the bytes API stages whole batches (32 x 2 MiB) here
RING_POOL_BYTES = RING_BYTES + 2 * 4096  # same-host destinations: a ring as big as the harness's, from a page on
POOL_BYTES = RING_POOL_BYTES + 16 * MiB  # a same-host client's shared pool (setup_dummy's mem_pool_size)
OBJECT_NOT_FOUND = -704  # Mooncake's error code for a key it does not hold
_PAGE = 4096
_REMOVE_CHUNK = 1024


def open_mooncake(system: str, endpoint: str) -> Driver:
    """Connect ``system``'s driver: ``endpoint`` is the master (TCP) or the store node (same-host).

    Raises:
        BenchError: Mooncake is not installed, or its set-up failed.
        ValueError: not a Mooncake system.
    """
    if system not in SYSTEMS:
        raise ValueError(f"not a Mooncake system: {system!r}")
    if system in ("mooncake", "mooncake-zc"):
        store = _connect(endpoint)
        return BytesDriver(store) if system == "mooncake" else ZeroCopyDriver(store)
    store = _attach(endpoint)
    return BytesDriver(store) if system == "mooncake-local" else PoolDriver(store)


def _store_class() -> Any:
    install = installed()
    if install is None:
        raise BenchError("mooncake's venv is not built (bench/mooncake_peer/env.py builds it before the run)")
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")  # its INFO lines would flood the benchmark's output
    if str(install.site_packages) not in sys.path:
        sys.path.append(str(install.site_packages))  # after the project's own packages
    from mooncake.store import MooncakeDistributedStore

    return MooncakeDistributedStore


def _connect(master: str) -> Any:
    store = _store_class()()
    code = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, LOCAL_BUFFER_BYTES, "tcp", "", master)
    _keep_ignoring_sigint()
    if code != 0:
        raise BenchError(f"mooncake setup against master {master} failed with {code}")
    return store


def _attach(store_node: str) -> Any:
    store = _store_class()()
    code = store.setup_dummy(POOL_BYTES, LOCAL_BUFFER_BYTES, store_node)
    _keep_ignoring_sigint()
    if code != 0:
        raise BenchError(f"mooncake setup_dummy attached to {store_node} failed with {code}")
    return store


def _keep_ignoring_sigint() -> None:
    """Mooncake installs its own SIGINT handler; a worker leaves Ctrl-C to the benchmark."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _MooncakeDriver:
    stores = True

    def __init__(self, store: Any) -> None:
        self._store = store

    def prepare(self, refs: list[BlockRef], block_size: int) -> Any:
        return [r.key.hex() for r in refs]

    def forget(self, refs: list[BlockRef]) -> None:
        for start in range(0, len(refs), _REMOVE_CHUNK):
            keys = self.prepare(refs[start : start + _REMOVE_CHUNK], 0)
            failed = [c for c in self._store.batch_remove(keys, True) if c not in (0, OBJECT_NOT_FOUND)]
            if failed:
                raise BenchError(f"mooncake remove failed for {len(failed)}/{len(keys)} keys: {failed[:3]}")

    def close(self) -> None:
        self._store.close()

    def _put_bytes(self, request: Any, sources: Sequence[memoryview]) -> None:
        if len(request) == 1:
            code = self._store.put(request[0], sources[0])
        else:
            code = self._store.put_batch(request, list(sources))
        if code != 0:
            raise BenchError(f"mooncake put of {len(request)} keys failed with {code}")


class BytesDriver(_MooncakeDriver):
    """The bytes API: ``get`` and ``get_batch`` return new ``bytes``, copied into the destination
    (as the Redis driver does: an engine wants the block in its own buffer)."""

    def put(self, request: Any, sources: Sequence[memoryview]) -> None:
        self._put_bytes(request, sources)

    def get(self, request: Any, targets: Sequence[np.ndarray]) -> Sequence[Any]:
        values = [self._store.get(request[0])] if len(request) == 1 else self._store.get_batch(request)
        for target, value in zip(targets, values, strict=True):
            if len(value) != target.nbytes:  # a miss reads as empty bytes
                raise BenchError(f"mooncake returned {len(value)} bytes for a {target.nbytes}-byte block")
            target[:] = np.frombuffer(value, dtype=np.uint8)
        return targets


class ZeroCopyDriver(_MooncakeDriver):
    """The zero-copy API: ``register_buffer`` on the memory behind sources and destinations (once
    per buffer), then ``put_from``/``batch_put_from`` and ``get_into``/``batch_get_into``."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self._registered: set[int] = set()

    def put(self, request: Any, sources: Sequence[memoryview]) -> None:
        arrays = [np.frombuffer(s, dtype=np.uint8) for s in sources]
        addresses = [self._registered_address(a, s.obj) for a, s in zip(arrays, sources, strict=True)]
        if len(request) == 1:
            codes = [self._store.put_from(request[0], addresses[0], arrays[0].nbytes)]
        else:
            codes = self._store.batch_put_from(request, addresses, [a.nbytes for a in arrays])
        if any(codes):
            raise BenchError(f"mooncake put_from of {len(request)} keys failed: {[c for c in codes if c][:3]}")

    def get(self, request: Any, targets: Sequence[np.ndarray]) -> Sequence[Any]:
        addresses = [self._registered_address(t, t) for t in targets]
        if len(request) == 1:
            read = [self._store.get_into(request[0], addresses[0], targets[0].nbytes)]
        else:
            read = self._store.batch_get_into(request, addresses, [t.nbytes for t in targets])
        _check_read(read, targets)
        return targets

    def _registered_address(self, view: np.ndarray, holder: object) -> int:
        """``view``'s address, registering the whole array that owns its memory the first time."""
        owner = _owner(holder)
        base = int(owner.ctypes.data)
        if base not in self._registered:
            code = self._store.register_buffer(base, owner.nbytes)
            if code != 0:
                raise BenchError(f"mooncake register_buffer of {owner.nbytes} bytes failed with {code}")
            self._registered.add(base)
        return int(view.ctypes.data)


class PoolDriver(_MooncakeDriver):
    """Same-host zero-copy: ``get_into``/``batch_get_into`` into a ring of Mooncake's shared pool.

    In same-host mode ``register_buffer`` accepts only pool memory, so gets land in the pool
    (each block as far past a page as its destination would be) and the pool views are what
    the harness verifies; nothing is copied into the destinations. Puts use the bytes API:
    the blocks' sources are not pool memory.
    """

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        address = store.alloc_from_mem_pool(RING_POOL_BYTES)
        if not address or store.register_buffer(address, RING_POOL_BYTES) != 0:
            raise BenchError(f"mooncake could not allocate and register {RING_POOL_BYTES} bytes of its pool")
        self._pool = np.ctypeslib.as_array((ctypes.c_uint8 * RING_POOL_BYTES).from_address(address))
        self._ring = PoolRing(address)

    def put(self, request: Any, sources: Sequence[memoryview]) -> None:
        self._put_bytes(request, sources)

    def get(self, request: Any, targets: Sequence[np.ndarray]) -> Sequence[Any]:
        slots = [self._slot(t) for t in targets]
        addresses = [int(s.ctypes.data) for s in slots]
        if len(request) == 1:
            read = [self._store.get_into(request[0], addresses[0], slots[0].nbytes)]
        else:
            read = self._store.batch_get_into(request, addresses, [s.nbytes for s in slots])
        _check_read(read, slots)
        return slots

    def _slot(self, target: np.ndarray) -> np.ndarray:
        offset = self._ring.next(target.nbytes, int(target.ctypes.data) % _PAGE)
        return self._pool[offset : offset + target.nbytes]


class PoolRing:
    """Where the next block goes in a ring of ``RING_POOL_BYTES`` starting at ``address``.

    Blocks follow each other from the ring's first page, each shifted as far past a page as
    its destination is, and the ring wraps after ``RING_BYTES // size`` blocks: as many as the
    harness's own ring holds, so no block of a burst overwrites another before it is verified.
    """

    def __init__(self, address: int) -> None:
        self._start = -address % _PAGE  # offset of the ring's first page
        self._taken = 0

    def next(self, size: int, shift: int) -> int:
        """The offset from ``address`` of the next ``size``-byte block, ``shift`` bytes past a page."""
        index = self._taken % (RING_BYTES // size)
        self._taken += 1
        return self._start + index * size + shift


def _owner(holder: object) -> np.ndarray:
    """The array that owns ``holder``'s memory (numpy views keep it as ``base``)."""
    array = holder if isinstance(holder, np.ndarray) else np.asarray(holder)
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _check_read(read: Sequence[int], targets: Sequence[np.ndarray]) -> None:
    """Raises BenchError unless every block read exactly its size (errors are negative codes)."""
    short = [(n, t.nbytes) for n, t in zip(read, targets, strict=True) if n != t.nbytes]
    if short:
        raise BenchError(f"mooncake read {len(short)}/{len(targets)} blocks short (bytes read, size): {short[:3]}")
