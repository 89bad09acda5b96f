"""The scheduler side's plan: which blocks each step loads from the pool and saves to it.

It runs in vLLM's scheduler and must never block it. A request's pool lookup (one batched
``lookup`` of its vLLM block hashes) runs on a thread; until it answers, the request's
match is "not known yet" (None), and vLLM asks again at its next step. Hits load
asynchronously: vLLM parks the request until the worker reports the load finished.

Saves: each step saves the request's full blocks that its prefill or decode completed and
neither the pool nor vLLM's local prefix cache was known to hold. A request that had saves
keeps its blocks after it finishes until the worker reports its saves done, so no block is
reused under a save. A request that finishes while its load runs is left to vLLM, which
holds its blocks until the load is reported (claiming them too would free them twice).

Every job carries the namespaces it belongs to: each worker stores and loads its own rank's
blocks, and a reset of the cache after a weight update moves new jobs to a new generation
while jobs planned before it keep theirs.
Nothing here imports vLLM; requests are read through the attributes vLLM's ``Request`` has.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpool_client.integrations.vllm.shape import EngineNamespaces

log = logging.getLogger("kvpool.vllm")

# A block the pool lists but that failed to load (wrong size, corrupt, its node died) is not
# offered again for a while: otherwise vLLM would retry the same failing load forever.
UNLOADABLE_TTL_S = 30.0
UNLOADABLE_MAX = 65536


class EngineRequest(Protocol):
    """What the plan reads of vLLM's ``Request``."""

    request_id: str
    block_hashes: Sequence[bytes]
    num_tokens: int
    num_computed_tokens: int


# How many leading blocks with these hashes (the first at chain position ``first``) every
# writing rank's namespace holds; blocking, it runs on the lookup thread.
Lookup = Callable[[EngineNamespaces, Sequence[bytes], int], int]


@dataclass(frozen=True, slots=True)
class TransferJob:
    """Blocks of one request to move: block ``hashes[i]`` (chain position ``first + i``) to or
    from vLLM block ``block_ids[i]``, in each worker's own namespace of ``namespaces``."""

    req_id: str
    hashes: tuple[bytes, ...]
    first: int
    block_ids: tuple[int, ...]
    namespaces: EngineNamespaces


@dataclass(slots=True)
class StepPlan:
    """What the worker does this step (the connector metadata's content).

    Attributes:
        loads: blocks to fetch into freshly allocated vLLM blocks.
        saves: blocks to store once this step's forward pass wrote them.
        preempted: requests whose blocks vLLM frees now: their saves must end first.
        finishing: finished requests whose blocks vLLM holds until the worker reports
            their saves done (``finished_sending``).
    """

    loads: list[TransferJob] = field(default_factory=list)
    saves: list[TransferJob] = field(default_factory=list)
    preempted: frozenset[str] = frozenset()
    finishing: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request in a step, as the scheduler output describes it.

    Attributes:
        computed_tokens: tokens computed before this step.
        scheduled_tokens: tokens this step computes.
        block_ids: blocks allocated this step (all of them for a new or resumed request).
        replaces: whether ``block_ids`` replace the request's blocks (new or resumed).
    """

    req_id: str
    computed_tokens: int
    scheduled_tokens: int
    block_ids: tuple[int, ...]
    replaces: bool


@dataclass(slots=True)
class _Lookup:
    first_block: int
    hashes: list[bytes]
    answer: Future[int]  # how many of ``hashes`` lead in the pool


@dataclass(slots=True)
class _Tracked:
    request: Any  # vLLM's Request
    block_ids: list[int] = field(default_factory=list)
    saved: int = 0  # leading blocks stored, being stored, or known to be in the pool
    had_saves: bool = False


class SchedulerPlan:
    """Lookups and per-step transfer plans for vLLM's scheduler.

    Args:
        lookup: how many leading blocks every writing rank holds (blocking; runs on ``executor``).
        executor: where lookups run.
        namespaces: the namespaces of the engine's blocks.
        block_size: tokens per vLLM block.
    """

    def __init__(self, lookup: Lookup, executor: Executor, namespaces: EngineNamespaces, block_size: int) -> None:
        self._lookup = lookup
        self._executor = executor
        self.namespaces = namespaces
        self._block_size = block_size
        self._lookups: dict[str, _Lookup] = {}
        self._matches: dict[str, tuple[int, list[bytes]]] = {}  # req -> (first block, hashes held)
        self._tracked: dict[str, _Tracked] = {}
        self._loads: list[TransferJob] = []
        self._saves: list[TransferJob] = []
        self._finishing: set[str] = set()
        self._loading: dict[str, dict[int, bytes]] = {}  # request -> vLLM block -> hash loading into it
        self._unloadable: OrderedDict[bytes, float] = OrderedDict()  # block hash -> when it failed

    def reset(self) -> None:
        """vLLM's ``reset_cache`` (after a weight update): from now on plan in a new generation of
        the namespaces, so no block stored before is loaded. Jobs already planned keep theirs."""
        self.namespaces = self.namespaces.renewed()
        self._lookups.clear()  # their answers are about the old generation
        self._unloadable.clear()

    def _job(self, req_id: str, hashes: Sequence[bytes], first: int, block_ids: Sequence[int]) -> TransferJob:
        return TransferJob(req_id, tuple(bytes(h) for h in hashes), first, tuple(block_ids), self.namespaces)

    def matched_tokens(self, request: EngineRequest, computed_tokens: int) -> tuple[int | None, bool]:
        """vLLM's ``get_num_new_matched_tokens``: pool tokens after ``computed_tokens``.

        Returns (None, False) while the lookup runs; (tokens, True) for a hit, loaded
        asynchronously; (0, False) for none. The last prompt token is never matched: vLLM
        must compute at least one.
        """
        first = computed_tokens // self._block_size
        last = min(len(request.block_hashes), (request.num_tokens - 1) // self._block_size)
        tracked = self._tracked.setdefault(request.request_id, _Tracked(request))
        if last <= first:
            tracked.saved = max(tracked.saved, first)  # vLLM's local cache holds them: no save
            return 0, False
        pending = self._lookups.get(request.request_id)
        if pending is None or pending.first_block != first:
            hashes = list(request.block_hashes[first:last])
            answer = self._executor.submit(self._lookup, self.namespaces, hashes, first)
            self._lookups[request.request_id] = _Lookup(first, hashes, answer)
            return None, False
        if not pending.answer.done():
            return None, False
        del self._lookups[request.request_id]
        hashes = self._loadable(_held(pending))
        tracked.saved = max(tracked.saved, first + len(hashes))  # local or in the pool: no save
        if not hashes:
            return 0, False
        self._matches[request.request_id] = (first, hashes)
        return len(hashes) * self._block_size, True

    def after_alloc(self, request: EngineRequest, block_ids: Sequence[int], external_tokens: int) -> None:
        """vLLM's ``update_state_after_alloc``: turn a match into a load into ``block_ids``."""
        tracked = self._tracked.setdefault(request.request_id, _Tracked(request))
        tracked.block_ids = list(block_ids)
        match = self._matches.pop(request.request_id, None)
        if external_tokens <= 0 or match is None:
            return
        first, hashes = match
        count = external_tokens // self._block_size
        targets = block_ids[first : first + count]
        self._loads.append(self._job(request.request_id, hashes[:count], first, targets))
        self._loading[request.request_id] = dict(zip(targets, hashes, strict=False))

    def worker_output(self, loaded: Iterable[str], failed_blocks: Iterable[int]) -> None:
        """vLLM's ``update_connector_output``: remember the keys whose loads failed."""
        failed = set(failed_blocks)
        now = time.monotonic()
        for req_id in loaded:
            for block_id, block_hash in self._loading.pop(req_id, {}).items():
                if block_id in failed:
                    self._unloadable[block_hash] = now
                    self._unloadable.move_to_end(block_hash)
        while len(self._unloadable) > UNLOADABLE_MAX:
            self._unloadable.popitem(last=False)

    def _loadable(self, hashes: list[bytes]) -> list[bytes]:
        """``hashes`` up to the first block whose load failed lately."""
        horizon = time.monotonic() - UNLOADABLE_TTL_S
        for index, block_hash in enumerate(hashes):
            failed_at = self._unloadable.get(block_hash)
            if failed_at is not None:
                if failed_at >= horizon:
                    return hashes[:index]
                del self._unloadable[block_hash]
        return hashes

    def build(self, scheduled: Sequence[ScheduledRequest], preempted: Sequence[str]) -> StepPlan:
        """This step's plan: loads decided since the last one, and saves of newly full blocks."""
        for step in scheduled:
            tracked = self._tracked.get(step.req_id)
            if tracked is None:
                continue
            if step.replaces:
                tracked.block_ids = list(step.block_ids)
            else:
                tracked.block_ids.extend(step.block_ids)
            full = (step.computed_tokens + step.scheduled_tokens) // self._block_size
            self._save(tracked, full)
        plan = StepPlan(self._loads, self._saves, frozenset(preempted), frozenset(self._finishing))
        self._loads, self._saves, self._finishing = [], [], set()
        return plan

    def finished(self, request: EngineRequest, block_ids: Sequence[int]) -> bool:
        """vLLM's ``request_finished``: save the rest; True: hold the blocks until the worker reports.

        A request whose load still runs is vLLM's to hold (until the load's report, whose
        ``worker_output`` forgets it): claiming its blocks as well would free them twice.
        """
        self._lookups.pop(request.request_id, None)
        self._matches.pop(request.request_id, None)
        tracked = self._tracked.pop(request.request_id, None)
        if tracked is None or request.request_id in self._loading:
            return False
        tracked.block_ids = list(block_ids)
        # Blocks whose KV is computed: the last sampled token has a hash, never KV.
        self._save(tracked, request.num_computed_tokens // self._block_size)
        if tracked.had_saves:
            self._finishing.add(request.request_id)
        return tracked.had_saves

    def _save(self, tracked: _Tracked, full_blocks: int) -> None:
        request = tracked.request
        stop = min(full_blocks, len(request.block_hashes), len(tracked.block_ids))
        if stop <= tracked.saved:
            return
        start = tracked.saved
        self._saves.append(
            self._job(request.request_id, request.block_hashes[start:stop], start, tracked.block_ids[start:stop])
        )
        tracked.saved = stop
        tracked.had_saves = True


def _held(lookup: _Lookup) -> list[bytes]:
    """The hashes the pool holds, in order; a failed lookup is a miss (vLLM computes), with the reason logged."""
    try:
        hits = lookup.answer.result()
    except Exception as exc:  # the pool being down must only cost hits
        log.warning("kvpool lookup failed, computing instead: %s", exc)
        return []
    return lookup.hashes[:hits]
