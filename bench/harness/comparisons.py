"""What the engine integrations' benchmarks share: model KV shapes, figures over rounds, the report.

Each benchmark (bench/vllm/connector.py, bench/sglang/backend.py, bench/lmcache/plugin.py)
measures an integration against the SDK in interleaved rounds and reports medians of the
per-round values, with the target a ratio must reach.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class KVShape:
    """A model's KV cache per token (bf16, K and V): what decides a block's, page's or chunk's size."""

    name: str
    layers: int
    kv_heads: int
    head_size: int

    def nbytes(self, tokens: int) -> int:
        """Bytes of ``tokens`` tokens of every layer's K and V."""
        return self.layers * 2 * self.kv_heads * self.head_size * tokens * 2


QWEN2_5_0_5B = KVShape("Qwen2.5-0.5B", 24, 2, 64)
LLAMA_3_8B = KVShape("Llama-3-8B", 32, 8, 128)


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    value: float  # median over rounds
    rounds: tuple[float, ...]
    unit: str
    target: float | None = None  # a ratio's target (>=), if it has one


def median_figure(name: str, values: Sequence[float], unit: str, target: float | None = None) -> Figure:
    return Figure(name, statistics.median(values), tuple(values), unit, target)


def report(figures: Sequence[Figure], title: str, out: Path | None, stem: str) -> str:
    """Print the figures as a markdown table; with ``out``, also write ``stem``.md and .json there."""
    lines = [f"# {title}", "", "| figure | median | rounds | target |", "|---|---|---|---|"]
    for f in figures:
        verdict = "" if f.target is None else f">= {f.target:.1f} {'ok' if f.value >= f.target else 'BELOW'}"
        lines.append(f"| {f.name} | {f.value:.3g} {f.unit} | {', '.join(f'{v:.3g}' for v in f.rounds)} | {verdict} |")
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.md").write_text(text + "\n")
        (out / f"{stem}.json").write_text(json.dumps([asdict(f) for f in figures], indent=1))
    return text
