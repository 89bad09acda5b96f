"""What the LMCache plugin costs on top of the SDK, as ratios measured in one run.

A batch of 256-token chunks goes to the pool and back through LMCache 0.5.6's own path,
against the SDK's batched put and get of the same bytes from and into 64-byte aligned
torch buffers:

- plugin put: LMCache's ``RemoteBackend.batched_submit_put_task`` (what the engine's
  store reaches) until its completion callbacks ran: serializer, event-loop hand-off,
  instrumentation wrapper, reference counting and the plugin's one pool ``put``;
- plugin get: ``RemoteBackend.batched_get_blocking`` (what LMCache's retrieve calls for a
  remote backend): the hand-off, the plugin's allocation of LMCache memory objects and its
  one pool ``get`` into them;
- LMCache retrieve: ``StorageManager.batched_get``, which adds LMCache's own write-back of
  the chunks into its local CPU cache (the same for every remote plugin; no target).

Two model shapes in bf16 (Qwen2.5-0.5B: 3 MiB chunks; Llama-3-8B: 32 MiB chunks), tcp
and shm transports. Every chunk read is checked byte for byte (outside the timing).

Rounds interleave the cells and the systems; each figure is the median over rounds, and
each ratio the median of the per-round ratios. One local daemon.

    python bench/lmcache/plugin.py [--rounds 5] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")  # read when LMCache's loggers are made, at import

import torch  # noqa: E402

from bench.harness.comparisons import Figure, median_figure, report  # noqa: E402
from bench.harness.servers import kvpool_daemon  # noqa: E402
from bench.lmcache.engine import ModelShape, StorageEngine, chunk_bytes  # noqa: E402
from kvpool_client import BlockKey, ClientConfig, KVPoolClient  # noqa: E402

BATCH = 8  # chunks per call: a 2,048-token prompt
SHAPES = (ModelShape("Qwen/Qwen2.5-0.5B", 24, 2, 64), ModelShape("meta-llama/Meta-Llama-3-8B", 32, 8, 128))
TRANSPORTS = ("tcp", "shm")
OPS = ("plugin put", "plugin get", "LMCache retrieve", "SDK put", "SDK get")
PLUGIN = "remote_storage_plugin.kvpool."


def lmcache_config(nodes: str, transport: str, shape: ModelShape) -> dict[str, object]:
    """docs/lmcache.md's config, sized for this benchmark's batches."""
    return {
        "chunk_size": shape.chunk_size,
        "local_cpu": True,
        "remote_serde": "naive",
        "max_local_cpu_size": 4 * BATCH * shape.chunk_nbytes / 1e9,  # GB: puts, gets and LMCache's write-back
        "remote_storage_plugins": ["kvpool"],
        "extra_config": {
            PLUGIN + "module_path": "kvpool_client.integrations.lmcache.connector",
            PLUGIN + "class_name": "KVPoolConnector",
            PLUGIN + "nodes": nodes,
            PLUGIN + "transport": transport,
        },
    }


class Cell:
    """One (model shape, transport): an LMCache engine with the plugin, and the SDK beside it."""

    def __init__(self, nodes: str, shape: ModelShape, transport: str) -> None:
        self.shape = shape
        self.engine = StorageEngine(lmcache_config(nodes, transport, shape), shape)
        assert self.engine.remote is not None, "LMCache did not load the plugin"
        self.engine.prefault()
        self.client = KVPoolClient(config=ClientConfig(nodes=(nodes,), transport=transport))
        self.sources = [torch.empty(shape.chunk_nbytes, dtype=torch.uint8) for _ in range(BATCH)]
        self.targets = [torch.zeros(shape.chunk_nbytes, dtype=torch.uint8) for _ in range(BATCH)]  # no page faults
        self._serial = 0

    def hashes(self) -> list[int]:
        """Fresh chunk hashes: a put of a stored key moves no bytes."""
        self._serial += 1
        return [self._serial * 1000 + i for i in range(BATCH)]

    def round(self, repeat: int) -> dict[str, float]:
        """Seconds each op took over ``repeat`` batches."""
        spent = dict.fromkeys(OPS, 0.0)
        for _ in range(repeat):
            self._batch(spent)
        return spent

    def _batch(self, spent: dict[str, float]) -> None:
        """Add one batch of each op to ``spent``, on fresh keys that it deletes after."""
        hashes, sdk_hashes = self.hashes(), self.hashes()
        keys = [self.engine.key(h) for h in hashes]
        objs = self.engine.chunks(hashes)
        spent["plugin put"] += _timed(lambda: self.engine.put(keys, objs))
        for name, read in (("plugin get", self.engine.get_remote), ("LMCache retrieve", self.engine.get)):
            got: list[object] = []
            spent[name] += _timed(partial(_read_all, read, keys, got))
            self._check(hashes, got)
        sdk_keys = self._sdk_keys(sdk_hashes)
        for source, chunk_hash in zip(self.sources, sdk_hashes, strict=True):
            source.copy_(chunk_bytes(chunk_hash, self.shape.chunk_nbytes))
        spent["SDK put"] += _timed(lambda: self.client.put(sdk_keys, self.sources).raise_for_errors())
        spent["SDK get"] += _timed(lambda: self.client.get(sdk_keys, self.targets).raise_for_errors())
        assert all(torch.equal(s, t) for s, t in zip(self.sources, self.targets, strict=True))
        self.client.delete(self.engine.connector.keys.keys(keys) + sdk_keys)
        self.engine.drop_local()  # every batch starts from the same LMCache memory

    def close(self) -> None:
        self.engine.close()
        self.client.close()

    def _sdk_keys(self, hashes: list[int]) -> list[BlockKey]:
        namespace = f"bench-sdk-{self.shape.name.replace('/', '--')}"
        return [BlockKey(namespace, h.to_bytes(9, "big", signed=True)) for h in hashes]

    def _check(self, hashes: list[int], got: list[object]) -> None:
        try:
            for chunk_hash, obj in zip(hashes, got, strict=True):
                assert obj is not None, f"chunk {chunk_hash} missed"
                size = obj.get_size()  # type: ignore[attr-defined]
                assert torch.equal(obj.raw_tensor[:size], chunk_bytes(chunk_hash, size)), f"chunk {chunk_hash} differs"  # type: ignore[attr-defined]
        finally:
            for obj in got:
                if obj is not None:
                    obj.ref_count_down()  # type: ignore[attr-defined]


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _read_all(read: Callable[[Any], Sequence[object]], keys: object, into: list[object]) -> None:
    into.extend(read(keys))


def figures_of(label: str, shape: ModelShape, rounds: list[dict[str, float]], repeat: int) -> list[Figure]:
    """chunks/s and GB/s of each op, and plugin / SDK ratios (target 0.8)."""
    out = []
    chunks = repeat * BATCH
    for op in OPS:
        rates = tuple(chunks / r[op] for r in rounds)
        gbps = tuple(chunks * shape.chunk_nbytes / r[op] / 1e9 for r in rounds)
        out.append(median_figure(f"{label}: {op}", rates, "chunks/s"))
        out.append(median_figure(f"{label}: {op}", gbps, "GB/s"))
    for top, sdk, target in (
        ("plugin put", "SDK put", 0.8),
        ("plugin get", "SDK get", 0.8),
        ("LMCache retrieve", "SDK get", None),
    ):
        ratio = tuple(r[sdk] / r[top] for r in rounds)  # seconds: SDK time over plugin time
        out.append(median_figure(f"{label}: {top} / {sdk}", ratio, "x", target))
    return out


def run(rounds: int, repeat: int) -> list[Figure]:
    figures: list[Figure] = []
    with kvpool_daemon("3GiB", "64MiB") as daemon:
        for shape in SHAPES:
            cells = {t: Cell(daemon.address, shape, t) for t in TRANSPORTS}
            try:
                for cell in cells.values():  # warm-up: connections, arena mapping, LMCache's memory
                    cell.round(1)
                results: dict[str, list[dict[str, float]]] = {t: [] for t in TRANSPORTS}
                for _ in range(rounds):
                    for transport, cell in cells.items():
                        results[transport].append(cell.round(repeat))
            finally:
                for cell in cells.values():
                    cell.close()
            label = f"{shape.name.split('/')[-1]} ({shape.chunk_nbytes >> 20} MiB chunks), {{}}"
            for transport in TRANSPORTS:
                figures += figures_of(label.format(transport), shape, results[transport], repeat)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 batch")
    parser.add_argument("--out", type=Path, default=None, help="also write plugin.md and plugin.json there")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    repeat = 1 if args.quick else 3
    title = f"LMCache plugin benchmark ({rounds} interleaved rounds, medians; batches of {BATCH} 256-token bf16 chunks)"
    report(run(rounds, repeat), title, args.out, "plugin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
