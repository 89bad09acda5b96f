"""The worker side: run the plan's loads and saves off the forward pass, and report them.

Transfers run in order on one thread per worker, so the forward pass never waits for the
pool (except for the saves of a request vLLM preempts, whose blocks it is about to reuse).
A load reports its request finished whatever happened; the blocks that did not arrive
whole are reported as load errors, and vLLM computes them again: a failed or missing
block is never presented as KV.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from kvpool_client.client import KVPoolClient
from kvpool_client.core.errors import ErrorCode
from kvpool_client.integrations.vllm.blocks import BlockLayers, StagingBuffers
from kvpool_client.integrations.vllm.scheduler import TransferJob

log = logging.getLogger("kvpool.vllm")

BATCH_BLOCKS = 32  # blocks per pool request: bounds staging memory per transfer
_STORED = (ErrorCode.OK, ErrorCode.ALREADY_EXISTS, ErrorCode.BUSY)  # BUSY: another writer has it


class WorkerTransfers:
    """Background loads and saves between a worker's KV cache and the pool.

    Args:
        client: the pool client.
        layers: the worker's KV cache as pool blocks.
    """

    def __init__(self, client: KVPoolClient, layers: BlockLayers) -> None:
        self._client = client
        self._layers = layers
        self._staging = StagingBuffers(layers)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kvpool-transfer")
        self._lock = threading.Lock()
        self._saves: dict[str, list[Future[None]]] = {}  # request -> its saves not yet done
        self._finishing: set[str] = set()  # finished requests whose blocks vLLM holds for us
        self._finished: set[str] = set()  # requests vLLM told this worker are finished
        self._loaded: set[str] = set()
        self._load_errors: set[int] = set()

    def start_loads(self, jobs: Iterable[TransferJob]) -> None:
        for job in jobs:
            self._layers.check(job.block_ids)
            self._executor.submit(self._load, job)

    def start_saves(self, jobs: Iterable[TransferJob], finishing: Iterable[str]) -> None:
        with self._lock:
            for job in jobs:
                self._layers.check(job.block_ids)
                self._saves.setdefault(job.req_id, []).append(self._executor.submit(self._save, job))
            self._finishing.update(finishing)

    def wait_for(self, req_ids: Iterable[str]) -> None:
        """Block until the saves of ``req_ids`` end (vLLM is about to reuse their blocks)."""
        with self._lock:
            futures = [f for r in req_ids for f in self._saves.get(r, ())]
        wait(futures)

    def finished(self, finished_req_ids: Iterable[str]) -> tuple[set[str] | None, set[str] | None]:
        """vLLM's ``get_finished``: requests whose saves ended, and requests whose loads ended."""
        with self._lock:
            # A request reaches both sets in the same step (the plan and vLLM's finished ids come
            # from one scheduler output, and wait_for_save runs first): keep only ours.
            self._finished.update(r for r in finished_req_ids if r in self._finishing)
            for req_id, futures in list(self._saves.items()):
                if all(f.done() for f in futures):
                    del self._saves[req_id]
            sent = {r for r in self._finishing & self._finished if r not in self._saves}
            self._finishing -= sent
            self._finished -= sent
            loaded, self._loaded = self._loaded, set()
        return sent or None, loaded or None

    def load_errors(self) -> set[int]:
        with self._lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)

    def _load(self, job: TransferJob) -> None:
        failed: list[int] = []
        for start in range(0, len(job.keys), BATCH_BLOCKS):
            keys, ids = job.keys[start : start + BATCH_BLOCKS], job.block_ids[start : start + BATCH_BLOCKS]
            arrived = 0 if failed else self._load_batch(job.req_id, keys, ids)
            failed.extend(ids[arrived:])
        with self._lock:
            self._load_errors.update(failed)
            self._loaded.add(job.req_id)

    def _load_batch(self, req_id: str, keys: Sequence[Any], block_ids: Sequence[int]) -> int:
        """Fetch one batch into its blocks; returns how many leading blocks arrived whole."""
        direct = self._layers.direct
        buffers = [self._layers.view(b) for b in block_ids] if direct else self._staging.take(len(keys))
        try:
            result = self._client.get(keys, buffers)
            arrived = result.prefix_hits
            if not direct:
                for block_id, buffer in zip(block_ids[:arrived], buffers, strict=False):
                    self._layers.scatter(block_id, buffer)
                self._layers.synchronize()
        except Exception as exc:  # never let a pool failure reach the forward pass
            log.warning("kvpool load of %d blocks for %s failed: %s", len(keys), req_id, exc)
            return 0
        finally:
            if not direct:
                self._staging.give_back(buffers)
        if arrived < len(keys):
            log.info(
                "kvpool load for %s: %d of %d blocks arrived (block %d: %s)",
                req_id,
                arrived,
                len(keys),
                arrived,
                result.statuses[arrived].name,
            )
        return arrived

    def _save(self, job: TransferJob) -> None:
        for start in range(0, len(job.keys), BATCH_BLOCKS):
            self._save_batch(
                job.req_id, job.keys[start : start + BATCH_BLOCKS], job.block_ids[start : start + BATCH_BLOCKS]
            )

    def _save_batch(self, req_id: str, keys: Sequence[Any], block_ids: Sequence[int]) -> None:
        direct = self._layers.direct
        buffers = [self._layers.view(b) for b in block_ids] if direct else self._staging.take(len(keys))
        try:
            if not direct:
                for block_id, buffer in zip(block_ids, buffers, strict=True):
                    self._layers.gather(block_id, buffer)
                self._layers.synchronize()
            result = self._client.put(keys, buffers)
        except Exception as exc:  # a failed save costs future hits, never this request
            log.warning("kvpool save of %d blocks for %s failed: %s", len(keys), req_id, exc)
            return
        finally:
            if not direct:
                self._staging.give_back(buffers)
        failed = [s.name for s in result.statuses if s not in _STORED]
        if failed:
            log.info("kvpool save for %s: %d of %d blocks not stored (%s)", req_id, len(failed), len(keys), failed[0])
