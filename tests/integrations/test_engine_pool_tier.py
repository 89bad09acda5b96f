"""The reference engine's connector to the pool (bench/engine/pool_tier.py): what it asks, loads and saves.

The pool here is an in-memory stand-in with the client's put/get/lookup contract, so the
tier's own logic is tested without sockets (tests/integrations/test_engine_pool.py uses a
real daemon).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from bench.engine.pages import PagedKVCache
from bench.engine.pool_tier import PoolTier, SavePolicy
from bench.engine.prefix_cache import Evicted
from kvpool_client import BlockKey, BlockKeyBuilder, ErrorCode
from kvpool_client.integrations.namespaces import KVLayout
from kvpool_client.results import GetResult, PutResult

LAYOUT = KVLayout(layers=2, kv_heads=2, head_dim=4, block_size=4, dtype="fp32")
NS = LAYOUT.namespace("tiny-model")
KEYS = BlockKeyBuilder(NS, LAYOUT.block_size, seed="0").keys(list(range(1, 19)))  # 4 full blocks


class MemoryPool:
    """put-if-absent / get / lookup over a dict, returning the client's result types."""

    def __init__(self) -> None:
        self.blocks: dict[BlockKey, bytes] = {}
        self.asked: list[list[BlockKey]] = []
        self.get_targets: list[Any] = []
        self.refuse: set[BlockKey] = set()  # puts of these fail

    def put(self, keys: Sequence[BlockKey], blocks: Sequence[Any]) -> PutResult:
        statuses = []
        for key, block in zip(keys, blocks, strict=True):
            assert block.is_contiguous()
            if key in self.refuse:
                statuses.append(ErrorCode.OUT_OF_SPACE)
            elif key in self.blocks:
                statuses.append(ErrorCode.ALREADY_EXISTS)
            else:
                self.blocks[key] = block.numpy().tobytes()
                statuses.append(ErrorCode.OK)
        return PutResult(tuple(statuses))

    def get(self, keys: Sequence[BlockKey], into: Sequence[Any]) -> GetResult:
        self.get_targets = list(into)
        statuses = []
        for key, target in zip(keys, into, strict=True):
            data = self.blocks.get(key)
            if data is None:
                statuses.append(ErrorCode.NOT_FOUND)
                continue
            target.view(-1).copy_(torch.frombuffer(bytearray(data), dtype=torch.float32))
            statuses.append(ErrorCode.OK)
        return GetResult(tuple(statuses))

    def lookup(self, keys: Sequence[BlockKey]) -> int:
        self.asked.append(list(keys))
        count = 0
        while count < len(keys) and keys[count] in self.blocks:
            count += 1
        return count


def tier(pool: MemoryPool, policy: SavePolicy = SavePolicy.FINISH) -> tuple[PoolTier, PagedKVCache]:
    """A tier over six fresh pages, and the pages."""
    kv = PagedKVCache(LAYOUT, 6)
    return PoolTier(pool, NS, kv, policy), kv  # type: ignore[arg-type]


def test_a_fetch_asks_after_the_local_blocks_and_loads_the_hits_in_place() -> None:
    pool = MemoryPool()
    writer, kv = tier(pool)
    kv.data.normal_()
    assert writer.save_finished(KEYS[:3], [4, 1, 0])
    assert (writer.stats.saved_blocks, writer.stats.saved_bytes) == (3, 3 * LAYOUT.block_nbytes)

    reader, target = tier(pool)
    assert reader.fetch(KEYS, local_blocks=1, usable_blocks=3, pages=[5, 2]) == 2
    assert pool.asked[-1] == KEYS[1:3], "the blocks after the local hits, up to the usable ones"
    assert all(t.data_ptr() == target.page(p).data_ptr() for t, p in zip(pool.get_targets, [5, 2], strict=True))
    assert torch.equal(target.data[[5, 2]], kv.data[[1, 0]])
    stats = reader.stats
    assert (stats.asked_blocks, stats.hit_blocks, stats.loaded_blocks) == (2, 2, 2)
    assert stats.loaded_bytes == 2 * LAYOUT.block_nbytes
    assert reader.fetch(KEYS, local_blocks=3, usable_blocks=3, pages=[0]) == 0
    assert len(pool.asked) == 1, "nothing left to ask about: no lookup"


def test_a_block_evicted_after_the_lookup_ends_the_loaded_prefix() -> None:
    pool = MemoryPool()
    tier(pool)[0].save_finished(KEYS, [0, 1, 2, 3])
    reader, _ = tier(pool)
    lookup = pool.lookup
    pool.lookup = lambda keys: (lookup(keys), pool.blocks.pop(KEYS[1]))[0]  # type: ignore[method-assign]
    assert reader.fetch(KEYS, local_blocks=0, usable_blocks=3, pages=[3, 2, 1]) == 1
    assert (reader.stats.hit_blocks, reader.stats.loaded_blocks) == (3, 1)


def test_evict_saves_only_what_the_pool_lacks_and_finish_saves_finished_requests() -> None:
    pool = MemoryPool()
    evicting, _ = tier(pool, SavePolicy.EVICT)
    evicted = [Evicted(2, KEYS[0].hash, in_pool=False), Evicted(3, KEYS[1].hash, in_pool=True)]
    evicting.save_evicted(evicted)
    assert set(pool.blocks) == {KEYS[0]}
    assert not evicting.save_finished(KEYS[2:], [0, 1]), "evict never saves at the end"

    finishing, _ = tier(pool, SavePolicy.FINISH)
    finishing.save_evicted([Evicted(0, KEYS[3].hash, in_pool=False)])
    assert KEYS[3] not in pool.blocks, "finish never saves on eviction"
    pool.refuse.add(KEYS[2])
    assert finishing.save_finished(KEYS[:3], [0, 1, 2])
    stats = finishing.stats
    assert (stats.saved_blocks, stats.save_failures) == (1, 1), "already stored is no failure; OUT_OF_SPACE is"
