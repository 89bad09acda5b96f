"""kvpool as the engine's second KV tier, through the engine connector.

On admission the engine asks the tier for the blocks right after its local prefix
cache hits; the tier looks them up (no bytes) and loads the hits straight into the
request's fresh pages. What goes into the pool depends on the policy:

- ``evict``: a cached block is saved when the local cache evicts it (one batch per
  allocation, before the page is overwritten): the pool extends local memory;
- ``finish``: every full block of a request is saved when it finishes, so another
  process can read it (disaggregated prefill writes, decode reads).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from bench.engine.pages import PagedKVCache
from bench.engine.prefix_cache import Evicted
from kvpool_client import BlockKey, KVPoolClient, Namespace
from kvpool_client.connector import ConnectorScheduler, ConnectorWorker, KVPages


class SavePolicy(Enum):
    EVICT = "evict"
    FINISH = "finish"


@dataclass(slots=True)
class TierStats:
    """Counters of one engine's use of the pool."""

    asked_blocks: int = 0  # blocks looked up (those missing locally)
    hit_blocks: int = 0  # of those, found in the pool
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    saved_blocks: int = 0
    saved_bytes: int = 0
    save_failures: int = 0
    lookup_s: float = 0.0
    load_s: float = 0.0
    save_s: float = 0.0


class PoolTier:
    """The pool behind one engine.

    Args:
        client: a connected pool client (owned by the caller).
        namespace: the engine's namespace (model + layout).
        kv: the engine's pages.
        policy: when blocks go to the pool.
        seed: the block hash seed, the same as the engine's.
    """

    def __init__(
        self, client: KVPoolClient, namespace: Namespace, kv: PagedKVCache, policy: SavePolicy, seed: str
    ) -> None:
        self.policy = policy
        self.stats = TierStats()
        self._namespace = namespace.id
        self._scheduler = ConnectorScheduler(client, kv.layout, namespace, seed)
        self._worker = ConnectorWorker(client, KVPages(kv.data, kv.layout), namespace)

    def fetch(self, keys: Sequence[BlockKey], local_blocks: int, usable_blocks: int, pages: Sequence[int]) -> int:
        """Load the pool's blocks after ``local_blocks`` (up to ``usable_blocks`` in all) into ``pages``.

        Returns:
            Blocks loaded: ``pages[:n]`` now hold ``keys[local_blocks:local_blocks + n]``.
        """
        started = time.perf_counter()
        match = self._scheduler.match(keys, local_blocks, max(0, usable_blocks - local_blocks))
        looked = time.perf_counter()
        self.stats.lookup_s += looked - started
        self.stats.asked_blocks += max(0, usable_blocks - local_blocks)
        self.stats.hit_blocks += match.blocks
        if not match.blocks:
            return 0
        result = self._worker.load(match.keys, pages[: match.blocks])
        self.stats.load_s += time.perf_counter() - looked
        self.stats.loaded_blocks += result.loaded
        self.stats.loaded_bytes += result.nbytes
        return result.loaded

    def save_evicted(self, evicted: Sequence[Evicted]) -> None:
        """Under the ``evict`` policy: save the evicted blocks the pool does not hold yet."""
        if self.policy is SavePolicy.EVICT:
            todo = [e for e in evicted if not e.in_pool]
            self._save([BlockKey(self._namespace, e.block_hash) for e in todo], [e.page for e in todo])

    def save_finished(self, keys: Sequence[BlockKey], pages: Sequence[int]) -> bool:
        """Under the ``finish`` policy: save a finished request's blocks; True if saved."""
        if self.policy is not SavePolicy.FINISH:
            return False
        self._save(keys, pages)
        return True

    def _save(self, keys: Sequence[BlockKey], pages: Sequence[int]) -> None:
        if not keys:
            return
        started = time.perf_counter()
        result = self._worker.save(keys, pages)
        self.stats.save_s += time.perf_counter() - started
        self.stats.saved_blocks += result.stored
        self.stats.saved_bytes += result.nbytes
        self.stats.save_failures += result.failed
