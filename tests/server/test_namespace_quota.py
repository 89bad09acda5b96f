"""Per-namespace DRAM quota: a namespace past its quota evicts its own blocks, never another's."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from kvpool_client.core.errors import ErrorCode
from kvpool_server.alloc.arena import SharedArena
from kvpool_server.alloc.slab import SlabAllocator
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import DramTier
from kvpool_server.tiers.quotas import QuotaGroup

KiB = 1024
BLOCK = 4 * KiB


@pytest.fixture
def tier() -> Iterator[DramTier]:
    directory = tempfile.mkdtemp(prefix="kvpool-quota-")
    arena = SharedArena(directory, "kvpool-quota", 64 * KiB, prefault=False)
    try:  # 16 slots in all; 3 per namespace
        yield DramTier(arena, SlabAllocator(64 * KiB, 16 * KiB), Counters(), namespace_quota=3 * BLOCK)
    finally:
        arena.close()
        shutil.rmtree(directory)


def put(tier: DramTier, key: StoreKey) -> BlockEntry | ErrorCode:
    entry = tier.reserve(key, BLOCK)
    if isinstance(entry, BlockEntry):
        tier.commit(entry)
    return entry


def held(tier: DramTier, namespace: str) -> list[bytes]:
    return sorted(k[1] for k in tier.readable_keys() if k[0] == namespace)


def test_a_namespace_past_its_quota_evicts_its_own_oldest_blocks(tier: DramTier) -> None:
    for i in range(3):
        put(tier, ("quiet", b"q%d" % i))
    for i in range(6):
        assert isinstance(put(tier, ("noisy", b"n%d" % i)), BlockEntry)
    assert held(tier, "noisy") == [b"n3", b"n4", b"n5"], held(tier, "noisy")
    assert held(tier, "quiet") == [b"q0", b"q1", b"q2"], "another namespace's blocks must stay"


def test_a_read_keeps_a_block_against_its_own_namespace(tier: DramTier) -> None:
    for i in range(3):
        put(tier, ("ns", b"%d" % i))
    found = tier.acquire(("ns", b"0"))  # the oldest becomes the most recent
    assert found is not None
    tier.release(found)
    put(tier, ("ns", b"3"))
    assert held(tier, "ns") == [b"0", b"2", b"3"], held(tier, "ns")


def test_quota_exceeded_when_every_block_of_the_namespace_is_pinned(tier: DramTier) -> None:
    writing = [tier.reserve(("ns", b"%d" % i), BLOCK) for i in range(3)]  # being written: pinned
    assert all(isinstance(w, BlockEntry) for w in writing)
    assert put(tier, ("ns", b"x")) is ErrorCode.QUOTA_EXCEEDED
    assert isinstance(put(tier, ("other", b"y")), BlockEntry), "other namespaces are not held back"
    for entry in writing:
        assert isinstance(entry, BlockEntry)
        tier.abort(entry)
    assert isinstance(put(tier, ("ns", b"x")), BlockEntry), "aborted reservations give their quota back"


def test_a_group_quota_bounds_every_namespace_it_covers_together() -> None:
    """A tenant's quota over the namespaces it writes: its two namespaces share 4 slots, others are untouched."""
    directory = tempfile.mkdtemp(prefix="kvpool-quota-")
    arena = SharedArena(directory, "kvpool-quota", 64 * KiB, prefault=False)
    group = QuotaGroup("tenant a", 4 * BLOCK, lambda namespace: namespace.startswith("a."))
    tier = DramTier(
        arena,
        SlabAllocator(64 * KiB, 16 * KiB),
        Counters(),
        namespace_quota=3 * BLOCK,
        group_quotas=lambda namespace: [group] if group.covers(namespace) else [],
    )
    try:
        for i in range(4):
            put(tier, ("other", b"o%d" % i))
        for i in range(3):
            put(tier, ("a.x", b"x%d" % i))
        for i in range(3):
            assert isinstance(put(tier, ("a.y", b"y%d" % i)), BlockEntry)
        assert len(held(tier, "a.x")) + len(held(tier, "a.y")) == 4, (held(tier, "a.x"), held(tier, "a.y"))
        assert held(tier, "a.y") == [b"y0", b"y1", b"y2"], "the group's least recent blocks went first"
        assert held(tier, "other") == [b"o1", b"o2", b"o3"], "its own namespace quota, not the group's"
    finally:
        del tier
        arena.close()
        shutil.rmtree(directory)
