"""Figures of the TTFT benchmark: per-run summaries, ratios, JSON, a markdown table, plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.engine.modes import LongPrefixResult, RunResult

# Targets at the highest concurrency (the seed's gates): (c) vs (b).
TTFT_TARGET = 0.75  # TTFT p50 of (c) at most this fraction of (b)'s
THROUGHPUT_TARGET = 1.29  # throughput of (c) at least this multiple of (b)'s
LONG_PREFIX_TARGET = 5.0  # (b) / (c) TTFT p50 on an evicted long prefix


@dataclass(frozen=True, slots=True)
class RunSummary:
    mode: str
    label: str
    concurrency: int
    requests: int
    ttft_p50_s: float
    ttft_p99_s: float
    throughput_tok_s: float  # (prompt + output tokens) / makespan
    output_tok_s: float
    makespan_s: float
    prompt_tokens: int
    local_hit_rate: float  # prompt tokens reused from the local prefix cache
    pool_hit_rate: float  # of prompt tokens missing locally, the share loaded from the pool
    prefilled_fraction: float  # prompt tokens computed / prompt tokens
    loaded_bytes_per_request: float
    saved_bytes: int
    compute_s: float  # engine forward passes, all engine processes
    pool_io_s: float  # pool lookups, loads and saves, all engine processes
    foreign_cores: float  # CPU used by processes outside the benchmark during the run
    attempt: int  # 0, or which rerun was kept because the earlier ones shared the CPU with others


@dataclass(frozen=True, slots=True)
class Ratio:
    name: str
    concurrency: int
    value: float
    target: float | None  # None: reported, not gated
    higher_is_better: bool

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        good = self.value >= self.target if self.higher_is_better else self.value <= self.target
        return "ok" if good else "BELOW TARGET"


def summarize(run: RunResult) -> RunSummary:
    """The figures of one run."""
    records = run.records
    ttft = np.array([r.ttft_s for r in records])
    start = min(r.submitted for r in records)
    makespan = max(r.finished for r in records) - start
    prompt = sum(r.prompt_tokens for r in records)
    output = sum(len(r.output) for r in records)
    local = sum(r.local_hit_tokens for r in records)
    pool = sum(r.pool_hit_tokens for r in records)
    tiers = [w.tier for w in run.workers.values() if w.tier is not None]
    saved = sum(t.saved_bytes for t in tiers)
    pool_io = sum(t.lookup_s + t.load_s + t.save_s for t in tiers)
    compute = sum(w.engine.forward_s for w in run.workers.values())
    return RunSummary(
        run.mode.key,
        run.mode.label,
        run.concurrency,
        len(records),
        float(np.percentile(ttft, 50)),
        float(np.percentile(ttft, 99)),
        (prompt + output) / makespan,
        output / makespan,
        makespan,
        prompt,
        local / prompt,
        pool / max(1, prompt - local),
        (prompt - local - pool) / prompt,
        sum(r.loaded_bytes for r in records) / len(records),
        saved,
        compute,
        pool_io,
        run.foreign_cores,
        run.attempt,
    )


def _find(summaries: Sequence[RunSummary], mode: str, concurrency: int) -> RunSummary | None:
    return next((s for s in summaries if s.mode == mode and s.concurrency == concurrency), None)


def ratios(summaries: Sequence[RunSummary], long_prefix: Sequence[LongPrefixResult]) -> list[Ratio]:
    """(c) and (d) against (b), and (b) against (a), at every concurrency; gated at the highest."""
    out: list[Ratio] = []
    concurrencies = sorted({s.concurrency for s in summaries})
    for conc in concurrencies:
        gated = conc == concurrencies[-1]
        for top, bottom in (("c", "b"), ("d", "b"), ("b", "a")):
            hi, lo = _find(summaries, top, conc), _find(summaries, bottom, conc)
            if hi is None or lo is None:
                continue
            is_cb = gated and (top, bottom) == ("c", "b")
            out.append(
                Ratio(
                    f"TTFT p50 ({top})/({bottom})",
                    conc,
                    hi.ttft_p50_s / lo.ttft_p50_s,
                    TTFT_TARGET if is_cb else None,
                    False,
                )
            )
            out.append(
                Ratio(
                    f"throughput ({top})/({bottom})",
                    conc,
                    hi.throughput_tok_s / lo.throughput_tok_s,
                    THROUGHPUT_TARGET if is_cb else None,
                    True,
                )
            )
    by_mode = {r.mode.key: r for r in long_prefix}
    if "b" in by_mode and "c" in by_mode:
        value = float(np.median(by_mode["b"].ttft_s) / np.median(by_mode["c"].ttft_s))
        out.append(Ratio("evicted long prefix: TTFT p50 (b)/(c)", 1, value, LONG_PREFIX_TARGET, True))
    return out


def output_mismatches(runs: Sequence[RunResult]) -> dict[str, int]:
    """Per run, requests whose greedy output differs from mode (a)'s at the same concurrency (runs without an
    (a) run to compare with are left out)."""
    reference: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for run in runs:
        if run.mode.key == "a":
            for r in run.records:
                reference[(run.concurrency, r.conversation, r.turn)] = r.output
    out: dict[str, int] = {}
    for run in runs:
        if any(conc == run.concurrency for conc, _, _ in reference):
            key = f"{run.mode.key}@{run.concurrency}"
            out[key] = sum(reference.get((run.concurrency, r.conversation, r.turn)) != r.output for r in run.records)
    return out


def markdown(
    summaries: Sequence[RunSummary], ratio_list: Sequence[Ratio], long_prefix: Sequence[LongPrefixResult]
) -> str:
    lines = [
        "| mode | conc | TTFT p50 s | TTFT p99 s | tokens/s | output tok/s | makespan s | local hit | pool hit "
        "| prefilled | MiB loaded/req | compute s | pool I/O s | other load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in sorted(summaries, key=lambda s: (s.concurrency, s.mode)):
        lines.append(
            f"| ({s.mode}) {s.label} | {s.concurrency} | {s.ttft_p50_s:.2f} | {s.ttft_p99_s:.2f} "
            f"| {s.throughput_tok_s:.0f} | {s.output_tok_s:.1f} | {s.makespan_s:.1f} | {s.local_hit_rate:.0%} "
            f"| {s.pool_hit_rate:.0%} | {s.prefilled_fraction:.0%} | {s.loaded_bytes_per_request / 2**20:.2f} "
            f"| {s.compute_s:.1f} | {s.pool_io_s:.2f} | {s.foreign_cores:.2f} |"
        )
    lines += ["", "| ratio | conc | value | target | verdict |", "|---|---:|---:|---:|---|"]
    for r in ratio_list:
        target = "" if r.target is None else (f">= {r.target:g}" if r.higher_is_better else f"<= {r.target:g}")
        lines.append(f"| {r.name} | {r.concurrency} | {r.value:.3f} | {target} | {r.verdict} |")
    if long_prefix:
        lines += [
            "",
            "| evicted long prefix | prefix tokens | TTFT p50 s | TTFTs s | MiB loaded |",
            "|---|---:|---:|---|---:|",
        ]
        for lp in long_prefix:
            ttfts = ", ".join(f"{t:.3f}" for t in lp.ttft_s)
            lines.append(
                f"| ({lp.mode.key}) {lp.mode.label} | {lp.prefix_tokens} | {np.median(lp.ttft_s):.3f} "
                f"| {ttfts} | {np.median(lp.loaded_bytes) / 2**20:.1f} |"
            )
    return "\n".join(lines) + "\n"


def plot(summaries: Sequence[RunSummary], path: Path) -> None:
    """TTFT p50/p99 and throughput against concurrency, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode in sorted({s.mode for s in summaries}):
        rows = sorted((s for s in summaries if s.mode == mode), key=lambda s: s.concurrency)
        x = [s.concurrency for s in rows]
        line = left.plot(x, [s.ttft_p50_s for s in rows], marker="o", label=f"({mode}) {rows[0].label} p50")
        left.plot(x, [s.ttft_p99_s for s in rows], marker="x", linestyle=":", color=line[0].get_color())
        right.plot(x, [s.throughput_tok_s for s in rows], marker="o", label=f"({mode}) {rows[0].label}")
    left.set(xlabel="concurrency", ylabel="TTFT (s): p50 solid, p99 dotted", title="Time to first token")
    right.set(xlabel="concurrency", ylabel="tokens/s (prompt + output)", title="Throughput")
    for axis in (left, right):
        axis.set_xticks(sorted({s.concurrency for s in summaries}))
        axis.grid(alpha=0.3)
    left.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(
    out: Path,
    meta: dict[str, Any],
    summaries: Sequence[RunSummary],
    ratio_list: Sequence[Ratio],
    long_prefix: Sequence[LongPrefixResult],
    mismatches: dict[str, int],
) -> dict[str, Path]:
    """Write ttft.json, ttft.md and ttft.png into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "ttft.json", "md": out / "ttft.md", "png": out / "ttft.png"}
    document = {
        "meta": meta,
        "runs": [asdict(s) for s in summaries],
        "ratios": [{**asdict(r), "verdict": r.verdict} for r in ratio_list],
        "long_prefix": [
            {
                "mode": lp.mode.key,
                "prefix_tokens": lp.prefix_tokens,
                "ttft_s": lp.ttft_s,
                "pool_hit_tokens": lp.pool_hit_tokens,
                "loaded_bytes": lp.loaded_bytes,
            }
            for lp in long_prefix
        ],
        "output_mismatches_vs_a": mismatches,
    }
    paths["json"].write_text(json.dumps(document, indent=2))
    paths["md"].write_text(markdown(summaries, ratio_list, long_prefix))
    plot(summaries, paths["png"])
    return paths
