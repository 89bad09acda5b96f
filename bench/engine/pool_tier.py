"""kvpool as the engine's second KV tier.

On admission the engine asks the tier for the blocks right after its local prefix
cache hits; the tier looks them up (one batched lookup, no bytes) and gets the hits
straight into the request's fresh pages. A page is one contiguous block of CPU memory,
so the client receives into it and sends from it with no copy. A load counts the
*leading* blocks that arrived: a block evicted between the lookup and the get ends the
usable prefix, and the engine prefills from there, never from wrong bytes.

What goes into the pool depends on the policy:

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
        namespace: the engine's namespace (model + layout); every key passed in is in it.
        kv: the engine's pages.
        policy: when blocks go to the pool.
    """

    def __init__(self, client: KVPoolClient, namespace: Namespace, kv: PagedKVCache, policy: SavePolicy) -> None:
        self.policy = policy
        self.stats = TierStats()
        self._client = client
        self._namespace = namespace.id
        self._kv = kv

    def fetch(self, keys: Sequence[BlockKey], local_blocks: int, usable_blocks: int, pages: Sequence[int]) -> int:
        """Load the pool's blocks after ``local_blocks`` (up to ``usable_blocks`` in all) into ``pages``.

        Returns:
            Blocks loaded: ``pages[:n]`` now hold ``keys[local_blocks:local_blocks + n]``.
        """
        started = time.perf_counter()
        asked = list(keys[local_blocks:usable_blocks])
        hits = self._client.lookup(asked) if asked else 0
        looked = time.perf_counter()
        self.stats.lookup_s += looked - started
        self.stats.asked_blocks += len(asked)
        self.stats.hit_blocks += hits
        if not hits:
            return 0
        result = self._client.get(asked[:hits], [self._kv.page(p) for p in pages[:hits]])
        loaded = result.prefix_hits
        self.stats.load_s += time.perf_counter() - looked
        self.stats.loaded_blocks += loaded
        self.stats.loaded_bytes += loaded * self._kv.page_bytes
        return loaded

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
        """Put-if-absent; a block the pool already holds (or another writer is storing) is no failure."""
        if not keys:
            return
        started = time.perf_counter()
        result = self._client.put(keys, [self._kv.page(p) for p in pages])
        self.stats.save_s += time.perf_counter() - started
        self.stats.saved_blocks += result.stored
        self.stats.saved_bytes += result.stored * self._kv.page_bytes
        self.stats.save_failures += len(result.failures())
