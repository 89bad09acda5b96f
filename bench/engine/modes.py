"""The four ways the benchmark serves the same workload, and one run of each.

(a) no prefix cache: every prompt is prefilled whole;
(b) local prefix cache only: reuse what still sits in the engine's pages (LRU);
(c) local + a 1-node kvpool: blocks the local cache evicts are saved to the pool,
    and a request loads from the pool what it misses locally;
(d) local + a 3-node kvpool (etcd membership), disaggregated: a prefill process
    computes prompts and writes their blocks, a decode process reads them and
    generates.

Every run starts with an empty local cache, and with an empty pool as far as it can
tell: each run hashes its blocks with its own seed, so it never sees the blocks of
an earlier run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from bench.engine.driver import ClosedLoop, RequestRecord, Workers
from bench.engine.engine import EngineConfig
from bench.engine.model import ModelConfig
from bench.engine.pool_tier import SavePolicy
from bench.engine.request import Finished
from bench.engine.worker import BLOCK_SIZE, EngineSpec, PoolSpec, Submit, WorkerReport
from bench.engine.workload import Workload
from bench.harness import machine
from tests.support.daemon import LocalCluster

PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True, slots=True)
class Mode:
    key: str
    label: str
    prefix_cache: bool
    pool_nodes: int
    disaggregated: bool


MODES = (
    Mode("a", "no prefix cache", False, 0, False),
    Mode("b", "local prefix cache", True, 0, False),
    Mode("c", "local + kvpool 1 node", True, 1, False),
    Mode("d", "local + kvpool 3 nodes, P/D split", True, 3, True),
)


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What every run shares."""

    model: ModelConfig
    num_pages: int
    max_batch_tokens: int
    threads: int = 1  # torch threads per engine process
    pool_dram: str = "512MiB"


@dataclass(frozen=True, slots=True)
class RunResult:
    mode: Mode
    concurrency: int
    records: tuple[RequestRecord, ...]
    workers: dict[str, WorkerReport]
    foreign_cores: float
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class LongPrefixResult:
    mode: Mode
    prefix_tokens: int
    ttft_s: tuple[float, ...]
    pool_hit_tokens: tuple[int, ...]
    loaded_bytes: tuple[int, ...]
    outputs: tuple[tuple[int, ...], ...]


@contextlib.contextmanager
def pool_for(mode: Mode, cfg: BenchConfig) -> Iterator[PoolSpec | None]:
    """Start the mode's pool (none, 1 standalone daemon, or etcd + 3 daemons); stop it after."""
    if mode.pool_nodes == 0:
        yield None
        return
    flags = ("--dram-capacity", cfg.pool_dram, "--slab-size", "4MiB", "--log-level", "warning")
    with LocalCluster(mode.pool_nodes, *flags, with_etcd=mode.pool_nodes > 1) as cluster:
        if cluster.etcd is None:
            yield PoolSpec(nodes=tuple(cluster.addresses))
        else:
            yield PoolSpec(etcd_endpoints=cluster.etcd_endpoints, cluster=cluster.cluster)


def _spec(
    cfg: BenchConfig,
    mode: Mode,
    seed: str,
    pool: PoolSpec | None,
    policy: SavePolicy,
    threads: int,
    pages: int | None = None,
) -> EngineSpec:
    engine = EngineConfig(pages or cfg.num_pages, cfg.max_batch_tokens, mode.prefix_cache, seed=seed)
    tier = PoolSpec(pool.nodes, pool.etcd_endpoints, pool.cluster, pool.replicas, policy) if pool else None
    return EngineSpec(cfg.model, engine, tier, threads)


def configure(
    workers: Workers, cfg: BenchConfig, mode: Mode, seed: str, pool: PoolSpec | None, pages: int | None = None
) -> None:
    """Build fresh engines for ``mode``: one worker, or a prefill and a decode worker."""
    if mode.disaggregated:
        workers.configure(PREFILL, _spec(cfg, mode, seed, pool, SavePolicy.FINISH, cfg.threads, pages))
        workers.configure(DECODE, _spec(cfg, mode, seed, pool, SavePolicy.FINISH, cfg.threads, pages))
    else:
        workers.configure(PREFILL, _spec(cfg, mode, seed, pool, SavePolicy.EVICT, cfg.threads, pages))


def run_mode(
    workers: Workers,
    cfg: BenchConfig,
    mode: Mode,
    concurrency: int,
    workload: Workload,
    pool: PoolSpec | None,
    attempt: int = 0,
) -> RunResult:
    """Serve ``workload`` with ``concurrency`` closed-loop users in ``mode`` (``attempt`` > 0: a rerun,
    with its own hash seed so it cannot reuse what the earlier attempt left in the pool)."""
    configure(workers, cfg, mode, f"run-{mode.key}-c{concurrency}-{attempt}", pool)
    before = machine.sample()
    loop = ClosedLoop(workload, concurrency, workers, PREFILL, DECODE if mode.disaggregated else None)
    records = loop.run()
    foreign = machine.foreign_cores(before, machine.sample())
    names = (PREFILL, DECODE) if mode.disaggregated else (PREFILL,)
    return RunResult(mode, concurrency, tuple(records), {n: workers.collect(n) for n in names}, foreign, attempt)


def _serve_one(workers: Workers, rid: str, prompt: list[int], tokens: int) -> tuple[float, Finished]:
    """Serve one request alone; returns its submission time and completion."""
    submitted = time.monotonic()
    workers.send(PREFILL, Submit(rid, prompt, tokens, submitted))
    while True:
        _, payload = workers.receive()
        done = [e for e in payload if isinstance(e, Finished)] if isinstance(payload, list) else []
        if done:
            return submitted, done[0]


def run_long_prefix(
    workers: Workers,
    cfg: BenchConfig,
    mode: Mode,
    pool: PoolSpec | None,
    pairs: list[tuple[list[int], list[int]]],
    prefix_tokens: int,
    output_tokens: int,
) -> LongPrefixResult:
    """Per pair: serve the first prompt, evict every cached block, then time the second prompt.

    In (b) the evicted prefix is gone and is prefilled again; in (c) eviction saved it
    to the pool and the second request loads it.
    """
    longest = max(len(p) for pair in pairs for p in pair)
    pages = max(cfg.num_pages, -(-(longest + output_tokens) // BLOCK_SIZE) + 8)
    configure(workers, cfg, mode, f"long-{mode.key}", pool, pages)
    ttfts, hits, loaded, outputs = [], [], [], []
    for index, (first, second) in enumerate(pairs):
        _serve_one(workers, f"warm{index}", first, output_tokens)
        workers.evict_all(PREFILL)
        submitted, done = _serve_one(workers, f"long{index}", second, output_tokens)
        ttfts.append(done.first_token_at - submitted)
        hits.append(done.pool_hit_tokens)
        loaded.append(done.loaded_bytes)
        outputs.append(done.output)
    return LongPrefixResult(mode, prefix_tokens, tuple(ttfts), tuple(hits), tuple(loaded), tuple(outputs))
