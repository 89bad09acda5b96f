"""``KVPoolTier``: kvpool as a secondary tier of vLLM's ``OffloadingConnector``.

vLLM offloads KV from the GPU to its CPU (primary) tier; with ``TieringOffloadingSpec`` the
primary tier cascades chunks down to secondary tiers and promotes them back. This tier
keeps chunks in the pool, so engines on every node share them. It runs in vLLM's
scheduler and never blocks it:

- ``lookup`` answers from vLLM's own :class:`AsyncLookupManager`: the keys a step asked
  about go to the pool as one batched ``exists`` on a thread, and are RETRY until then;
- stores and loads run on one transfer thread, straight between the primary tier's shared
  memory rows and the pool (no copy in Python), and ``get_finished_jobs`` reports each;
- a load that fails is a failed job (vLLM computes those blocks), and its keys read as
  misses from then on, so the same failing load is not tried again.

Enabled with ``secondary_tiers: [{"type": "KVPoolTier", "module_path":
"kvpool_client.integrations.vllm.tier", "nodes": "..."}]`` in the offloading connector's
``kv_connector_extra_config``; the other keys of that entry are the connector's settings
(:class:`~kvpool_client.integrations.settings.PoolSettings`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.canonical_mapping import canonical_format_id
from vllm.v1.kv_offload.base import LookupResult, Medium, OffloadKey, ReqContext, RequestOffloadingContext
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from kvpool_client.client import KVPoolClient
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.keys import BlockKey, Namespace
from kvpool_client.integrations.namespaces import NamespaceFields, model_field
from kvpool_client.integrations.settings import PoolSettings
from kvpool_client.results import PUT_SUCCESS


class _PoolLookups(AsyncLookupManager):  # type: ignore[misc]
    """vLLM's per-step batched lookups, answered by one ``exists`` call per request."""

    def __init__(self, tier_type: str, client: KVPoolClient, namespace: str) -> None:
        self._client = client
        self._namespace = namespace
        super().__init__(tier_type)

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._client.exists([BlockKey(self._namespace, bytes(k)) for k in keys])


class KVPoolTier(SecondaryTierManager):  # type: ignore[misc]
    """A secondary tier in the kvpool cluster.

    Args:
        offloading_spec: vLLM's ``TieringOffloadingSpec``.
        primary_kv_view: the primary tier's memory, one row per chunk.
        tier_type: the name vLLM registered the tier under.
        backpressure_detector: vLLM's, if configured.
        **settings: the rest of the tier's entry: ``nodes`` and the other connector settings.

    Raises:
        UsageError: bad settings (the message names the setting).
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        **settings: Any,
    ) -> None:
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        parsed = PoolSettings.parse(settings, "secondary_tiers[KVPoolTier]", ignore=("locality",))
        self.namespace = tier_namespace(offloading_spec.config, self.block_size_bytes, parsed.model_id)
        self._rows = primary_kv_view.cast("B")
        self._client = KVPoolClient(config=parsed.client)
        self._lookups = _PoolLookups(tier_type, self._client, self.namespace.id)
        self._transfers = ThreadPoolExecutor(1, thread_name_prefix="kvpool-tier")
        self._lock = threading.Lock()
        self._done: list[JobResult] = []
        self._unloadable: list[OffloadKey] = []  # keys of failed loads, to read as misses
        self._running = 0
        self._idle = threading.Condition(self._lock)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=True)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            done, self._done = self._done, []
            failed, self._unloadable = self._unloadable, []
        if failed:  # else vLLM would promote the same chunks again and fail again
            self._lookups.mark_miss(failed)
        return done

    def has_pending_work(self) -> bool:
        with self._lock:
            return self._running > 0 or bool(self._done)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: Any) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._running == 0)

    def shutdown(self) -> None:
        self._transfers.shutdown(wait=True)
        self._lookups.shutdown()
        self._client.close()
        self._rows.release()

    # -- the transfer thread --------------------------------------------------

    def _submit(self, job: TransferJob, load: bool) -> None:
        with self._lock:
            self._running += 1
        self._transfers.submit(self._run, job, load)

    def _run(self, job: TransferJob, load: bool) -> None:
        try:
            result, failed = self._load(job) if load else self._store(job)
        except Exception:  # a pool failure fails the job, never the engine
            result = JobResult(job.job_id, False, successful_keys=[] if load else None)
            failed = list(job.keys) if load else []
        with self._idle:
            self._done.append(result)
            self._unloadable.extend(failed)
            self._running -= 1
            self._idle.notify_all()

    def _keys(self, job: TransferJob) -> list[BlockKey]:
        return [BlockKey(self.namespace.id, bytes(k)) for k in job.keys]

    def _rows_of(self, chunk_ids: Sequence[int]) -> list[memoryview]:
        size = self.block_size_bytes
        return [self._rows[int(c) * size : (int(c) + 1) * size] for c in chunk_ids]

    def _store(self, job: TransferJob) -> tuple[JobResult, list[OffloadKey]]:
        result = self._client.put(self._keys(job), self._rows_of(job.chunk_ids))
        stored = all(s in PUT_SUCCESS for s in result.statuses)
        return JobResult(job.job_id, stored, transfer_bytes=result.stored * self.block_size_bytes), []

    def _load(self, job: TransferJob) -> tuple[JobResult, list[OffloadKey]]:
        """Fetch into the rows; a partial load keeps the chunks that arrived whole."""
        keys = list(job.keys)
        result = self._client.get(self._keys(job), self._rows_of(job.chunk_ids))
        arrived = [s is ErrorCode.OK for s in result.statuses]
        ok = [k for k, good in zip(keys, arrived, strict=True) if good]
        if len(ok) == len(keys):
            return JobResult(job.job_id, True, transfer_bytes=len(ok) * self.block_size_bytes), []
        failed = [k for k, good in zip(keys, arrived, strict=True) if not good]
        return JobResult(job.job_id, False, successful_keys=ok, transfer_bytes=len(ok) * self.block_size_bytes), failed


def tier_namespace(config: Any, chunk_bytes: int, model_id: str | None) -> Namespace:
    """The namespace of an engine's offloaded chunks: model, dtype, layout and chunk shape, parallelism.

    A chunk is the primary tier's row (every worker's bytes of ``blocks_per_chunk`` blocks), so
    the engine's whole parallel layout goes into the layout field rather than a TP rank. A row's
    bytes also depend on the KV cache groups (their layers and block sizes) and on the byte
    format vLLM writes (its canonical format, or the worker's own layout; replicated across
    ranks or not), which are not interchangeable: each is in the namespace too, as vLLM's own
    file tier keys them. The dtype field is vLLM's name of the dtype (``bfloat16``), not the
    short one the connector writes (``bf16``): the chunks a deployment stored keep their keys.
    """
    parallel = config.parallel
    groups = json.dumps([[g.tokens_per_block, list(g.layer_names)] for g in config.groups])
    form = canonical_format_id(config.kv_cache_layout) if config.canonical_layout else "direct"
    replicated = "-replicated" if config.replicated_layout else ""
    layout = (
        f"vllm-offload-{config.kv_cache_layout or 'default'}-B{chunk_bytes}"
        f"-T{config.cache.tokens_per_hash * config.cache.blocks_per_chunk}"
        f"-tp{parallel.tp_size}-pp{parallel.pp_size}-pcp{parallel.pcp_size}-dcp{parallel.dcp_size}"
        f"-g{hashlib.sha256(groups.encode()).hexdigest()[:10]}-{form}{replicated}"
    )
    return NamespaceFields(model_field(model_id or config.model.name), config.model.dtype).namespace(layout)
