"""Block copies (kvpool_client.core.channels.copy): every byte, whatever the sizes and offsets, by every route."""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_client.core.channels import copy
from kvpool_client.core.channels.copy import (
    PAGE,
    SHORT_DISTANCE,
    SSE2_MEMMOVE,
    VECTOR_FROM,
    Copier,
    address,
    measure_route,
)

KiB = 1024
GUARD = 64  # bytes either side of the destination window that a copy must leave alone
ROUTES = {
    "memcpy": Copier(None),
    "sse2": Copier(SSE2_MEMMOVE, measure=False),  # where absent: memcpy again, still checked
    "process": Copier(SSE2_MEMMOVE),
}
SIZES = st.one_of(
    st.sampled_from([0, 1, 63, 64, 65, VECTOR_FROM - 1, VECTOR_FROM, VECTOR_FROM + 1, 64 * KiB, 384 * KiB]),
    st.integers(0, 3 * VECTOR_FROM),
    st.integers(0, 400 * KiB),
)


def source_map(size: int) -> mmap.mmap:
    """A page-aligned mapping of random bytes (read through a read-only view, as a client reads the arena)."""
    writer = mmap.mmap(-1, max(size, 1))
    writer[:] = os.urandom(max(size, 1))
    return writer


@settings(max_examples=300, deadline=None)
@given(
    route=st.sampled_from(sorted(ROUTES)),
    size=SIZES,
    src_offset=st.integers(0, 127),
    distance=st.one_of(st.integers(1, SHORT_DISTANCE - 1), st.integers(0, PAGE - 1)),  # 1-63: the candidate's
    read_only=st.booleans(),
    hinted=st.booleans(),
)
def test_every_byte_lands_and_nothing_around_it_changes(
    route: str, size: int, src_offset: int, distance: int, read_only: bool, hinted: bool
) -> None:
    whole = bytearray(os.urandom(src_offset + size))
    src = memoryview(bytes(whole) if read_only else whole)[src_offset:]
    src_at = address(src) if size else 0
    before = os.urandom(GUARD + PAGE + size + GUARD)
    target = bytearray(before)
    start = GUARD + (src_at + distance - address(memoryview(target)) - GUARD) % PAGE  # dst - src = distance mod a page
    dst = memoryview(target)[start : start + size]
    ROUTES[route].copy_into(dst, src, src_at if hinted and size else None)
    seen = bytes(target)
    assert seen[start : start + size] == bytes(src), f"{route}: {size} bytes {distance} past the source differ"
    assert seen[:start] == before[:start], f"{route}: bytes before the window changed"
    assert seen[start + size :] == before[start + size :], f"{route}: bytes after it changed"


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("size", [VECTOR_FROM, 64 * KiB + 17, 384 * KiB, 2 * 1024 * KiB + 3])
@pytest.mark.parametrize("dst_offset", [0, 16, 64, 1])
def test_a_read_only_page_aligned_source_into_offsets_from_a_page(route: str, size: int, dst_offset: int) -> None:
    writer = source_map(size)
    reader = memoryview(writer).toreadonly()
    target = mmap.mmap(-1, size + 2 * mmap.PAGESIZE)
    dst = memoryview(target)[mmap.PAGESIZE + dst_offset :][:size]
    ROUTES[route].copy_into(dst, reader, address(reader))
    assert dst == reader, f"{route}: {size} bytes into page+{dst_offset} differ"
    assert target[: mmap.PAGESIZE + dst_offset] == bytes(mmap.PAGESIZE + dst_offset), "bytes before changed"


def test_lengths_that_differ_are_refused_before_any_byte_moves() -> None:
    target = bytearray(b"x" * 8192)
    with pytest.raises(ValueError, match="cannot copy 8191 bytes into 8192"):
        copy.copy_into(memoryview(target), memoryview(bytes(8191)))
    assert target == b"x" * 8192


def test_address_of_read_only_and_writable_views() -> None:
    buffer = bytearray(4096)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    assert address(memoryview(buffer)[17:]) == base + 17
    assert address(memoryview(buffer).toreadonly()[100:]) == base + 100
    with pytest.raises(ValueError, match="empty"):
        address(memoryview(b""))


def _nothing(dst: int, src: int, n: int) -> None:
    """A candidate infinitely faster than memcpy."""


def _by_64_bytes(dst: int, src: int, n: int) -> None:
    """A candidate far slower than memcpy: a Python loop of 64-byte memmoves."""
    for at in range(0, n, 64):
        ctypes.memmove(dst + at, src + at, min(64, n - at))


def test_the_route_is_the_candidate_only_when_it_is_clearly_faster() -> None:
    assert measure_route(_nothing) is _nothing
    assert measure_route(_by_64_bytes) is None
    assert measure_route(None) is None
    assert Copier(_by_64_bytes).route() is None and Copier(_by_64_bytes, measure=False).route() is _by_64_bytes


_COUNTER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
unsigned long kv_rep_range_calls;  /* memcpy/memmove calls in the sizes glibc may copy with rep movsb */
static void count(size_t n) { if (n > 2048) kv_rep_range_calls++; }
void *memcpy(void *d, const void *s, size_t n) {
  static void *(*real)(void *, const void *, size_t);
  if (!real) real = dlsym(RTLD_NEXT, "memcpy");
  count(n); return real(d, s, n);
}
void *memmove(void *d, const void *s, size_t n) {
  static void *(*real)(void *, const void *, size_t);
  if (!real) real = dlsym(RTLD_NEXT, "memmove");
  count(n); return real(d, s, n);
}
"""

_PROBE = r"""
import ctypes, mmap, sys
from kvpool_client.core.channels.copy import SSE2_MEMMOVE, Copier, address
calls = ctypes.c_ulong.in_dll(ctypes.CDLL(None), "kv_rep_range_calls")
sse2 = Copier(SSE2_MEMMOVE, measure=False)
source = mmap.mmap(-1, 1 << 20); source[:] = bytes(range(256)) * 4096
src = memoryview(source)[: 384 << 10].toreadonly()
target = mmap.mmap(-1, 2 << 20)
for offset in (0, 16, 64, 1, 2064):
    dst = memoryview(target)[offset : offset + len(src)]
    before = calls.value
    sse2.copy_into(dst, src, address(src))
    assert dst == src
    print(offset, calls.value - before)
"""


@pytest.mark.skipif(SSE2_MEMMOVE is None, reason="no glibc memcpy@GLIBC_2.2.5 here (another libc or CPU)")
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the memcpy counter")
def test_misaligned_copies_never_reach_the_memcpy_that_may_use_rep_movsb(tmp_path: Path) -> None:
    """Where rep movsb is slow the speed shows it; here a counting libc shim (LD_PRELOAD) does."""
    (tmp_path / "count.c").write_text(_COUNTER)
    shim = tmp_path / "count.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "count.c"), "-ldl"], check=True)
    env = dict(os.environ, LD_PRELOAD=str(shim), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    calls = dict(line.split() for line in run.stdout.splitlines())
    # Only a destination a few bytes past a page (+16, +1) is one rep movsb may copy slowly.
    assert calls == {"0": "1", "16": "0", "64": "1", "1": "0", "2064": "1"}, f"libc copies per offset: {calls}"
