"""``KVPoolConnector``: kvpool as a vLLM v1 KV connector (``KVConnectorBase_V1``).

vLLM builds one connector in its scheduler (role SCHEDULER) and one in each worker (role
WORKER) from the same config. This class only translates vLLM's calls: the scheduler
side's logic is :class:`~.scheduler.SchedulerPlan`, the worker side's is
:class:`~.worker.WorkerTransfers`, and the namespaces come from :mod:`.shape`.

What it cannot serve correctly it refuses at start, naming the setting: decode or prefill
context parallelism (blocks then span ranks' token shards), and
``kv_load_failure_policy="fail"`` (a block the pool listed can still fail to arrive, when
its node dies: vLLM must recompute it rather than fail the user's request).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig, MLAAttentionSpec

from kvpool_client.client import KVPoolClient
from kvpool_client.core.errors import UsageError
from kvpool_client.integrations.settings import PoolSettings
from kvpool_client.integrations.vllm.blocks import BlockLayers
from kvpool_client.integrations.vllm.lookup import RankLookup
from kvpool_client.integrations.vllm.scheduler import ScheduledRequest, SchedulerPlan, StepPlan
from kvpool_client.integrations.vllm.shape import CacheShape
from kvpool_client.integrations.vllm.streams import copy_order
from kvpool_client.integrations.vllm.worker import WorkerTransfers

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


@dataclass
class KVPoolConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's plan, sent from the scheduler to every worker."""

    plan: StepPlan = field(default_factory=StepPlan)


class KVPoolConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """Loads prefix blocks from the pool and saves computed blocks to it.

    Raises:
        UsageError: a bad ``kv_connector_extra_config`` (the message names the setting), a model
            whose KV cache is not one attention group, or a vLLM setting the connector refuses.
    """

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if kv_cache_config is None:
            raise UsageError("KVPoolConnector needs vLLM's KV cache config (vLLM 0.11 or later)")
        _check_supported(vllm_config)
        settings = PoolSettings.parse(self._kv_transfer_config.kv_connector_extra_config, "kv_connector_extra_config")
        self._group = _attention_group(kv_cache_config)
        self._num_blocks = kv_cache_config.num_blocks
        self.shape = cache_shape(vllm_config, kv_cache_config, settings.model_id)
        self._ranks = _ranks(vllm_config) if role == KVConnectorRole.WORKER else (0, 0)
        self._client = KVPoolClient(config=settings.client)
        self._transfers: WorkerTransfers | None = None
        self._plan: SchedulerPlan | None = None
        self._lookups: ThreadPoolExecutor | None = None
        if role != KVConnectorRole.WORKER:
            self._lookups = ThreadPoolExecutor(settings.lookup_threads, thread_name_prefix="kvpool-lookup")
            lookup = RankLookup(self._client)
            self._plan = SchedulerPlan(lookup, self._lookups, self.shape.namespaces(), self.shape.block_size)

    @property
    def client(self) -> KVPoolClient:
        """This side's pool client: its ``counters()`` say what the engine looked up, loaded and saved."""
        return self._client

    # -- scheduler side -------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._scheduler().matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self._scheduler().after_alloc(request, blocks.get_block_ids()[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVPoolConnectorMetadata:
        preempted = scheduler_output.preempted_req_ids or ()
        return KVPoolConnectorMetadata(self._scheduler().build(_scheduled(scheduler_output), list(preempted)))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._scheduler().worker_output(
            connector_output.finished_recving or (), connector_output.invalid_block_ids or ()
        )

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler().finished(request, block_ids), None

    def reset_cache(self) -> bool:
        """vLLM's reset of the connector's cache (``reset_prefix_cache(reset_connector=True)``,
        after a weight update): this engine stops reading blocks stored before it (see
        :meth:`SchedulerPlan.reset`). Workers have nothing to reset: each job names its namespaces."""
        if self._plan is not None:
            self._plan.reset()
        return True

    # -- worker side ----------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        layers = BlockLayers(kv_caches, self._group.layer_names, self._num_blocks)
        expected = self._group.kv_cache_spec.page_size_bytes * len(self._group.layer_names)
        if layers.block_nbytes != expected:
            raise UsageError(f"KV cache blocks are {layers.block_nbytes} bytes, the spec says {expected}")
        self._transfers = WorkerTransfers(self._client, layers, copy_order(layers.device), *self._ranks)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert isinstance(kv_connector_metadata, KVPoolConnectorMetadata)
        self._worker().wait_for(kv_connector_metadata.plan.preempted)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._worker().begin_step(self._step())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are per request and asynchronous: vLLM schedules a request once its load ended."""

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        """Blocks are saved whole, after the forward pass (:meth:`wait_for_save`)."""

    def wait_for_save(self) -> None:
        self._worker().start_saves(self._step())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Requests whose saves and loads ended. ``finished_req_ids`` is not needed: the step's
        plan names the finished requests whose blocks vLLM holds for the connector."""
        return self._worker().finished()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker().load_errors()

    def shutdown(self) -> None:
        if self._transfers is not None:
            self._transfers.close()
        if self._lookups is not None:
            self._lookups.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    # -- internals ------------------------------------------------------------

    def _scheduler(self) -> SchedulerPlan:
        assert self._plan is not None, "a scheduler-side call on the worker's connector"
        return self._plan

    def _worker(self) -> WorkerTransfers:
        if self._transfers is None:
            raise UsageError("KVPoolConnector: register_kv_caches was not called")
        return self._transfers

    def _step(self) -> StepPlan:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, KVPoolConnectorMetadata)
        return metadata.plan


def _check_supported(vllm_config: VllmConfig) -> None:
    """Raises UsageError: a vLLM setting under which the connector would load or store wrong KV."""
    parallel = vllm_config.parallel_config
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        if getattr(parallel, name, 1) > 1:
            raise UsageError(
                f"KVPoolConnector does not support {name}={getattr(parallel, name)}: a block's tokens are then "
                "spread over ranks (leave it at 1)"
            )
    policy = vllm_config.kv_transfer_config.kv_load_failure_policy
    if policy != "recompute":
        raise UsageError(
            f'KVPoolConnector needs kv_load_failure_policy "recompute", not "{policy}" (vLLM\'s default): a block '
            "the pool listed can still fail to arrive when its node dies, and vLLM must then compute it "
            "instead of failing the request"
        )


def _attention_group(kv_cache_config: KVCacheConfig) -> Any:
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1 or not isinstance(groups[0].kv_cache_spec, AttentionSpec):
        kinds = [type(g.kv_cache_spec).__name__ for g in groups]
        raise UsageError(f"KVPoolConnector supports one attention KV cache group, this model has {kinds}")
    return groups[0]


def cache_shape(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, model_id: str | None) -> CacheShape:
    """The shape of this engine's blocks (the same on the scheduler and on every worker)."""
    group = _attention_group(kv_cache_config)
    spec = group.kv_cache_spec
    model = vllm_config.model_config
    parallel = vllm_config.parallel_config
    return CacheShape(
        model=model_id or str(model.model),
        dtype=str(spec.dtype).removeprefix("torch."),
        layout=vllm_config.cache_config.kv_cache_layout,  # resolved by vLLM's engine core by now
        kind="mla" if isinstance(spec, MLAAttentionSpec) else "mha",
        layers=len(group.layer_names),
        kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        block_size=spec.block_size,
        tp_size=parallel.tensor_parallel_size,
        pp_size=parallel.pipeline_parallel_size,
        revision=None if model_id else model.revision,
        quantization=model.quantization,
    )


def _ranks(vllm_config: VllmConfig) -> tuple[int, int]:
    """This worker's tensor- and pipeline-parallel ranks: from vLLM's process groups, or, before
    they exist, from the worker's global rank in vLLM's order (TP fastest, then PP)."""
    from vllm.distributed import parallel_state

    try:
        return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pp_group().rank_in_group
    except AssertionError:  # vLLM's process groups are not initialised
        parallel = vllm_config.parallel_config
        tp_size = parallel.tensor_parallel_size
        return parallel.rank % tp_size, (parallel.rank // tp_size) % parallel.pipeline_parallel_size


def _scheduled(output: SchedulerOutput) -> list[ScheduledRequest]:
    counts = output.num_scheduled_tokens
    steps = [
        ScheduledRequest(r.req_id, r.num_computed_tokens, counts.get(r.req_id, 0), tuple(r.block_ids[0]), True)
        for r in output.scheduled_new_reqs
    ]
    cached = output.scheduled_cached_reqs
    for i, req_id in enumerate(cached.req_ids):
        new = cached.new_block_ids[i]
        steps.append(
            ScheduledRequest(
                req_id,
                cached.num_computed_tokens[i],
                counts.get(req_id, 0),
                tuple(new[0]) if new else (),
                req_id in cached.resumed_req_ids,
            )
        )
    return steps
