"""TTFT and throughput of the reference engine with and without kvpool as its second KV tier.

One invocation serves the same workload (multi-turn conversations about shared long
documents, several times the engine's KV budget) at each concurrency in four modes:
(a) no prefix cache, (b) local prefix cache, (c) local + kvpool on 1 node,
(d) local + kvpool on 3 nodes with prefill and decode in separate processes. Then
the evicted-long-prefix case: (b) recomputes a long prefix that (c) loads.

Writes ttft.json, ttft.md and ttft.png to --out (default bench/results/).

Run: python bench/ttft.py [--quick] [--layers N] [--concurrency 8,16] [--modes abcd]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from bench.engine import report
from bench.engine.driver import Workers
from bench.engine.model import ModelConfig
from bench.engine.modes import (
    DECODE,
    MODES,
    PREFILL,
    BenchConfig,
    LongPrefixResult,
    Mode,
    RunResult,
    pool_for,
    run_long_prefix,
    run_mode,
)
from bench.engine.worker import BLOCK_SIZE, PoolSpec
from bench.engine.workload import Workload, WorkloadSpec, build_workload, long_prefix_prompts
from kvpool_client.integrations.namespaces import KVLayout


@dataclasses.dataclass(frozen=True, slots=True)
class Preset:
    layers: int
    num_pages: int
    max_batch_tokens: int
    workload: WorkloadSpec
    long_prefix_tokens: int
    long_prefix_trials: int
    retry_budget_s: float


@dataclasses.dataclass(slots=True)
class _RetryBudget:
    left_s: float


# A run during which other processes used more than this many cores is measured again.
NOISY_CORES = 0.6


FULL = Preset(
    2,
    256,
    512,
    WorkloadSpec(vocab=8192, documents=12, document_tokens=768, conversations=16, turns=3, message_tokens=(32, 64)),
    3072,
    3,
    90.0,
)
QUICK = Preset(
    1,
    64,
    512,
    WorkloadSpec(
        vocab=8192,
        documents=4,
        document_tokens=192,
        conversations=16,
        turns=2,
        message_tokens=(16, 48),
        output_tokens=8,
    ),
    1024,
    1,
    0.0,
)


def _meta(preset: Preset, model: ModelConfig, workload_tokens: tuple[int, int], wall_s: float) -> dict[str, object]:
    layout = KVLayout(model.layers, model.kv_heads, model.head_dim, BLOCK_SIZE, "fp32")
    flops_per_byte = model.linear_flops_per_token() / layout.token_nbytes
    working_set, prompt_tokens = workload_tokens
    budget_tokens = preset.num_pages * BLOCK_SIZE
    return {
        "model": dataclasses.asdict(model),
        "kv_layout": layout.id,
        "kv_bytes_per_token": layout.token_nbytes,
        "kv_block_bytes": layout.block_nbytes,
        "prefill_flops_per_token": model.linear_flops_per_token(),
        "prefill_flops_per_kv_byte_fp32": flops_per_byte,
        "prefill_flops_per_kv_byte_bf16_equivalent": 2 * flops_per_byte,
        "kv_budget_pages": preset.num_pages,
        "kv_budget_tokens": budget_tokens,
        "max_batch_tokens": preset.max_batch_tokens,
        "workload": dataclasses.asdict(preset.workload),
        "working_set_tokens": working_set,
        "working_set_over_budget": working_set / budget_tokens,
        "prompt_tokens_per_run": prompt_tokens,
        "long_prefix_tokens": preset.long_prefix_tokens,
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "noisy_cores": NOISY_CORES,
        "wall_s": wall_s,
    }


def _print_run(s: report.RunSummary) -> None:
    print(
        f"  ({s.mode}) c={s.concurrency:<3} TTFT p50 {s.ttft_p50_s:6.2f} s  p99 {s.ttft_p99_s:6.2f} s  "
        f"{s.throughput_tok_s:7.0f} tok/s  local {s.local_hit_rate:4.0%}  pool {s.pool_hit_rate:4.0%}  "
        f"prefilled {s.prefilled_fraction:4.0%}  {s.loaded_bytes_per_request / 2**20:6.2f} MiB/req  "
        f"compute {s.compute_s:5.1f} s  pool I/O {s.pool_io_s:5.2f} s  other load {s.foreign_cores:.2f}",
        flush=True,
    )


def _steady_run(
    workers: Workers,
    cfg: BenchConfig,
    mode: Mode,
    concurrency: int,
    workload: Workload,
    pool: PoolSpec | None,
    retry: _RetryBudget,
) -> RunResult:
    """One run, measured once more if other processes took more than NOISY_CORES and the retry budget
    lasts; keeps the less disturbed attempt. Mode (a), the slowest and never gated, is not rerun.
    """
    first = run_mode(workers, cfg, mode, concurrency, workload, pool)
    if first.foreign_cores <= NOISY_CORES or retry.left_s <= 0 or mode.key == "a":
        return first
    print(f"  ({mode.key}) c={concurrency}: {first.foreign_cores:.2f} cores of other load; measuring again", flush=True)
    started = time.monotonic()
    second = run_mode(workers, cfg, mode, concurrency, workload, pool, attempt=1)
    retry.left_s -= time.monotonic() - started
    return min(first, second, key=lambda r: r.foreign_cores)


def _measure(
    preset: Preset,
    cfg: BenchConfig,
    modes: list[Mode],
    concurrencies: list[int],
    workload: Workload,
    seed: int,
    retry: _RetryBudget,
) -> tuple[list[RunResult], list[LongPrefixResult]]:
    """Every (concurrency, mode) run, then the evicted-long-prefix case in (b) and (c)."""
    runs: list[RunResult] = []
    long_prefix: list[LongPrefixResult] = []
    with contextlib.ExitStack() as stack:
        workers = stack.enter_context(Workers((PREFILL, DECODE)))  # they import torch while the pools start
        pools: dict[str, PoolSpec | None] = {m.key: stack.enter_context(pool_for(m, cfg)) for m in modes}
        stack.callback(workers.close)  # close the workers' clients before the pools stop
        for concurrency in concurrencies:
            for mode in modes:
                runs.append(_steady_run(workers, cfg, mode, concurrency, workload, pools[mode.key], retry))
                _print_run(report.summarize(runs[-1]))
        pairs = long_prefix_prompts(workload.spec, preset.long_prefix_trials, preset.long_prefix_tokens, seed + 1)
        for mode in [m for m in modes if m.key in "bc"]:
            result = run_long_prefix(
                workers, cfg, mode, pools[mode.key], pairs, preset.long_prefix_tokens, workload.spec.output_tokens
            )
            long_prefix.append(result)
            print(
                f"  evicted {preset.long_prefix_tokens}-token prefix, ({mode.key}): TTFT "
                + ", ".join(f"{t:.3f}" for t in result.ttft_s)
                + " s",
                flush=True,
            )
    return runs, long_prefix


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workload, 1 layer (< 90 s)")
    parser.add_argument("--layers", type=int, help="override the preset's depth")
    parser.add_argument("--concurrency", default="8,16")
    parser.add_argument("--modes", default="abcd")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retry-budget", type=float, help="seconds for rerunning disturbed runs (full 90, quick 0)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    preset = QUICK if args.quick else FULL
    model = ModelConfig(layers=args.layers or preset.layers, vocab=preset.workload.vocab, max_positions=8192)
    spec = dataclasses.replace(preset.workload, seed=args.seed)
    workload = build_workload(spec)
    cfg = BenchConfig(model, preset.num_pages, preset.max_batch_tokens)
    modes = [m for m in MODES if m.key in args.modes]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    print(
        f"model {model.name}; KV budget {preset.num_pages} pages x {BLOCK_SIZE} tokens; working set "
        f"{workload.working_set_tokens()} tokens; {workload.requests} requests, "
        f"{workload.prompt_tokens()} prompt tokens per run",
        flush=True,
    )
    started = time.monotonic()
    retry = _RetryBudget(args.retry_budget if args.retry_budget is not None else preset.retry_budget_s)
    runs, long_prefix = _measure(preset, cfg, modes, concurrencies, workload, args.seed, retry)
    summaries = [report.summarize(r) for r in runs]
    ratio_list = report.ratios(summaries, long_prefix)
    mismatches = report.output_mismatches(runs)
    meta = _meta(preset, model, (workload.working_set_tokens(), workload.prompt_tokens()), time.monotonic() - started)
    paths = report.write(args.out, meta, summaries, ratio_list, long_prefix, mismatches)
    print()
    print(report.markdown(summaries, ratio_list, long_prefix))
    print(f"greedy outputs differing from (a): {mismatches}")
    print(f"wrote {', '.join(str(p) for p in paths.values())} in {meta['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
