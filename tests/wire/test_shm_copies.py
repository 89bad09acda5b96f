"""Same-node gets copied out of a live daemon's arena into destinations of every alignment.

The arena's blocks are page-aligned; destinations are at offsets 0, 16, 64 and 1 from a
page, numpy arrays and bytearrays (16-byte aligned), torch tensors (64-byte aligned) and a
batch's views into one buffer at odd offsets. Each get runs by the copy route this process
measured and by glibc's rep-movsb-free SSE2 memmove forced on (the route CPUs with a slow
misaligned ``rep movsb`` take), and every byte is checked against what was put.
"""

from __future__ import annotations

import mmap
import os
import random
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from kvpool_client.core.channels.copy import SSE2_MEMMOVE, Copier
from kvpool_client.transport import shm
from tests.support.daemon import DaemonProcess, running_daemon

pytestmark = pytest.mark.integration

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB + 1, 64 * KiB, 384 * KiB, MiB + 17]
ROUTES = [
    "measured",
    pytest.param("sse2", marks=pytest.mark.skipif(SSE2_MEMMOVE is None, reason="no glibc memcpy@GLIBC_2.2.5 here")),
]


@pytest.fixture(scope="module")
def node() -> Iterator[DaemonProcess]:
    with running_daemon("--dram-capacity", "64MiB", "--slab-size", "2MiB") as daemon:
        yield daemon


@pytest.fixture(params=ROUTES)
def client(
    node: DaemonProcess, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[KVPoolClient]:
    if request.param == "sse2":
        monkeypatch.setattr(shm, "copy_into", Copier(SSE2_MEMMOVE, measure=False).copy_into)
    # No checksum verification: a bad copy would be read again over tcp and pass unseen.
    config = ClientConfig(nodes=(node.address,), transport="shm", verify_checksums=False)
    with KVPoolClient(config=config) as c:
        assert c.transport(node.address) == "shm"
        yield c


Stored = tuple[list[BlockKey], list[bytes]]


@pytest.fixture
def stored(client: KVPoolClient) -> Stored:
    ns = f"cp-{uuid.uuid4().hex[:12]}@u8@raw@tp0of1"
    keys = [BlockKey(ns, os.urandom(32)) for _ in SIZES]
    blocks = [random.Random(key.hash).randbytes(size) for key, size in zip(keys, SIZES, strict=True)]
    assert client.put(keys, blocks).stored == len(keys)
    return keys, blocks


@pytest.mark.parametrize("offset", [0, 16, 64, 1])
def test_gets_into_offsets_from_a_page(client: KVPoolClient, stored: Stored, offset: int) -> None:
    keys, blocks = stored
    pages = [mmap.mmap(-1, size + 2 * mmap.PAGESIZE) for size in SIZES]
    targets = [memoryview(m)[mmap.PAGESIZE + offset :][:size] for m, size in zip(pages, SIZES, strict=True)]
    got = client.get(keys, targets)
    assert got.ok, got
    for target, block, page in zip(targets, blocks, pages, strict=True):
        assert target == block, f"{len(block)} bytes into page+{offset} differ"
        assert page[: mmap.PAGESIZE + offset] == bytes(mmap.PAGESIZE + offset), "bytes before the target changed"


def test_gets_into_numpy_arrays_bytearrays_and_tensors(client: KVPoolClient, stored: Stored) -> None:
    keys, blocks = stored
    into_numpy = [np.empty(size, np.uint8) for size in SIZES]
    into_bytearrays = [bytearray(size) for size in SIZES]
    into_torch = [torch.empty(size, dtype=torch.uint8) for size in SIZES]
    for targets in (into_numpy, into_bytearrays, into_torch):
        assert client.get(keys, targets).ok
    assert [a.tobytes() for a in into_numpy] == blocks
    assert [bytes(b) for b in into_bytearrays] == blocks
    assert [t.numpy().tobytes() for t in into_torch] == blocks


def test_a_batch_into_views_of_one_buffer_at_odd_offsets(client: KVPoolClient, stored: Stored) -> None:
    keys, blocks = stored
    whole = bytearray(sum(SIZES) + 3 * len(SIZES))
    views, at = [], 3
    for size in SIZES:
        views.append(memoryview(whole)[at : at + size])
        at += size + 3
    assert client.get(keys, views).ok
    assert [bytes(v) for v in views] == blocks
    assert whole[:3] == b"\0\0\0", "bytes before the first view changed"
