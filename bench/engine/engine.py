"""The engine loop: continuous batching over a paged KV cache with prefix reuse.

Each :meth:`Engine.step` schedules one ragged batch under a token budget: every
running decode (one token each) and unfinished prefill chunk first, then waiting
requests first-come first-served while pages and budget last (chunked prefill).
Admission reserves all the pages a request will need, reusing the local prefix
cache's hits and, with a pool tier, loading the pool's hits for the next blocks;
only the rest is prefilled. Computed full blocks enter the prefix cache at once,
so a request admitted later reuses them even while their owner still runs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench.engine.model import Model, SeqBatch
from bench.engine.pages import PagedKVCache
from bench.engine.pool_tier import PoolTier
from bench.engine.prefix_cache import PrefixCache
from bench.engine.request import Event, Finished, FirstToken, Request
from kvpool_client import BlockKeyBuilder, Namespace
from kvpool_client.integrations.namespaces import KVLayout


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Budgets of one engine.

    Args:
        num_pages: KV pages (the scarce device memory).
        max_batch_tokens: new tokens per step (decodes + prefill chunks).
        prefix_cache: reuse cached blocks across requests.
        max_running: requests in the running batch at most.
        seed: the block hash seed.
    """

    num_pages: int
    max_batch_tokens: int = 512
    prefix_cache: bool = True
    max_running: int = 32
    seed: str = "0"


@dataclass(slots=True)
class EngineStats:
    steps: int = 0
    computed_tokens: int = 0
    forward_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Slice:
    request: Request
    count: int


class Engine:
    """One model replica with its pages, local prefix cache and optional pool tier.

    Args:
        model: the transformer.
        layout: the KV block layout (``model``'s shapes, fp32, ``LKHTD``).
        namespace: where this engine's blocks live (model + layout).
        config: budgets.
        tier_factory: builds the pool tier over the engine's pages; None: a local-only engine.
        keep_logits: remember each request's first-token logits (for tests).
    """

    def __init__(
        self,
        model: Model,
        layout: KVLayout,
        namespace: Namespace,
        config: EngineConfig,
        tier_factory: Callable[[PagedKVCache], PoolTier] | None = None,
        keep_logits: bool = False,
    ) -> None:
        self.model = model
        self.config = config
        self.kv = PagedKVCache(layout, config.num_pages)
        self.cache = PrefixCache(config.num_pages, enabled=config.prefix_cache)
        self.tier: PoolTier | None = tier_factory(self.kv) if tier_factory is not None else None
        self.stats = EngineStats()
        self.first_logits: dict[str, torch.Tensor] = {}
        self._keep_logits = keep_logits
        self._keys = BlockKeyBuilder(namespace, layout.block_size, seed=config.seed)
        self._block = layout.block_size
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []

    def submit(self, request: Request) -> None:
        """Queue ``request``; it is admitted in a later :meth:`step`.

        Raises:
            ValueError: the request can never fit in the page budget.
        """
        if self._pages_for(request.fed_tokens) > self.config.num_pages:
            raise ValueError(f"request {request.rid} needs more than {self.config.num_pages} pages")
        request.keys = self._keys.keys(request.prompt)
        self._waiting.append(request)

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._running)

    def step(self) -> list[Event]:
        """Run one batch; returns the first tokens and completions it produced."""
        budget = self.config.max_batch_tokens
        plan: list[_Slice] = []
        for request in self._running:  # decodes always run; prefill chunks share what is left
            count = 1 if not request.prefilling else min(budget, len(request.prompt) - request.computed)
            if count > 0:
                plan.append(_Slice(request, count))
                budget -= count
        while budget > 0 and self._waiting and len(self._running) < self.config.max_running:
            if not self._admit(self._waiting[0]):
                break
            request = self._waiting.popleft()
            self._running.append(request)
            count = min(budget, len(request.prompt) - request.computed)
            plan.append(_Slice(request, count))
            budget -= count
        return self._execute(plan) if plan else []

    def drain(self) -> list[Event]:
        """Step until every submitted request finished."""
        events: list[Event] = []
        while self.busy:
            events.extend(self.step())
        return events

    def evict_all(self) -> int:
        """Evict every unused cached block (saving it first, under the ``evict`` policy); returns the count."""
        evicted = self.cache.evict_all()
        if self.tier is not None:
            self.tier.save_evicted(evicted)
        return len(evicted)

    # -- admission ---------------------------------------------------------------

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self._block)

    def _admit(self, request: Request) -> bool:
        """Reserve pages for ``request``, reusing local hits and loading pool hits; False if it must wait."""
        usable = (len(request.prompt) - 1) // self._block  # the last prompt token is always computed
        local = self.cache.match([k.hash for k in request.keys[:usable]])
        self.cache.acquire(local)
        needed = self._pages_for(request.fed_tokens) - len(local)
        if needed > self.cache.free_pages:
            self.cache.release(local)
            return False
        allocation = self.cache.allocate(needed)
        loaded = 0
        if self.tier is not None:
            self.tier.save_evicted(allocation.evicted)
            loaded = self.tier.fetch(request.keys, len(local), usable, allocation.pages)
        request.pages = local + allocation.pages
        for index in range(len(local), len(local) + loaded):
            self.cache.register(request.pages[index], request.keys[index].hash, in_pool=True)
        request.registered = len(local) + loaded
        request.computed = request.registered * self._block
        request.local_hit_tokens = len(local) * self._block
        request.pool_hit_tokens = loaded * self._block
        request.loaded_bytes = loaded * self.kv.page_bytes
        return True

    # -- execution ---------------------------------------------------------------

    def _execute(self, plan: list[_Slice]) -> list[Event]:
        tokens: list[int] = []
        positions: list[int] = []
        seqs: list[SeqBatch] = []
        for item in plan:
            r, start = item.request, item.request.computed
            end = start + item.count
            seqs.append(SeqBatch(len(tokens), item.count, end, r.pages, end == len(r.tokens)))
            tokens.extend(r.tokens[start:end])
            positions.extend(range(start, end))
        started = time.perf_counter()
        logits = self.model.forward(torch.tensor(tokens), torch.tensor(positions), seqs, self.kv)
        self.stats.forward_s += time.perf_counter() - started
        self.stats.steps += 1
        self.stats.computed_tokens += len(tokens)
        now = time.monotonic()
        events: list[Event] = []
        row = 0
        for item, seq in zip(plan, seqs, strict=True):
            item.request.computed += item.count
            if seq.wants_logits:
                events.extend(self._sample(item.request, logits[row], now))
                row += 1
            self._register_blocks(item.request)
        for request in [r for r in self._running if r.done]:
            events.append(self._finish(request))
        return events

    def _sample(self, request: Request, logits: torch.Tensor, now: float) -> list[Event]:
        token = int(logits.argmax())
        request.output.append(token)
        request.tokens.append(token)
        if request.first_token_at is not None:
            return []
        request.first_token_at = now
        if self._keep_logits:
            self.first_logits[request.rid] = logits.clone()
        return [FirstToken(request.rid, token, now)]

    def _register_blocks(self, request: Request) -> None:
        """Key and cache the request's newly completed full blocks."""
        while (request.registered + 1) * self._block <= request.computed:
            index = request.registered
            if index == len(request.keys):
                parent = request.keys[-1].hash if request.keys else None
                block = request.tokens[index * self._block : (index + 1) * self._block]
                request.keys.extend(self._keys.keys(block, parent))
            self.cache.register(request.pages[index], request.keys[index].hash)
            request.registered += 1

    def _finish(self, request: Request) -> Finished:
        self._running.remove(request)
        if self.tier is not None:
            todo = [i for i in range(request.registered) if not self.cache.in_pool(request.pages[i])]
            pages = [request.pages[i] for i in todo]
            if self.tier.save_finished([request.keys[i] for i in todo], pages):
                self.cache.mark_in_pool(pages)
        self.cache.release(request.pages)
        assert request.first_token_at is not None
        return Finished(
            request.rid,
            tuple(request.output),
            time.monotonic(),
            len(request.prompt),
            request.local_hit_tokens,
            request.pool_hit_tokens,
            request.loaded_bytes,
            request.first_token_at,
        )
