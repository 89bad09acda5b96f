"""The worker side: run the plan's loads and saves off the forward pass, and report them.

A cache in host memory is read and written in place (its blocks' regions, see
:mod:`.blocks`); a GPU cache through staging buffers. Loads and saves run on two threads of
their own, each in order, so the forward pass never
waits for the pool (except for the saves of a request vLLM preempts, whose blocks it is
about to reuse) and a load for a waiting request never queues behind a long prefill's saves.
On a GPU each copy is ordered after the work vLLM had queued when it called the connector
(:mod:`.streams`).

A load reports its request finished whatever happened; the blocks that did not arrive whole
are reported as load errors, and vLLM computes them again: a failed or missing block is never
presented as KV. A finished request whose blocks vLLM holds for its saves is reported once
every save of it was handed over and has ended, whatever order vLLM calls ``get_finished``
and ``wait_for_save`` in (speculative decoding defers the latter).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, wait
from typing import Any

from kvpool_client.client import KVPoolClient
from kvpool_client.core.keys import BlockKey
from kvpool_client.integrations.vllm.blocks import BlockLayers, StagingBuffers
from kvpool_client.integrations.vllm.scheduler import StepPlan, TransferJob
from kvpool_client.integrations.vllm.shape import namespace_id
from kvpool_client.integrations.vllm.streams import CopyOrder
from kvpool_client.results import PUT_SUCCESS, GetResult, PutResult

log = logging.getLogger("kvpool.vllm")

BATCH_BLOCKS = 32  # blocks per pool request: bounds staging memory per transfer


class _Lane:
    """One thread that runs the jobs handed to it in order (the loads' lane, the saves' lane).

    A :class:`~concurrent.futures.ThreadPoolExecutor` of one thread would do the same, but its
    ``submit`` goes through Python-level locks and semaphores (tens of microseconds a call, which a
    one-block load feels); a queue of the C implementation hands over in a few.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[None], Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[..., None], *args: Any) -> Future[None]:
        done: Future[None] = Future()
        self._jobs.put((done, work, args))
        return done

    def close(self) -> None:
        """Run what was handed over, then end the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            done, work, args = job
            try:
                work(*args)
            except BaseException as exc:  # the job's own failure, kept on its future
                done.set_exception(exc)
            else:
                done.set_result(None)


class WorkerTransfers:
    """Background loads and saves between one worker's KV cache and the pool.

    Args:
        client: the pool client.
        layers: the worker's KV cache as pool blocks.
        order: how copies follow the engine's device work.
        tp_rank, pp_rank: this worker's parallel ranks (whose namespace it reads and writes).
    """

    def __init__(
        self, client: KVPoolClient, layers: BlockLayers, order: CopyOrder, tp_rank: int = 0, pp_rank: int = 0
    ) -> None:
        self._client = client
        self._layers = layers
        self._order = order
        self._tp_rank, self._pp_rank = tp_rank, pp_rank
        self._staging = StagingBuffers(layers, client.register)
        if layers.host_memory:  # blocks move straight in and out of the cache over nixl
            for storage in layers.storages():
                client.register(storage)
        self._load_thread = _Lane("kvpool-load")
        self._save_thread = _Lane("kvpool-save")
        self._lock = threading.Lock()
        self._saves: dict[str, list[Future[None]]] = {}  # request -> its saves not yet done
        self._unsubmitted: set[str] = set()  # requests with saves in the bound plan not handed over yet
        self._loading: Counter[str] = Counter()  # request -> its loads running
        self._finishing: set[str] = set()  # finished requests whose blocks vLLM holds for us
        self._loaded: set[str] = set()
        self._load_errors: set[int] = set()

    def begin_step(self, plan: StepPlan) -> None:
        """vLLM's ``start_load_kv``, the first call of every step after its plan is bound: note
        what the step holds for us and will save, and start its loads."""
        for job in plan.loads:
            self._layers.check(job.block_ids)
        mark = self._order.mark() if plan.loads else None
        with self._lock:
            self._finishing.update(plan.finishing)
            self._unsubmitted = {job.req_id for job in plan.saves}
            self._loading.update(job.req_id for job in plan.loads)
        for job in plan.loads:
            self._load_thread.submit(self._load, job, mark)

    def start_saves(self, plan: StepPlan) -> None:
        """vLLM's ``wait_for_save``: store the blocks this step computed, once they are written."""
        jobs = [job for job in plan.saves if job.namespaces.writes(self._tp_rank)]
        for job in jobs:
            self._layers.check(job.block_ids)
        mark = self._order.mark() if jobs else None
        with self._lock:
            for job in jobs:
                self._saves.setdefault(job.req_id, []).append(self._save_thread.submit(self._save, job, mark))
            self._unsubmitted.clear()

    def wait_for(self, req_ids: Iterable[str]) -> None:
        """Block until the saves of ``req_ids`` end (vLLM is about to reuse their blocks)."""
        with self._lock:
            futures = [f for r in req_ids for f in self._saves.get(r, ())]
        wait(futures)

    def finished(self) -> tuple[set[str] | None, set[str] | None]:
        """vLLM's ``get_finished``: requests whose saves ended, and requests whose loads ended."""
        with self._lock:
            for req_id, futures in list(self._saves.items()):
                if all(f.done() for f in futures):
                    del self._saves[req_id]
            busy = self._saves.keys() | self._unsubmitted | self._loading.keys()
            sent = self._finishing - busy
            self._finishing -= sent
            loaded, self._loaded = self._loaded, set()
        return sent or None, loaded or None

    def load_errors(self) -> set[int]:
        with self._lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def close(self) -> None:
        self._load_thread.close()
        self._save_thread.close()

    def _keys(self, job: TransferJob, start: int, stop: int) -> list[BlockKey]:
        namespace = namespace_id(job.namespaces, self._tp_rank, self._pp_rank)
        return [BlockKey(namespace, job.hashes[i], job.first + i) for i in range(start, stop)]

    def _load(self, job: TransferJob, mark: Any) -> None:
        failed: list[int] = []
        try:
            for start in range(0, len(job.hashes), BATCH_BLOCKS):
                stop = min(start + BATCH_BLOCKS, len(job.hashes))
                ids = job.block_ids[start:stop]
                arrived = 0 if failed else self._load_batch(job.req_id, self._keys(job, start, stop), ids, mark)
                failed.extend(ids[arrived:])
        finally:
            with self._lock:
                self._load_errors.update(failed)
                self._loaded.add(job.req_id)
                self._loading[job.req_id] -= 1
                if self._loading[job.req_id] <= 0:
                    del self._loading[job.req_id]

    def _load_batch(self, req_id: str, keys: Sequence[BlockKey], block_ids: Sequence[int], mark: Any) -> int:
        """Fetch one batch into its blocks; returns how many leading blocks arrived whole."""
        try:
            if self._layers.host_memory:
                result = self._client.get(keys, [self._layers.block(b) for b in block_ids])
            else:
                result = self._load_staged(keys, block_ids, mark)
            arrived = result.prefix_hits
        except Exception as exc:  # never let a pool failure reach the forward pass
            log.warning("kvpool load of %d blocks for %s failed: %s", len(keys), req_id, exc)
            return 0
        if arrived < len(keys):
            status = result.statuses[arrived].name
            log.info("kvpool load for %s: %d of %d blocks arrived (then %s)", req_id, arrived, len(keys), status)
        return arrived

    def _save(self, job: TransferJob, mark: Any) -> None:
        for start in range(0, len(job.hashes), BATCH_BLOCKS):
            stop = min(start + BATCH_BLOCKS, len(job.hashes))
            self._save_batch(job.req_id, self._keys(job, start, stop), job.block_ids[start:stop], mark)

    def _load_staged(self, keys: Sequence[BlockKey], block_ids: Sequence[int], mark: Any) -> GetResult:
        """A device cache's load: into staging buffers, then copied into the blocks."""
        buffers = self._staging.take(len(keys))
        try:
            result = self._client.get(keys, buffers)
            with self._order.after(mark):
                for block_id, buffer in zip(block_ids[: result.prefix_hits], buffers, strict=False):
                    self._layers.scatter(block_id, buffer)
            return result
        finally:
            self._staging.give_back(buffers)

    def _save_batch(self, req_id: str, keys: Sequence[BlockKey], block_ids: Sequence[int], mark: Any) -> None:
        try:
            if self._layers.host_memory:
                result = self._client.put(keys, [self._layers.block(b) for b in block_ids])
            else:
                result = self._save_staged(keys, block_ids, mark)
        except Exception as exc:  # a failed save costs future hits, never this request
            log.warning("kvpool save of %d blocks for %s failed: %s", len(keys), req_id, exc)
            return
        failed = [s.name for s in result.statuses if s not in PUT_SUCCESS]
        if failed:
            log.info("kvpool save for %s: %d of %d blocks not stored (%s)", req_id, len(failed), len(keys), failed[0])

    def _save_staged(self, keys: Sequence[BlockKey], block_ids: Sequence[int], mark: Any) -> PutResult:
        """A device cache's save: its blocks copied into staging buffers, which are sent."""
        buffers = self._staging.take(len(keys))
        try:
            with self._order.after(mark):
                for block_id, buffer in zip(block_ids, buffers, strict=True):
                    self._layers.gather(block_id, buffer)
            return self._client.put(keys, buffers)
        finally:
            self._staging.give_back(buffers)
