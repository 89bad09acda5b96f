"""vLLM's real scheduler and KV connector machinery on CPU, with a stand-in forward pass.

vLLM's wheel has no CPU kernels, so no model runs here; everything around the model does:
``Scheduler``, its KV cache manager and prefix cache, the connector factory, the model
runner's connector context (``KVConnectorModelRunnerMixin``, with speculative decoding's
deferred finalize when asked), the per-layer KV tensors ``allocate_kv_cache`` makes, and the
aggregation of several workers' outputs (``KVOutputAggregator``). :class:`Engine` steps them as
vLLM's engine core does, with one worker per tensor-parallel rank. The forward pass writes,
into each block it computes, bytes that depend only on the block's hash and the worker's
rank (:func:`block_bytes`): a block loaded from the pool must then hold exactly those.

Used by tests/engines/vllm and bench/vllm/connector.py; runs in the vLLM test environment.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import vllm.distributed.kv_transfer.kv_transfer_state as kv_state
from vllm import SamplingParams
from vllm.config import (
    AttentionConfig,
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import set_forward_context
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
from vllm.v1.worker.utils import allocate_kv_cache

from kvpool_client.integrations.vllm.connector import KVPoolConnector

EOS = 2
MODEL_CONFIG = {  # a llama-shaped config.json: vLLM reads the architecture, never weights
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "max_position_embeddings": 8192,
    "vocab_size": 32000,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": EOS,
    "tie_word_embeddings": False,
}


def model_dir(root: Path, name: str = "tiny-llama") -> Path:
    """A model folder holding only ``config.json`` (vLLM's ``ModelConfig`` needs one)."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return path


def vllm_config(
    model: Path,
    kv_transfer: dict[str, Any],
    block_size: int = 16,
    layout: str = "LBNHC",
    tp_size: int = 1,
    model_kwargs: dict[str, Any] | None = None,
) -> VllmConfig:
    """A CPU ``VllmConfig`` with prefix caching on vLLM's ``sha256_cbor`` hashes and ``kv_transfer``
    (the ``--kv-transfer-config`` JSON as a dict)."""
    model_config = ModelConfig(
        model=str(model), dtype="bfloat16", seed=0, skip_tokenizer_init=True, max_model_len=8192, **(model_kwargs or {})
    )
    scheduler = SchedulerConfig(
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        max_model_len=8192,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        disable_hybrid_kv_cache_manager=True,
    )
    cache = CacheConfig(
        block_size=block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=True,
        prefix_caching_hash_algo="sha256_cbor",
    )
    cache.kv_cache_layout = layout  # vLLM's engine core resolves it before it builds connectors
    return VllmConfig(
        scheduler_config=scheduler,
        model_config=model_config,
        cache_config=cache,
        kv_transfer_config=KVTransferConfig(**kv_transfer),
        device_config=DeviceConfig("cpu"),
        parallel_config=ParallelConfig(tensor_parallel_size=tp_size),
        attention_config=AttentionConfig(backend=None),
    )


def attention_spec(
    block_size: int = 16, kv_heads: int = 2, head_size: int = 64, mla: bool = False, dtype: torch.dtype = torch.bfloat16
) -> AttentionSpec:
    if mla:
        return MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=head_size, dtype=dtype)
    return FullAttentionSpec(block_size=block_size, num_kv_heads=kv_heads, head_size=head_size, dtype=dtype)


def block_bytes(block_hash: bytes, nbytes: int, rank: int = 0) -> torch.Tensor:
    """The bytes the stand-in forward pass of TP rank ``rank`` writes into the block with ``block_hash``."""
    seed = (int.from_bytes(block_hash[:8], "little") + rank * 7919) & (2**63 - 1)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)


class Engine:
    """One vLLM engine: a real ``Scheduler`` with its connector, and a worker's connector and caches
    for each tensor-parallel rank.

    Args:
        config: from :func:`vllm_config` (its ``tensor_parallel_size`` workers are made).
        spec: the attention layers' KV cache spec.
        layers: attention layers.
        num_blocks: KV cache blocks.
        defer_finalize: run the workers' connectors as vLLM's model runner does under
            speculative decoding: ``get_finished`` before ``wait_for_save``.
    """

    def __init__(
        self,
        config: VllmConfig,
        spec: AttentionSpec,
        layers: int = 2,
        num_blocks: int = 256,
        defer_finalize: bool = False,
    ) -> None:
        names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(names, spec)]
        )
        config.cache_config.num_gpu_blocks = num_blocks
        self.config = config
        self.block_size = spec.block_size
        self.defer_finalize = defer_finalize
        self.scheduler = Scheduler(
            vllm_config=config,
            kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=spec.block_size,
            log_stats=False,
        )
        self.workers = [self._worker(rank, spec, names, num_blocks) for rank in range(self.tp_size)]
        self.rank_layers = [w._transfers._layers for w in self.workers]  # each connector's byte view of its caches
        self._aggregator = KVOutputAggregator.from_connector(self.workers[0], len(self.workers))
        init_none_hash(sha256_cbor)
        self._hasher = get_request_block_hasher(spec.block_size, sha256_cbor)
        self.computed: dict[str, list[int]] = {}  # request -> block ids the forward pass wrote
        self.load_errors: set[int] = set()  # block ids the workers reported as not loaded
        self.loaded: set[str] = set()  # requests whose asynchronous loads ended

    @property
    def tp_size(self) -> int:
        return int(self.config.parallel_config.tensor_parallel_size)

    @property
    def layers(self) -> Any:
        """TP rank 0's cache as pool blocks."""
        return self.rank_layers[0]

    def _worker(self, rank: int, spec: AttentionSpec, names: list[str], num_blocks: int) -> Any:
        """The connector of the worker of global rank ``rank``, with its KV caches registered."""
        config = copy.copy(self.config)
        config.parallel_config = copy.copy(self.config.parallel_config)
        config.parallel_config.rank = rank  # as vLLM's worker sets it
        with set_current_vllm_config(config):
            worker = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, self.kv_cache_config)
        worker.register_kv_caches(_allocate(config, self.kv_cache_config, spec, names, num_blocks))
        return worker

    @property
    def connector(self) -> KVPoolConnector:
        return self.scheduler.connector  # type: ignore[no-any-return]

    def add(self, req_id: str, tokens: Sequence[int], max_tokens: int = 1) -> Request:
        params = SamplingParams(max_tokens=max_tokens)
        params.update_from_generation_config({}, EOS)
        request = Request(
            request_id=req_id,
            prompt_token_ids=list(tokens),
            sampling_params=params,
            pooling_params=None,
            block_hasher=self._hasher,
        )
        self.scheduler.add_request(request)
        return request

    def step(self, after_forward: Callable[[Any], None] | None = None) -> Any:
        """One engine step: schedule, each worker's connector around a stand-in forward, update.

        ``after_forward(scheduler_output)`` runs after the forward pass, before the worker's
        connector starts this step's asynchronous loads and saves.
        """
        output = self.scheduler.schedule()
        outputs = [self._execute(rank, output, after_forward) for rank in range(self.tp_size)]
        aggregated = self._aggregator.aggregate(outputs)
        transfers = aggregated.kv_connector_output
        self.load_errors |= transfers.invalid_block_ids
        self.loaded |= transfers.finished_recving or set()
        self.scheduler.update_from_output(output, aggregated)
        return output

    def _execute(self, rank: int, output: Any, after_forward: Callable[[Any], None] | None) -> ModelRunnerOutput:
        """One worker's part of a step, through vLLM's model-runner connector context."""
        worker = self.workers[rank]
        worker.handle_preemptions(output.kv_connector_metadata)
        kv_state._KV_CONNECTOR_AGENT = worker
        try:
            with (
                set_forward_context(None, self.config),
                KVConnectorModelRunnerMixin._get_kv_connector_output(
                    output, defer_finalize=self.defer_finalize
                ) as transfers,
            ):
                self._forward(output, rank)
                if after_forward is not None and rank == 0:
                    after_forward(output)
            if self.defer_finalize:  # the draft model's forward ran: now wait_for_save
                KVConnectorModelRunnerMixin.finalize_kv_connector()
        finally:
            kv_state._KV_CONNECTOR_AGENT = None
        return self._model_output(output, transfers)

    def run(
        self, done: Callable[[], bool], timeout_s: float = 30.0, after_forward: Callable[[Any], None] | None = None
    ) -> int:
        """Step until ``done()`` (``after_forward`` as in :meth:`step`); returns the steps taken.

        Raises:
            TimeoutError: not done in time.
        """
        deadline = time.monotonic() + timeout_s
        steps = 0
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done after {steps} steps: {self.scheduler.requests}")
            self.step(after_forward)
            steps += 1
            time.sleep(0.001)  # a step with nothing to do returns at once: let transfers run
        return steps

    def idle(self) -> bool:
        """No request left, and no request's blocks held for a transfer."""
        return not self.scheduler.requests

    def block_ids(self, req_id: str) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0])

    def read_block(self, block_id: int, rank: int = 0) -> torch.Tensor:
        """Block ``block_id`` of every layer of TP rank ``rank``, as the pool stores it."""
        layers = self.rank_layers[rank]
        out = torch.empty(layers.block_nbytes, dtype=torch.uint8)
        layers.gather(block_id, out)
        return out

    def free_blocks(self) -> int:
        """Blocks in vLLM's free queue: all of them but the null block when nothing holds any."""
        return int(self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def close(self) -> None:
        self.scheduler.shutdown()
        for worker in self.workers:
            worker.shutdown()

    def _forward(self, output: Any, rank: int) -> None:
        """Write each block the step completes: the bytes its hash and the rank decide."""
        layers = self.rank_layers[rank]
        counts = output.num_scheduled_tokens
        steps = [(r.req_id, r.num_computed_tokens) for r in output.scheduled_new_reqs]
        cached = output.scheduled_cached_reqs
        steps += list(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for req_id, computed in steps:
            request = self.scheduler.requests[req_id]
            ids = self.block_ids(req_id)
            first, stop = computed // self.block_size, (computed + counts[req_id]) // self.block_size
            for index in range(first, min(stop, len(request.block_hashes))):
                layers.scatter(ids[index], block_bytes(request.block_hashes[index], layers.block_nbytes, rank))
                if rank == 0:
                    self.computed.setdefault(req_id, []).append(ids[index])

    def _model_output(self, output: Any, transfers: Any) -> ModelRunnerOutput:
        req_ids = list(output.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            request = self.scheduler.requests[req_id]
            # schedule() has counted this step's tokens as computed already
            sampled.append([7] if request.num_computed_tokens >= request.num_tokens else [])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=transfers,
        )


def _allocate(
    config: VllmConfig, kv_cache_config: KVCacheConfig, spec: AttentionSpec, names: list[str], num_blocks: int
) -> dict[str, torch.Tensor]:
    """The per-layer KV tensors vLLM's worker makes, with vLLM's own planner and allocator."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups

    planned = get_kv_cache_config_from_groups(
        config, kv_cache_config.kv_cache_groups, num_blocks * len(names) * spec.page_size_bytes
    )
    layout = KVCacheLayout[config.cache_config.kv_cache_layout]
    caches = allocate_kv_cache(planned, torch.device("cpu"), layout)
    assert all(t.shape[0] == num_blocks for t in caches.values()), {n: t.shape for n, t in caches.items()}
    return caches
