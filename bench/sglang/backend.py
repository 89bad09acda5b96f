"""What the SGLang backend costs on top of the SDK, as ratios measured in one run.

``KVPoolStore.batch_set_v1`` / ``batch_get_v1`` move pages between SGLang's real host KV pool
(``MHATokenToKVPoolHost``, ``page_first``: each page's K and V are one span each, so no copy
in Python) and one local daemon; the SDK's batched ``put``/``get`` move the same bytes in the
same blocks (two per page) out of and into 64-byte aligned torch buffers. The backend's set
includes the ``exists`` it asks first (it writes only missing pages; every key here is new).
Two model shapes (Qwen2.5-0.5B, Llama-3-8B; bf16, 64-token pages), two transports (``tcp``;
``shm``: gets copied out of the daemon's arena on the same node).

Rounds interleave the systems; each ratio is the median of its per-round ratios.
Runs in the SGLang test environment, against one local daemon:

    KVPOOL_TEST_SERVER_PYTHON=.venv/bin/python <sglang venv>/bin/python bench/sglang/backend.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.harness.comparisons import Figure, median_figure, report  # noqa: E402
from bench.harness.servers import kvpool_daemon  # noqa: E402
from bench.sglang.pools import PoolShape, attach, extra_config, fill_random, host_pool, storage_config  # noqa: E402
from kvpool_client import ClientConfig, KVPoolClient  # noqa: E402
from kvpool_client.core.keys import sglang_page_hash  # noqa: E402
from kvpool_client.integrations.sglang.store import KVPoolStore  # noqa: E402

PAGE = 64
SHAPES = (  # (shape, pages per call): about 24 and 64 MiB per call
    (PoolShape("Qwen2.5-0.5B", "mha", layers=24, heads=2, head_dim=64, page_size=PAGE), 32),
    (PoolShape("Llama-3-8B", "mha", layers=32, heads=8, head_dim=128, page_size=PAGE), 8),
)
TRANSPORTS = ("tcp", "shm")
LAYOUT = "page_first"  # SGLang's default host layout


class Cell:
    """One (shape, transport): a backend on a real host pool, an SDK client, and fresh keys."""

    def __init__(self, shape: PoolShape, pages: int, transport: str, address: str) -> None:
        self.shape, self.pages = shape, pages
        self.host = host_pool(shape, LAYOUT, pages=2 * pages)
        self.backend = attach(
            storage_config(shape, LAYOUT, extra_config(address, transport=transport), model=f"bench/{shape.name}"),
            self.host,
        )
        assert isinstance(self.backend, KVPoolStore) and self.backend._host().dense
        self.client = KVPoolClient(config=ClientConfig(nodes=(address,), transport=transport))
        self.source = self.host.alloc(pages * PAGE)
        self.target = self.host.alloc(pages * PAGE)
        fill_random(self.host, self.source[::PAGE].tolist(), seed=1)
        part = shape.page_nbytes // 2
        self.flat = [torch.empty(part, dtype=torch.uint8).random_(0, 256) for _ in range(2 * pages)]
        self.flat_in = [torch.zeros(part, dtype=torch.uint8) for _ in self.flat]
        self._serial = 0

    def keys(self) -> list[str]:
        """Page keys no run used before (a put of a stored page moves no bytes)."""
        self._serial += 1
        prior, out = None, []
        for page in range(self.pages):
            prior = sglang_page_hash([self._serial, page], prior)
            out.append(prior.hex())
        return out

    def close(self) -> None:
        self.backend.close()
        self.client.close()


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _check(results: list[bool]) -> None:
    assert all(results), f"{results.count(False)} of {len(results)} pages failed"


def transfer_round(cell: Cell, repeat: int) -> dict[str, float]:
    """Seconds of one call per system, averaged over ``repeat``: backend set and get, SDK put
    and get. Which system goes first alternates, and each deletes its blocks before the other
    runs, so both write into the same free arena."""
    seconds = dict.fromkeys(("backend set", "backend get", "SDK put", "SDK get"), 0.0)
    for index in range(repeat):
        systems = [_backend_pair, _sdk_pair]
        for run in systems if index % 2 == 0 else systems[::-1]:
            for name, spent in run(cell).items():
                seconds[name] += spent
    return {name: spent / repeat for name, spent in seconds.items()}


def _backend_pair(cell: Cell) -> dict[str, float]:
    keys = cell.keys()
    spent = {
        "backend set": _timed(lambda: _check(cell.backend.batch_set_v1(keys, cell.source))),
        "backend get": _timed(lambda: _check(cell.backend.batch_get_v1(keys, cell.target))),
    }
    cell.client.delete(cell.backend._page_keys().of(keys))
    return spent


def _sdk_pair(cell: Cell) -> dict[str, float]:
    """The same blocks (a page's K and V) under keys of the same namespaces, from torch buffers."""
    keys = cell.backend._page_keys().of(cell.keys())
    spent = {
        "SDK put": _timed(lambda: cell.client.put(keys, cell.flat).raise_for_errors()),
        "SDK get": _timed(lambda: cell.client.get(keys, cell.flat_in).raise_for_errors()),
    }
    cell.client.delete(keys)
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="calls per system per round")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sglang")
    args = parser.parse_args()
    figures: list[Figure] = []
    with kvpool_daemon("2GiB", "4MiB") as daemon:
        for shape, pages in SHAPES:
            cells = {t: Cell(shape, pages, t, daemon.address) for t in TRANSPORTS}
            try:
                for cell in cells.values():  # warm-up: connections, the arena mapping
                    transfer_round(cell, 1)
                rounds: dict[str, list[dict[str, float]]] = {t: [] for t in TRANSPORTS}
                for _ in range(args.rounds):
                    for transport, cell in cells.items():
                        rounds[transport].append(transfer_round(cell, args.repeat))
            finally:
                for cell in cells.values():
                    cell.close()
            for transport, per_round in rounds.items():
                label = f"{shape.name} ({shape.page_nbytes // 1024} KiB pages, {pages} per call), {transport}"
                figures += _figures(label, per_round, pages, shape.page_nbytes)
    report(
        figures,
        f"SGLang backend benchmark ({args.rounds} interleaved rounds, medians; host pool page_first, bf16)",
        args.out,
        "backend",
    )
    return 0


def _figures(label: str, rounds: list[dict[str, float]], pages: int, page_nbytes: int) -> list[Figure]:
    figures = []
    for name in rounds[0]:
        per_s = tuple(pages / r[name] for r in rounds)
        gbs = tuple(pages * page_nbytes / r[name] / 1e9 for r in rounds)
        figures.append(median_figure(f"{label}: {name}", gbs, "GB/s"))
        figures.append(median_figure(f"{label}: {name} pages/s", per_s, "/s"))
    for top, bottom in (("backend get", "SDK get"), ("backend set", "SDK put")):
        ratio = tuple(r[bottom] / r[top] for r in rounds)
        figures.append(median_figure(f"{label}: {top} / {bottom}", ratio, "x", 0.8))
    return figures


if __name__ == "__main__":
    sys.exit(main())
