"""Copies of blocks between buffers, fast whatever the relative alignment of the two.

glibc's x86-64 memcpy copies the sizes between its ``rep_movsb_threshold`` (about 2 KiB)
and its ``rep_movsb_stop_threshold`` (the L2 size on AMD, far more on Intel) with
``rep movsb``. On some CPUs (AMD EPYC hosts under Debian's glibc 2.36, the VM kvpool is
developed on included, some days) that instruction runs far slower when the destination
lies a few bytes past the source modulo a page (0 < (dst - src) mod 4096 < 32 where it was
seen). That is exactly a page-aligned arena slot copied into a large numpy array (malloc
maps those and returns the page's address plus 16), and nobody can ask an engine's users
to set ``GLIBC_TUNABLES``. Torch tensors (64-byte aligned, from their own allocator)
rarely are.

glibc keeps another copy routine callable: ``memcpy@GLIBC_2.2.5``, the symbol it keeps
for programs linked before 2.14, is its SSE2 ``memmove`` entry that never takes the
``rep movsb`` path (unaligned loads, aligned stores). Where ``rep movsb`` is fast it
is the slower of the two, so a process measures both once, on its first large copy
(:func:`measure_route`), and sends copies of :data:`VECTOR_FROM` bytes or more at a
short page distance (:func:`short_page_distance`) through that entry only where memcpy
is clearly slower for them. Every other copy is a memoryview assignment (memcpy).
``bench/studies/copies.py`` measures these against the alternatives (numpy, torch, chunked and
split copies).
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import time
from collections.abc import Callable

PAGE = 4096
SHORT_DISTANCE = 64  # page distances below this (but 0) take the candidate; 1-31 measured slow, the rest for margin
# Below ~2 KiB glibc copies with vector loops anyway; up to here a slow rep movsb costs
# less than the ctypes call that avoids it.
VECTOR_FROM = 4 << 10
PROBE_BYTES = 256 << 10  # inside every CPU's rep movsb range, inside L2: measures the instruction, not DRAM
PROBE_DISTANCE = 16  # the probe's destination lies this far past its source modulo a page, as a numpy array's data
PROBE_ROUNDS = 5
CLEARLY_SLOWER = 1.5  # memcpy must be this much slower before copies at a short page distance leave it

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
    """Copies buffers, sending copies of :data:`VECTOR_FROM` bytes or more at a short page
    distance through ``candidate`` where it is the faster route.

    Args:
        candidate: a memmove that avoids ``rep movsb``; None: memcpy for every copy.
        measure: find out on the first copy of :data:`VECTOR_FROM` bytes or more whether
            ``candidate`` is faster here (:func:`measure_route`); False: use it without measuring.
    """

    __slots__ = ("_candidate", "_route", "_measured")

    def __init__(self, candidate: Memmove | None, measure: bool = True) -> None:
        self._candidate = candidate
        self._route = candidate
        self._measured = not measure or candidate is None

    def route(self) -> Memmove | None:
        """What copies at a short page distance go through; None: memcpy."""
        if not self._measured:
            self._route, self._measured = measure_route(self._candidate), True
        return self._route

    def copy_into(self, dst: memoryview, src: memoryview, src_address: int | None = None) -> None:
        """Copy every byte of ``src`` into ``dst``.

        Args:
            dst: a writable, C-contiguous buffer of ``src``'s length in bytes.
            src: the bytes to copy, C-contiguous (read-only allowed); must not overlap ``dst``.
            src_address: where ``src`` starts in memory, when the caller knows it (finding
                a read-only buffer's address takes a buffer request through ctypes).

        Raises:
            ValueError: the lengths differ.
        """
        n = src.nbytes
        if dst.nbytes != n:
            raise ValueError(f"cannot copy {n} bytes into {dst.nbytes}")
        route = self.route() if n >= VECTOR_FROM else None
        if route is None:  # memcpy is fast here whatever the distance: no address needed
            dst[:] = src
            return
        to = ctypes.addressof(ctypes.c_char.from_buffer(dst))
        start = src_address if src_address is not None else address(src)
        if short_page_distance(to - start):
            route(to, start, n)
        else:
            dst[:] = src


def short_page_distance(distance: int) -> bool:
    """Whether a copy ``distance`` bytes ahead of its source (modulo a page) is one that
    ``rep movsb`` may copy slowly (see the module's doc)."""
    return 0 < distance % PAGE < SHORT_DISTANCE


_PROCESS = Copier(SSE2_MEMMOVE)
copy_into = _PROCESS.copy_into  # what the client's copies use
route = _PROCESS.route


def measure_route(candidate: Memmove | None) -> Memmove | None:
    """``candidate`` if it copies at a short page distance clearly faster than memcpy here, else None.

    Both copy :data:`PROBE_BYTES` from the start of a page of one mapping to
    :data:`PROBE_DISTANCE` bytes past a page of another, interleaved, best of
    :data:`PROBE_ROUNDS` each; a pause of the process can only make one look slower,
    which the margin absorbs. The pages are written first: unwritten ones all map the
    kernel's one zero page, which no real copy reads from.
    """
    if candidate is None:
        return None
    with mmap.mmap(-1, PROBE_BYTES) as src, mmap.mmap(-1, PROBE_BYTES + PAGE) as dst:
        src.write(bytes(range(256)) * (PROBE_BYTES // 256))
        source, target = memoryview(src), memoryview(dst)[PROBE_DISTANCE : PROBE_DISTANCE + PROBE_BYTES]
        src_at, dst_at = address(source), address(target)
        target[:] = source  # faults the destination's pages in
        best_memcpy = best_candidate = float("inf")
        for _ in range(PROBE_ROUNDS):
            started = time.perf_counter()
            target[:] = source
            middle = time.perf_counter()
            candidate(dst_at, src_at, PROBE_BYTES)
            ended = time.perf_counter()
            best_memcpy, best_candidate = min(best_memcpy, middle - started), min(best_candidate, ended - middle)
        del source, target  # the mappings close only once no view is left
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
