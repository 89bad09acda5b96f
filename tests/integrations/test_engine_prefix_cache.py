"""Local prefix cache at tiny capacity: exact page ids, hits, LRU eviction order, leak check."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.engine.prefix_cache import Evicted, OutOfPages, PrefixCache


@pytest.fixture
def cache() -> Iterator[PrefixCache]:
    pool = PrefixCache(4)
    yield pool
    pool.check_idle()  # every test must give back every page


def _fill(cache: PrefixCache, hashes: list[bytes]) -> list[int]:
    pages = cache.allocate(len(hashes)).pages
    for page, block_hash in zip(pages, hashes, strict=True):
        assert cache.register(page, block_hash)
    return pages


def test_allocation_takes_pages_in_order(cache: PrefixCache) -> None:
    first = cache.allocate(3)
    assert first.pages == [0, 1, 2] and first.evicted == []
    assert cache.free_pages == 1
    with pytest.raises(OutOfPages):
        cache.allocate(2)
    assert cache.free_pages == 1  # a failed allocation takes nothing
    cache.release(first.pages)


def test_a_released_chain_is_a_hit_until_evicted_tail_first(cache: PrefixCache) -> None:
    pages = _fill(cache, [b"A", b"B", b"C"])
    cache.release(pages)
    assert cache.match([b"A", b"B", b"C", b"D"]) == [0, 1, 2]
    assert cache.match([b"B"]) == [1]  # any cached hash; callers start at the chain's head
    # Blank page 3 goes first, then the chain's tail C before B before A.
    taken = cache.allocate(3)
    assert taken.pages == [3, 2, 1]
    assert taken.evicted == [Evicted(2, b"C", False), Evicted(1, b"B", False)]
    assert cache.match([b"A", b"B"]) == [0]
    cache.release(taken.pages)


def test_a_hit_takes_the_page_out_of_the_eviction_queue(cache: PrefixCache) -> None:
    pages = _fill(cache, [b"A", b"B"])
    cache.release(pages)
    hit = cache.match([b"A"])
    cache.acquire(hit)
    assert cache.free_pages == 3
    other = cache.allocate(3)  # evicts B, never A
    assert [e.block_hash for e in other.evicted] == [b"B"]
    assert cache.match([b"A"]) == [0]
    cache.release(hit)
    cache.release(other.pages)


def test_shared_page_is_freed_by_its_last_user(cache: PrefixCache) -> None:
    pages = _fill(cache, [b"A"])
    cache.acquire(pages)  # a second request on the same block
    cache.release(pages)
    assert cache.free_pages == 3
    cache.release(pages)
    assert cache.free_pages == 4


def test_least_recently_released_chain_goes_first(cache: PrefixCache) -> None:
    old = _fill(cache, [b"old"])
    new = _fill(cache, [b"new"])
    cache.release(old)
    cache.release(new)
    taken = cache.allocate(3)  # two blank pages, then the older block
    assert taken.pages == [2, 3, 0]
    assert taken.evicted == [Evicted(0, b"old", False)]
    cache.release(taken.pages)


def test_duplicate_blocks_and_pool_flags(cache: PrefixCache) -> None:
    first = _fill(cache, [b"A"])
    second = cache.allocate(1).pages
    assert not cache.register(second[0], b"A")  # the same block computed twice: one copy is cached
    cache.mark_in_pool(first)
    assert cache.in_pool(first[0]) and not cache.in_pool(second[0])
    cache.release(second)
    cache.release(first)
    assert cache.evict_all() == [Evicted(first[0], b"A", True)]
    assert cache.cached_blocks == 0


def test_disabled_cache_never_hits() -> None:
    cache = PrefixCache(2, enabled=False)
    pages = cache.allocate(1).pages
    assert not cache.register(pages[0], b"A")
    cache.release(pages)
    assert cache.match([b"A"]) == []
    cache.check_idle()


def test_leak_check_names_referenced_pages() -> None:
    cache = PrefixCache(3)
    cache.allocate(2)
    with pytest.raises(AssertionError, match=r"\[0, 1\]"):
        cache.check_idle()
