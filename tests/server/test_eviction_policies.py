"""Eviction order of both policies, alone and inside a tiny DRAM tier.

The tier holds sixteen 4 KiB blocks (64 KiB arena, one size class), so each test
can name the exact blocks that leave.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool_server.alloc.arena import SharedArena
from kvpool_server.alloc.slab import SlabAllocator
from kvpool_server.eviction import POLICIES, EvictionPolicy, LRUPolicy, PrefixAwarePolicy
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import DramTier

KiB = 1024
SLOTS = 16


def order(policy: EvictionPolicy, names: dict[int, str] | None = None) -> list[object]:
    """The eviction order, as names where the test gave its block ids names."""
    return [names[block] if names else block for block in policy.candidates()]


class Named:
    """Block ids for names, so a test reads as the blocks it means."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: dict[int, str] = {}

    def __call__(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.ids)
            self.names[self.ids[name]] = name
        return self.ids[name]


# -- the policies alone -----------------------------------------------------------


def test_lru_ignores_depth_and_follows_recency() -> None:
    lru, b = LRUPolicy(), Named()
    for key, depth in (("a", 5), ("b", 0), ("c", 9)):
        lru.insert(b(key), depth)
    lru.touch(b("a"))
    assert order(lru, b.names) == ["b", "c", "a"], order(lru, b.names)


def test_prefix_policy_evicts_the_deepest_first_within_an_epoch() -> None:
    policy, b = PrefixAwarePolicy(), Named()
    for depth in range(6):  # one chain, head first: all in one epoch
        policy.insert(b(f"d{depth}"), depth)
    assert order(policy, b.names) == ["d5", "d4", "d3", "d2", "d1", "d0"], order(policy, b.names)


def test_prefix_policy_keeps_a_fresh_tail_after_an_old_head_only_across_epochs() -> None:
    policy, b = PrefixAwarePolicy(epoch_share=1.0), Named()  # epochs of 16 operations
    policy.insert(b("old-head"), 0)
    for i in range(15):  # fill the first epoch
        policy.insert(b(f"filler{i}"), 0)
    policy.insert(b("new-tail"), 40)  # opens the second epoch
    victims = order(policy, b.names)
    assert victims.index("old-head") < victims.index("new-tail"), victims


def test_prefix_policy_touch_moves_a_block_to_the_current_epoch() -> None:
    policy, b = PrefixAwarePolicy(epoch_share=1.0), Named()
    for i in range(16):
        policy.insert(b(f"k{i}"), 0)
    policy.insert(b("late"), 0)  # second epoch
    policy.touch(b("k0"))  # k0 joins the second epoch, after "late"
    assert order(policy, b.names)[-2:] == ["late", "k0"], order(policy, b.names)
    assert len(policy) == 17


def test_prefix_policy_remove_and_reinsert() -> None:
    policy, b = PrefixAwarePolicy(), Named()
    policy.insert(b("a"), 3)
    policy.insert(b("a"), 0)  # a re-insert replaces the old place
    policy.remove(b("missing"))
    assert order(policy, b.names) == ["a"] and len(policy) == 1
    policy.remove(b("a"))
    assert order(policy) == [] and len(policy) == 0


@given(
    st.lists(
        st.tuples(st.sampled_from(["insert", "touch", "remove"]), st.integers(0, 40), st.integers(0, 300)), max_size=300
    )
)
def test_policies_hold_exactly_the_keys_inserted_and_not_removed(ops: list[tuple[str, int, int]]) -> None:
    for factory in POLICIES.values():
        policy, model = factory(), set()
        for op, key, depth in ops:
            if op == "insert":
                policy.insert(key, depth)
                model.add(key)
            elif op == "touch":
                policy.touch(key)
            else:
                policy.remove(key)
                model.discard(key)
        victims = order(policy)
        assert sorted(victims) == sorted(model) and len(victims) == len(set(victims)) == len(policy), (
            f"{factory.__name__}: candidates {victims}, expected {sorted(model)}"
        )


# -- inside the DRAM tier ------------------------------------------------------------


@pytest.fixture
def make_tier() -> Iterator[Callable[[Callable[[], EvictionPolicy]], DramTier]]:
    directory = tempfile.mkdtemp(prefix="kvpool-policy-")
    arenas: list[SharedArena] = []

    def make(policy: Callable[[], EvictionPolicy]) -> DramTier:
        arena = SharedArena(directory, f"kvpool-policy-{len(arenas)}", SLOTS * 4 * KiB, prefault=False)
        arenas.append(arena)
        return DramTier(arena, SlabAllocator(SLOTS * 4 * KiB, SLOTS * 4 * KiB), Counters(), policy_factory=policy)

    try:
        yield make
    finally:
        for arena in arenas:
            arena.close()
        shutil.rmtree(directory)


def put(tier: DramTier, chain: list[StoreKey], depths: range) -> None:
    """Commit blocks tail first, as the daemon does for a batched put."""
    entries = []
    for depth in depths:
        entry = tier.reserve(chain[depth], 4 * KiB, depth)
        assert isinstance(entry, BlockEntry), f"reserve {chain[depth]} -> {entry}"
        entries.append(entry)
    for entry in reversed(entries):
        tier.commit(entry)


def read(tier: DramTier, chain: list[StoreKey], depths: range) -> None:
    """Touch blocks tail first, as the daemon does for a batched get."""
    for depth in reversed(depths):
        entry = tier.acquire(chain[depth])
        assert entry is not None, f"{chain[depth]} missing"
        tier.release(entry)


def two_turns_then_other_traffic(tier: DramTier) -> list[int]:
    """Turn one puts 6 blocks of chain A; turn two reads them and puts 4 more; then
    10 blocks of other chains arrive, so 4 of A's must go. Returns A's surviving depths."""
    chain = [("ns", b"A%02d" % d) for d in range(10)]
    put(tier, chain, range(6))
    read(tier, chain, range(6))
    put(tier, chain, range(6, 10))
    for i in range(10):
        put(tier, [("ns", b"B%02d" % i)], range(1))
    return [d for d, key in enumerate(chain) if tier.contains(key)]


def test_lru_in_the_tier_leaves_a_tail_without_its_head(make_tier) -> None:
    survivors = two_turns_then_other_traffic(make_tier(LRUPolicy))
    # LRU drops the blocks read longest ago, depths 5..2, and keeps 6..9, which
    # nobody can reach any more without 2..5.
    assert survivors == [0, 1, 6, 7, 8, 9], survivors


def test_prefix_policy_in_the_tier_keeps_a_usable_prefix(make_tier) -> None:
    survivors = two_turns_then_other_traffic(make_tier(PrefixAwarePolicy))
    assert survivors == [0, 1, 2, 3, 4, 5], survivors
