"""TTFT and throughput of vLLM with and without kvpool, on a GPU: the seed's experiment on a real engine.

Needs a CUDA machine with vLLM 0.33 and ``kvpool[server]`` installed. No weights are
downloaded: the model is a Qwen2.5-0.5B-shaped ``config.json`` with ``load_format="dummy"``,
and prompts go in as token ids (``skip_tokenizer_init``), so the model's output is noise but
its compute and KV cache are the real model's. The GPU KV cache is capped
(``num_gpu_blocks_override``) below the workload's working set, so prefixes are evicted
from the GPU and vLLM alone recomputes them; with kvpool it reloads them from the pool.

The workload is bench/engine/workload.py's: multi-turn conversations about shared long
documents, each turn's prompt the previous turn plus its answer plus a new message.
Conversations run ``--concurrency`` at a time, each turn after the previous one.

    python bench/vllm/gpu_ttft.py --concurrency 8 16 [--gpu-blocks 2048] [--out bench/results/vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.engine.workload import Workload, WorkloadSpec, build_workload  # noqa: E402

QWEN_05B = {  # Qwen2.5-0.5B's architecture; dummy weights
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "num_hidden_layers": 24,
    "max_position_embeddings": 32768,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "sliding_window": 32768,
    "use_sliding_window": False,
}


def kv_transfer(address: str) -> dict[str, Any]:
    """The README's block, pointed at the local daemon."""
    return {
        "kv_connector": "KVPoolConnector",
        "kv_connector_module_path": "kvpool_client.integrations.vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"nodes": address},
    }


def engine(model: Path, gpu_blocks: int, pool: str | None) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(model),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enable_prefix_caching=True,
        prefix_caching_hash_algo="sha256_cbor",
        max_model_len=16384,
        num_gpu_blocks_override=gpu_blocks,
        gpu_memory_utilization=0.8,
        enforce_eager=False,
        kv_transfer_config=kv_transfer(pool) if pool else None,
    )
    return AsyncLLM.from_engine_args(args)


async def conversation(llm: Any, workload: Workload, index: int, ttfts: list[float]) -> int:
    """Play one conversation's turns in order; returns the tokens generated."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=workload.spec.output_tokens, ignore_eos=True, temperature=0.0)
    chat = workload.conversations[index]
    prompt = workload.first_prompt(chat)
    output: list[int] = []
    generated = 0
    for turn in range(workload.spec.turns):
        if turn:
            prompt = workload.next_prompt(chat, turn, prompt, output)
        start = time.perf_counter()
        first = None
        output = []
        async for out in llm.generate({"prompt_token_ids": prompt}, params, request_id=str(uuid.uuid4())):
            first = first or time.perf_counter()
            output = list(out.outputs[0].token_ids)
        ttfts.append((first or time.perf_counter()) - start)
        generated += len(output)
    return generated


async def run(llm: Any, workload: Workload, concurrency: int) -> dict[str, float]:
    ttfts: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> int:
        async with gate:
            return await conversation(llm, workload, index, ttfts)

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(len(workload.conversations)))))
    wall = time.perf_counter() - start
    return {
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p90_ms": 1000 * statistics.quantiles(ttfts, n=10)[8],
        "requests_per_s": len(ttfts) / wall,
        "output_tokens_per_s": tokens / wall,
    }


def cell(model: Path, workload: Workload, gpu_blocks: int, concurrency: int, pooled: bool) -> dict[str, float]:
    """One measurement with a fresh engine (and a fresh daemon when ``pooled``)."""
    from tests.support.daemon import running_daemon

    async def measure(pool: str | None) -> dict[str, float]:
        llm = engine(model, gpu_blocks, pool)
        try:
            return await run(llm, workload, concurrency)
        finally:
            llm.shutdown()

    if not pooled:
        return asyncio.run(measure(None))
    with running_daemon("--dram-capacity", "48GiB", "--slab-size", "4MiB") as daemon:
        return asyncio.run(measure(daemon.address))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--gpu-blocks", type=int, default=2048, help="GPU KV blocks: below the working set")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "vllm")
    args = parser.parse_args()
    spec = WorkloadSpec(
        vocab=150000,
        system_tokens=512,
        documents=16,
        document_tokens=4096,
        conversations=64,
        turns=4,
        message_tokens=(64, 256),
        output_tokens=64,
    )
    workload = build_workload(spec)
    print(f"working set {workload.working_set_tokens() // 16} blocks of 16 tokens; GPU cache {args.gpu_blocks} blocks")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as work:
        model = Path(work) / "qwen2.5-0.5b-dummy"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(QWEN_05B))
        for concurrency in args.concurrency:
            for pooled in (False, True):  # every cell cold: a new engine, and a new pool
                name = f"{'kvpool' if pooled else 'vLLM alone'}, concurrency {concurrency}"
                results[name] = cell(model, workload, args.gpu_blocks, concurrency, pooled)
                print(name, results[name], flush=True)
    for concurrency in args.concurrency:
        alone, pooled = results[f"vLLM alone, concurrency {concurrency}"], results[f"kvpool, concurrency {concurrency}"]
        print(
            f"concurrency {concurrency}: TTFT p50 kvpool / alone {pooled['ttft_p50_ms'] / alone['ttft_p50_ms']:.2f}, "
            f"throughput {pooled['output_tokens_per_s'] / alone['output_tokens_per_s']:.2f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_ttft.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
