"""vLLM's ``OffloadingConnector`` with ``TieringOffloadingSpec`` on CPU, kvpool as its secondary tier.

The scheduler side is vLLM's own: connector, tiering manager, CPU primary tier in shared
memory, and the secondary tier it loads (:class:`~kvpool_client.integrations.vllm.tier.KVPoolTier`).
vLLM's worker side of offloading copies between GPU blocks and the primary tier with CUDA
kernels and refuses to start without a GPU, so :class:`PrimaryTierCopier` does its part:
each step it performs the metadata's store jobs (GPU block -> primary row) and load jobs
(primary row -> GPU block) and reports them done, as vLLM's worker does. Its "GPU" blocks
hold the bytes :func:`~bench.vllm.harness.block_bytes` gives for their hash.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm import SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from bench.vllm.harness import attention_spec, block_bytes, vllm_config

# The test's CPU tier: 64 chunks of one 16-token block; no poll thread (steps drive the tiers).
TEST_SIZES = {"cpu_bytes_to_use": 64 * 8192, "block_size": 16, "tier_poll_interval_s": 0}


class TieredEngine:
    """A real ``Scheduler`` with the offloading connector, and the stand-in worker copies."""

    def __init__(self, model: Path, kv_transfer: dict[str, Any], engine_id: str, num_blocks: int = 128) -> None:
        extra = {**kv_transfer["kv_connector_extra_config"], **TEST_SIZES}
        kv_transfer = dict(kv_transfer, engine_id=engine_id, kv_connector_extra_config=extra)
        config = vllm_config(model, kv_transfer, layout="LBHNC")  # the offloading connector's layout
        spec = attention_spec()
        names = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(names, spec)]
        )
        config.cache_config.num_gpu_blocks = num_blocks
        self.block_nbytes = spec.page_size_bytes * len(names)
        self.scheduler = Scheduler(
            vllm_config=config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=spec.block_size,
            log_stats=False,
        )
        manager = self.scheduler.connector.connector_scheduler.manager
        self.tier = manager.secondary_tiers[0]
        view = manager.primary_tier.get_kv_memoryview()
        self.rows = np.asarray(view).view(np.uint8)  # the primary tier's rows, zero copy
        assert self.rows.shape[1] == self.block_nbytes, (self.rows.shape, self.block_nbytes)
        init_none_hash(sha256_cbor)
        self._block_hasher = get_request_block_hasher(spec.block_size, sha256_cbor)
        self.loaded_rows: dict[int, np.ndarray] = {}  # primary row -> its bytes when a load job read it

    def add(self, req_id: str, tokens: list[int]) -> Request:
        params = SamplingParams(max_tokens=1)
        params.update_from_generation_config({}, 2)
        request = Request(
            request_id=req_id,
            prompt_token_ids=tokens,
            sampling_params=params,
            pooling_params=None,
            block_hasher=self._block_hasher,
        )
        self.scheduler.add_request(request)
        return request

    def step(self) -> Any:
        output = self.scheduler.schedule()
        transfers = self._copy(output)
        req_ids = list(output.num_scheduled_tokens)
        sampled = [
            [7] if self.scheduler.requests[r].num_computed_tokens >= self.scheduler.requests[r].num_tokens else []
            for r in req_ids
        ]
        self.scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=sampled,
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=None,
                kv_connector_output=transfers,
            ),
        )
        return output

    def run(self, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Step until ``done()``.

        Raises:
            TimeoutError: not done in time.
        """
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done: {self.scheduler.requests}")
            self.step()
            time.sleep(0.001)  # the tier's threads answer between steps

    def idle(self) -> bool:
        manager = self.scheduler.connector.connector_scheduler.manager
        return not self.scheduler.requests and not manager.has_pending_work()

    def close(self) -> None:
        self.rows = np.empty(0, dtype=np.uint8)  # drop the view of the shared rows first
        self.scheduler.shutdown()

    def _copy(self, output: Any) -> KVConnectorOutput:
        """Do the worker's copies between "GPU" blocks and primary rows, and report them done."""
        metadata = output.kv_connector_metadata
        assert isinstance(metadata, OffloadingConnectorMetadata), type(metadata)
        done = OffloadingWorkerMetadata()
        loaded: set[str] = set()
        for job_id, job in metadata.store_jobs.items():
            for gpu, row in zip(job.src_spec.block_ids, job.dst_spec.block_ids, strict=True):
                self.rows[int(row)] = self._gpu_block(job.req_id, int(gpu)).numpy()
            done.mark_completed(job_id)
        for job_id, job in metadata.load_jobs.items():
            for row in job.src_spec.block_ids:
                self.loaded_rows[int(row)] = self.rows[int(row)].copy()
            done.mark_completed(job_id)
            if not job.sync:
                loaded.add(job.req_id)
        return KVConnectorOutput(finished_recving=loaded or None, kv_connector_worker_meta=done)

    def _gpu_block(self, req_id: str, block_id: int) -> torch.Tensor:
        """What the model wrote into GPU block ``block_id`` of request ``req_id``."""
        request = self.scheduler.requests[req_id]
        index = list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]).index(block_id)
        return block_bytes(request.block_hashes[index], self.block_nbytes)
