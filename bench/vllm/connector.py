"""What the vLLM connector costs on top of the SDK, as ratios measured in one run.

- Lookups: matched-token answers per second for prompts of 1,000 stored blocks, through
  the connector's scheduler side (``get_num_new_matched_tokens`` until it answers: the
  thread hand-off included) against the SDK's ``lookup`` of the same keys.
- Loads and saves: a 32-block prefix into and out of vLLM's per-layer KV tensors (made by
  vLLM's own allocator) through the connector's worker side (``WorkerTransfers``: the
  transfer thread, staging and completion reports included), against the SDK's batched
  get and put of the same bytes into and out of 64-byte aligned torch buffers, and
  against memcpy of those bytes. Two model shapes (Qwen2.5-0.5B, Llama-3-8B; bf16, 16-token
  blocks) and two cache layouts: vLLM's default layer-major ``LBNHC`` (a block is 2 x layers
  regions: one staging copy each way) and block-major ``BLHNC`` (a block is one slice:
  no copy in Python).

Rounds interleave the systems; each ratio is the median of its per-round ratios.
Runs in the vllm test environment (deploy/dev.sh bench-vllm), against one local daemon.

    python bench/vllm/connector.py [--rounds 5] [--quick] [--out bench/results/vllm]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.harness.comparisons import LLAMA_3_8B, QWEN2_5_0_5B, Figure, KVShape, median_figure, report  # noqa: E402
from bench.harness.servers import kvpool_daemon  # noqa: E402
from bench.vllm.harness import attention_spec, model_dir, vllm_config  # noqa: E402
from kvpool_client import BlockKey, ClientConfig, KVPoolClient  # noqa: E402
from kvpool_client.integrations.vllm.blocks import BlockLayers  # noqa: E402
from kvpool_client.integrations.vllm.lookup import RankLookup  # noqa: E402
from kvpool_client.integrations.vllm.scheduler import SchedulerPlan, StepPlan, TransferJob  # noqa: E402
from kvpool_client.integrations.vllm.shape import CacheShape, EngineNamespaces  # noqa: E402
from kvpool_client.integrations.vllm.streams import HostOrder  # noqa: E402
from kvpool_client.integrations.vllm.worker import WorkerTransfers  # noqa: E402

PREFIX_BLOCKS = 32
LOOKUP_BLOCKS = 1000


SHAPES = (QWEN2_5_0_5B, LLAMA_3_8B)
BLOCK_TOKENS = 16
LAYOUTS = ("LBNHC", "BLHNC")
TRANSPORTS = ("tcp", "shm")  # gets over the socket, or copied out of the node's arena (same node)


class _Request:
    """What the scheduler plan reads of vLLM's Request."""

    def __init__(self, req_id: str, hashes: list[bytes], block_size: int) -> None:
        self.request_id = req_id
        self.block_hashes = hashes
        self.num_tokens = len(hashes) * block_size + 1


def _hashes(tag: str, count: int) -> list[bytes]:
    return [f"{tag}-{i}".encode().ljust(32, b".") for i in range(count)]


def _timed(run: Callable[[], object], repeat: int) -> float:
    """Seconds per call of ``run`` (best-of is not used: medians come from rounds)."""
    start = time.perf_counter()
    for _ in range(repeat):
        run()
    return (time.perf_counter() - start) / repeat


# -- lookups ------------------------------------------------------------------


STEP_S = 0.001  # what a scheduler step takes besides the connector (a GPU step takes longer)
POLL_S = 0.0002  # how often the benchmark asks the worker side whether a transfer ended


def namespaces(name: str) -> EngineNamespaces:
    return CacheShape(name, "bfloat16", "bench", "mha", 2, 2, 64, BLOCK_TOKENS).namespaces()


def lookup_round(
    client: KVPoolClient, spaces: EngineNamespaces, hashes: list[bytes], repeat: int
) -> tuple[float, float]:
    """(connector lookups/s, SDK lookups/s) for one round.

    The connector's figure is the scheduler's view: ``repeat`` waiting requests asked at
    each step (one step every :data:`STEP_S`) until every one has its answer.
    """
    # The SDK's caller builds the keys from the hashes too, as the connector does.
    namespace = spaces.of(0, 0).id
    sdk = 1 / _timed(lambda: client.lookup([BlockKey(namespace, h) for h in hashes]), repeat)
    with ThreadPoolExecutor(1) as pool:
        plan = SchedulerPlan(RankLookup(client), pool, spaces, 16)
        waiting = [_Request(f"r{i}", hashes, 16) for i in range(repeat)]
        start = time.perf_counter()
        while waiting:
            waiting = [r for r in waiting if plan.matched_tokens(r, 0)[0] is None]
            time.sleep(STEP_S)
        connector = repeat / (time.perf_counter() - start)
    return connector, sdk


# -- loads and saves ----------------------------------------------------------


class Cache:
    """vLLM-allocated per-layer KV tensors of one model shape and layout, with its transfers."""

    def __init__(self, client: KVPoolClient, shape: KVShape, layout: str, work: Path) -> None:
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

        from bench.vllm.harness import _allocate  # vLLM's planner and allocator

        config = vllm_config(
            model_dir(work),
            {"kv_connector": "KVPoolConnector", "kv_connector_module_path": "unused", "kv_role": "kv_both"},
            BLOCK_TOKENS,
            layout,
        )
        spec = attention_spec(BLOCK_TOKENS, shape.kv_heads, shape.head_size)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(shape.layers)]
        blocks = 2 * PREFIX_BLOCKS
        groups = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(names, spec)])
        caches = _allocate(config, groups, spec, names, blocks)
        self.layers = BlockLayers(caches, names, blocks)
        assert self.layers.block_nbytes == shape.nbytes(BLOCK_TOKENS), (
            self.layers.block_nbytes,
            shape.nbytes(BLOCK_TOKENS),
        )
        for tensor in {id(t.untyped_storage()): t for t in caches.values()}.values():
            torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage()).random_(0, 256)
        self.transfers = TimedTransfers(client, self.layers, HostOrder())
        self.namespaces = namespaces(f"bench-{shape.name}-{layout}")
        self._serial = 0

    def keys(self, count: int = PREFIX_BLOCKS) -> list[BlockKey]:
        """Fresh keys in the namespace the connector stores in (what a job of :meth:`job` moves)."""
        self._serial += 1
        namespace = self.namespaces.of(0, 0).id
        return [BlockKey(namespace, h) for h in _hashes(f"k{self._serial}", count)]

    def job(self, req: str, keys: list[BlockKey], first_block: int) -> TransferJob:
        block_ids = tuple(range(first_block, first_block + len(keys)))
        return TransferJob(req, tuple(k.hash for k in keys), 0, block_ids, self.namespaces)

    def save(self, keys: list[BlockKey]) -> float:
        """Seconds from ``wait_for_save`` to the end of the save, on the transfer thread."""
        req = f"s{self._serial}"
        plan = StepPlan(saves=[self.job(req, keys, 0)], finishing=frozenset({req}))
        start = time.perf_counter()
        self.transfers.begin_step(plan)
        self.transfers.start_saves(plan)
        while not (self.transfers.finished()[0] or set()) & {req}:
            time.sleep(POLL_S)
        return self.transfers.ended.pop(req) - start

    def load(self, keys: list[BlockKey]) -> float:
        """Seconds from ``start_load_kv`` to the end of the load, on the transfer thread."""
        req = f"l{self._serial}"
        start = time.perf_counter()
        self.transfers.begin_step(StepPlan(loads=[self.job(req, keys, PREFIX_BLOCKS)]))
        while req not in (self.transfers.finished()[1] or set()):
            time.sleep(POLL_S)
        errors = self.transfers.load_errors()
        assert not errors, f"load errors: {sorted(errors)}"
        return self.transfers.ended.pop(req) - start


class TimedTransfers(WorkerTransfers):
    """The connector's worker side, noting when each transfer ended on its thread: the benchmark
    polls for the report (vLLM polls once a step), and the poll's interval is not the connector's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended: dict[str, float] = {}

    def _load(self, job: TransferJob, mark: Any) -> None:
        super()._load(job, mark)
        self.ended[job.req_id] = time.perf_counter()

    def _save(self, job: TransferJob, mark: Any) -> None:
        super()._save(job, mark)
        self.ended[job.req_id] = time.perf_counter()


def transfer_round(
    client: KVPoolClient, cache: Cache, flat: list[torch.Tensor], copies: list[np.ndarray], repeat: int
) -> dict[str, float]:
    """GB/s of one round: connector save and load, SDK put and get, memcpy, of 32 blocks each.

    Each repeat uses fresh keys (a put of a stored key moves no bytes) and deletes them after.
    memcpy is numpy's (one thread, as the block benchmark's), between equally aligned buffers.
    """
    sources = [t.numpy() for t in flat]
    seconds: dict[str, float] = dict.fromkeys(("connector save", "connector load", "SDK put", "SDK get", "memcpy"), 0.0)
    for _ in range(repeat):
        _time_once(seconds, client, cache, flat, copies, sources)
    nbytes = repeat * PREFIX_BLOCKS * cache.layers.block_nbytes
    return {name: nbytes / spent / 1e9 for name, spent in seconds.items()}


def _time_once(
    seconds: dict[str, float],
    client: KVPoolClient,
    cache: Cache,
    flat: list[torch.Tensor],
    copies: list[np.ndarray],
    sources: list[np.ndarray],
) -> None:
    """Add one repeat of each op to ``seconds``, on fresh keys that it deletes after."""
    keys, sdk_keys = cache.keys(), cache.keys()
    seconds["connector save"] += cache.save(keys)
    seconds["connector load"] += cache.load(keys)
    seconds["SDK put"] += _timed(lambda: client.put(sdk_keys, flat).raise_for_errors(), 1)
    seconds["SDK get"] += _timed(lambda: client.get(sdk_keys, flat).raise_for_errors(), 1)
    seconds["memcpy"] += _timed(lambda: [np.copyto(d, s) for d, s in zip(copies, sources, strict=True)], 1)
    client.delete(keys + sdk_keys)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="2 rounds, fewer lookups")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "vllm")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    lookups = 20 if args.quick else 100
    repeat = 2 if args.quick else 8
    figures: list[Figure] = []
    with kvpool_daemon("2GiB", "4MiB") as daemon, tempfile.TemporaryDirectory() as work:
        clients = {t: KVPoolClient(config=ClientConfig(nodes=(daemon.address,), transport=t)) for t in TRANSPORTS}
        try:
            client = clients["tcp"]
            spaces = namespaces("bench-lookup")
            hashes = _hashes("lookup", LOOKUP_BLOCKS)
            stored = [BlockKey(spaces.of(0, 0).id, h) for h in hashes]
            client.put(stored, [bytes(64)] * LOOKUP_BLOCKS).raise_for_errors()
            lookup_round(client, spaces, hashes, lookups)  # warm-up: connections, threads
            per_round = [lookup_round(client, spaces, hashes, lookups) for _ in range(rounds)]
            figures += _lookup_figures(per_round)
            for shape in SHAPES:
                figures += _transfers(clients, shape, Path(work), rounds, repeat)
        finally:
            for each in clients.values():
                each.close()
    report(
        figures,
        f"vLLM connector benchmark ({rounds} interleaved rounds, medians; every buffer a torch "
        "tensor, 64-byte aligned)",
        args.out,
        "connector",
    )
    return 0


def _transfers(clients: dict[str, KVPoolClient], shape: KVShape, work: Path, rounds: int, repeat: int) -> list[Figure]:
    """Interleaved rounds of every (layout, transport) cell of one model shape."""
    cells = [(layout, transport) for layout in LAYOUTS for transport in TRANSPORTS]
    caches = {cell: Cache(clients[cell[1]], shape, cell[0], work) for cell in cells}
    flat = [torch.empty(shape.nbytes(BLOCK_TOKENS), dtype=torch.uint8).random_(0, 256) for _ in range(PREFIX_BLOCKS)]
    # torch allocates 64-byte aligned, as the sources are (numpy's 16-byte alignment would hit
    # glibc's slow rep-movsb path); zeroed: no page faults in the timing.
    copies = [torch.zeros(shape.nbytes(BLOCK_TOKENS), dtype=torch.uint8).numpy() for _ in flat]
    results: dict[tuple[str, str], list[dict[str, float]]] = {cell: [] for cell in cells}
    try:
        for cell in cells:  # warm-up: staging buffers, connections
            transfer_round(clients[cell[1]], caches[cell], flat, copies, 1)
        for _ in range(rounds):
            for cell in cells:
                round_figures = transfer_round(clients[cell[1]], caches[cell], flat, copies, repeat)
                round_figures["fixed"] = fixed_cost_round(clients[cell[1]], caches[cell], flat[0], 4 * repeat)
                results[cell].append(round_figures)
    finally:
        for cache in caches.values():
            cache.transfers.close()
    label = f"{shape.name} ({shape.nbytes(BLOCK_TOKENS) // 1024} KiB blocks)"
    return [
        f for (layout, transport), r in results.items() for f in _transfer_figures(f"{label}, {layout}, {transport}", r)
    ]


def fixed_cost_round(client: KVPoolClient, cache: Cache, block: torch.Tensor, repeat: int) -> float:
    """Microseconds the connector adds to a one-block load (the median of ``repeat``): its time from
    ``start_load_kv`` to the load's end less the SDK's get of the same block, in alternating order."""
    extra = []
    for i in range(repeat):
        keys = cache.keys(1)
        client.put(keys, [block]).raise_for_errors()
        sdk = connector = 0.0
        for first in (i % 2 == 0, i % 2 == 1):
            if first:
                start = time.perf_counter()
                client.get(keys, [block]).raise_for_errors()
                sdk = time.perf_counter() - start
            else:
                connector = cache.load(keys)
        extra.append(connector - sdk)
        client.delete(keys)
    return 1e6 * statistics.median(extra)


def _lookup_figures(per_round: list[tuple[float, float]]) -> list[Figure]:
    connector = tuple(c for c, _ in per_round)
    sdk = tuple(s for _, s in per_round)
    ratio = tuple(c / s for c, s in per_round)
    return [
        median_figure(f"{LOOKUP_BLOCKS}-block lookups/s, connector", connector, "/s"),
        median_figure(f"{LOOKUP_BLOCKS}-block lookups/s, SDK", sdk, "/s"),
        median_figure(f"{LOOKUP_BLOCKS}-block lookups: connector / SDK", ratio, "x"),
    ]


def _transfer_figures(label: str, rounds: list[dict[str, float]]) -> list[Figure]:
    figures = []
    for name in rounds[0]:
        values = tuple(r[name] for r in rounds)
        if name == "fixed":  # the bound: at most 100 us
            figures.append(median_figure(f"{label}: one-block load, connector - SDK get", values, "us"))
        else:
            figures.append(median_figure(f"{label}: {name}", values, "GB/s"))
    for top, bottom, target in (
        ("connector load", "SDK get", 0.9),
        ("connector save", "SDK put", 0.8),
        ("connector load", "memcpy", None),
    ):
        values = tuple(r[top] / r[bottom] for r in rounds)
        figures.append(median_figure(f"{label}: {top} / {bottom}", values, "x", target))
    return figures


if __name__ == "__main__":
    sys.exit(main())
