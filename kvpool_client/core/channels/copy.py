"""Copies of blocks between buffers, fast whatever the relative alignment of the two.

glibc's x86-64 memcpy copies the sizes between its ``rep_movsb_threshold`` (about 2 KiB)
and its ``rep_movsb_stop_threshold`` (the L2 size on AMD, far more on Intel) with
``rep movsb``. On some CPUs (an AMD EPYC host under Debian's glibc 2.36; not the Zen 5
VM kvpool is developed on) that instruction is about ten times slower when source and
destination differ modulo 64 bytes: a 384 KiB copy into a buffer 16 bytes past a 64-byte
boundary took 205-250 us against 18-21 us equally aligned. The arena's blocks are
page-aligned and torch tensors 64-byte aligned, but numpy arrays and bytearrays are
16-byte aligned and a batch's views lie at any offset, and nobody can ask an engine's users to set ``GLIBC_TUNABLES``.

glibc keeps another copy routine callable: ``memcpy@GLIBC_2.2.5``, the symbol it keeps
for programs linked before 2.14, is its SSE2 ``memmove`` entry that never takes the
``rep movsb`` path (unaligned loads, aligned stores). Where ``rep movsb`` is fast it
is the slower of the two (0.5-0.8x memcpy on that VM), so a process measures both
once, on its first large copy (:func:`measure_route`, ~0.3 ms), and sends the
relatively misaligned copies of :data:`VECTOR_FROM` bytes or more through that entry
only where memcpy is clearly slower. Every other copy is a memoryview assignment
(memcpy). ``bench/copies.py`` measures these against the alternatives (numpy, torch,
chunked and split copies).
"""

from __future__ import annotations

import ctypes
import platform
import time
from collections.abc import Callable

CACHE_LINE = 64
# Below ~2 KiB glibc copies with vector loops anyway; up to here a slow rep movsb costs
# less than the ctypes call (~0.3 us) that avoids it.
VECTOR_FROM = 4 << 10
PROBE_BYTES = 256 << 10  # inside every CPU's rep movsb range, inside L2: measures the instruction, not DRAM
PROBE_ROUNDS = 5
CLEARLY_SLOWER = 1.5  # memcpy must be this much slower before misaligned copies leave it

Memmove = Callable[[int, int, int], object]  # (dst address, src address, bytes)


def _sse2_memmove() -> Memmove | None:
    """glibc's ``memcpy@GLIBC_2.2.5`` (``__memmove_sse2_unaligned``); None where absent."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        dlvsym = ctypes.CDLL(None).dlvsym  # in libc since glibc 2.34, in libdl before
    except AttributeError:
        try:
            dlvsym = ctypes.CDLL("libdl.so.2").dlvsym
        except (OSError, AttributeError):
            return None  # not glibc
    dlvsym.restype = ctypes.c_void_p
    dlvsym.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
    found = dlvsym(None, b"memcpy", b"GLIBC_2.2.5")  # None: RTLD_DEFAULT, the process's libc
    if not found:
        return None
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(found)


SSE2_MEMMOVE = _sse2_memmove()


class Copier:
    """Copies buffers, sending relatively misaligned copies of :data:`VECTOR_FROM` bytes or
    more through ``candidate`` where it is the faster route.

    Args:
        candidate: a memmove that avoids ``rep movsb``; None: memcpy for every copy.
        measure: find out on the first copy of :data:`VECTOR_FROM` bytes or more whether
            ``candidate`` is faster here (:func:`measure_route`); False: use it without measuring.
    """

    __slots__ = ("_candidate", "_misaligned", "_measured")

    def __init__(self, candidate: Memmove | None, measure: bool = True) -> None:
        self._candidate = candidate
        self._misaligned = candidate
        self._measured = not measure or candidate is None

    def route(self) -> Memmove | None:
        """What relatively misaligned copies go through; None: memcpy."""
        if not self._measured:
            self._misaligned, self._measured = measure_route(self._candidate), True
        return self._misaligned

    def copy_into(self, dst: memoryview, src: memoryview, src_address: int | None = None) -> None:
        """Copy every byte of ``src`` into ``dst``.

        Args:
            dst: a writable, C-contiguous buffer of ``src``'s length in bytes.
            src: the bytes to copy, C-contiguous (read-only allowed); must not overlap ``dst``.
            src_address: where ``src`` starts in memory, when the caller knows it (finding
                a read-only buffer's address costs ~1.5 us).

        Raises:
            ValueError: the lengths differ.
        """
        n = src.nbytes
        if dst.nbytes != n:
            raise ValueError(f"cannot copy {n} bytes into {dst.nbytes}")
        if n < VECTOR_FROM or self.route() is None:  # where memcpy is fast whatever the alignment: no address needed
            dst[:] = src
            return
        to = ctypes.addressof(ctypes.c_char.from_buffer(dst))
        start = src_address if src_address is not None else address(src)
        misaligned = None if (to - start) % CACHE_LINE == 0 else self.route()
        if misaligned is None:
            dst[:] = src
        else:
            misaligned(to, start, n)


_PROCESS = Copier(SSE2_MEMMOVE)
copy_into = _PROCESS.copy_into  # what the client's copies use
route = _PROCESS.route


def measure_route(candidate: Memmove | None) -> Memmove | None:
    """``candidate`` if it copies a misaligned buffer clearly faster than memcpy here, else None.

    Both copy :data:`PROBE_BYTES` into a destination 16 bytes past where the source's
    alignment would put it, interleaved, best of :data:`PROBE_ROUNDS` each; a pause of
    the process can only make one look slower, which the margin absorbs.
    """
    if candidate is None:
        return None
    src, dst = bytearray(PROBE_BYTES + CACHE_LINE), bytearray(PROBE_BYTES + 2 * CACHE_LINE)
    src_at, dst_at = address(memoryview(src)), address(memoryview(dst))
    s = -src_at % CACHE_LINE
    d = -dst_at % CACHE_LINE + 16
    source, target = memoryview(src)[s : s + PROBE_BYTES], memoryview(dst)[d : d + PROBE_BYTES]
    best_memcpy = best_candidate = float("inf")
    for _ in range(PROBE_ROUNDS):
        started = time.perf_counter()
        target[:] = source
        middle = time.perf_counter()
        candidate(dst_at + d, src_at + s, PROBE_BYTES)
        ended = time.perf_counter()
        best_memcpy, best_candidate = min(best_memcpy, middle - started), min(best_candidate, ended - middle)
    return candidate if best_memcpy > CLEARLY_SLOWER * best_candidate else None


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (Include/pybuffer.h, in the limited API since 3.11)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = (ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = (ctypes.POINTER(_PyBuffer),)
_release_buffer.restype = None


def address(view: memoryview) -> int:
    """Where ``view``'s first byte lies in memory; read-only views included (ctypes alone
    maps writable buffers only).

    Raises:
        ValueError: ``view`` is empty.
    """
    if not view.nbytes:
        raise ValueError("an empty buffer has no address")
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    found = _PyBuffer()
    _get_buffer(view, ctypes.byref(found), 0)  # PyBUF_SIMPLE: never fails for a memoryview
    try:
        return int(found.buf)
    finally:
        _release_buffer(ctypes.byref(found))
