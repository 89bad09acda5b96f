"""KVPoolStore as SGLang's HiCache storage: SGLang's factory, real host pools, real daemons.

Pages written from one host pool are read into a second, fresh one, byte for byte; a dead
daemon, a foreign block of the wrong size, another model or another TP rank all read as
misses, and the target pages keep what they had.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.mem_cache.pool_host.mha import AsymmetricMHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mha_mxfp8 import MHATokenToKVPoolMXFP8Host

from bench.sglang.pools import (
    TINY_ASYMMETRIC,
    TINY_MHA,
    TINY_MLA,
    PoolShape,
    attach,
    extra_config,
    fill_random,
    host_pool,
    page_bytes,
    page_starts,
    storage_config,
)
from kvpool_client import BlockKey, KVPoolClient
from kvpool_client.core.errors import UsageError
from kvpool_client.core.keys import sglang_page_hash
from kvpool_client.integrations.sglang.store import KVPoolStore
from tests.engines.sglang.docs import flag, launch_flags
from tests.support.daemon import DaemonProcess

PAGES = 5


def page_keys(tag: int, count: int = PAGES, page_size: int = 4) -> list[str]:
    """SGLang's page keys (hex sha256 chain) of ``count`` pages of distinct tokens."""
    keys, prior = [], None
    for page in range(count):
        prior = sglang_page_hash([tag * 1000 + page * page_size + t for t in range(page_size)], prior)
        keys.append(prior.hex())
    return keys


@pytest.fixture
def backends() -> Iterator[Callable[..., tuple[KVPoolStore, Any]]]:
    """Make (backend, host pool) pairs; every backend is closed at the end."""
    made: list[KVPoolStore] = []

    def make(
        extra: dict[str, Any], shape: PoolShape = TINY_MHA, layout: str = "page_first", host: Any = None, **config: Any
    ) -> tuple[KVPoolStore, Any]:
        host = host_pool(shape, layout, pages=16) if host is None else host
        backend = attach(storage_config(shape, layout, extra, **config), host)
        assert isinstance(backend, KVPoolStore)
        made.append(backend)
        return backend, host

    yield make
    for backend in made:
        backend.close()


def stored(backend: KVPoolStore, host: Any, keys: list[str], seed: int = 1) -> list[torch.Tensor]:
    """Fill pages with random bytes, store them under ``keys``; returns their bytes."""
    indices = host.alloc(len(keys) * host.page_size)
    fill_random(host, page_starts(indices, host.page_size), seed)
    assert backend.batch_set_v1(keys, indices) == [True] * len(keys)
    return [page_bytes(host, s) for s in page_starts(indices, host.page_size)]


def test_the_documented_flags_build_the_backend_through_sglangs_factory(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]]
) -> None:
    flags = launch_flags()
    assert flag(flags, "--hicache-storage-backend") == "dynamic" and "--enable-hierarchical-cache" in flags
    documented = json.loads(flag(flags, "--hicache-storage-backend-extra-config"))
    documented["nodes"] = daemon.address
    # SGLang's own parser, as its scheduler runs it on the flag's value.
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(json.dumps(documented))
    backend, host = backends(extra, layout=flag(flags, "--hicache-mem-layout"))
    assert backend.shape is not None and backend.shape.host_layout == "page_first"
    assert backend._host().dense, "page_first pages move with no copy"
    keys = page_keys(1)
    want = stored(backend, host, keys)
    assert backend.batch_exists(keys) == PAGES
    assert want[0].numel() == TINY_MHA.page_nbytes


@pytest.mark.parametrize(
    ("shape", "layout", "dense"),
    [
        (TINY_MHA, "page_first", True),
        (TINY_MHA, "page_first_direct", True),
        (TINY_MHA, "page_head", True),
        (TINY_MHA, "layer_first", False),
        (TINY_MLA, "page_first", True),
        (TINY_MLA, "layer_first", False),
    ],
    ids=[
        "mha-page_first",
        "mha-page_first_direct",
        "mha-page_head",
        "mha-layer_first",
        "mla-page_first",
        "mla-layer_first",
    ],
)
def test_pages_round_trip_byte_exact_into_a_fresh_host_pool(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]], shape: PoolShape, layout: str, dense: bool
) -> None:
    writer, source = backends(extra_config(daemon.address), shape, layout)
    assert writer._host().dense == dense
    keys = page_keys(2)
    want = stored(writer, source, keys)

    reader, target = backends(extra_config(daemon.address), shape, layout)
    assert reader.batch_exists(keys + page_keys(3, 2)) == PAGES, "the stored prefix, then a miss"
    holed = keys[:2] + page_keys(4, 1) + keys[3:]
    assert reader.batch_exists(holed) == 2, "the count stops at a missing page in the middle"
    indices = target.alloc(PAGES * target.page_size)
    assert reader.batch_get_v1(keys, indices) == [True] * PAGES
    for page, start in enumerate(page_starts(indices, target.page_size)):
        assert torch.equal(page_bytes(target, start), want[page]), f"page {page} differs"


def test_the_legacy_flat_page_interface_shares_the_same_pages(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]]
) -> None:
    backend, host = backends(extra_config(daemon.address), TINY_MHA, "layer_first")
    keys = page_keys(5)
    want = stored(backend, host, keys)
    flats = backend.batch_get(keys, [host.get_dummy_flat_data_page() for _ in keys])
    assert all(torch.equal(f.view(torch.uint8), w) for f, w in zip(flats, want, strict=True))
    assert backend.get(page_keys(6, 1)[0]) is None, "a miss"

    other = page_keys(7, 2)
    assert backend.batch_set(other, [host.get_data_page(s) for s in page_starts(host.alloc(8), 4)])
    assert backend.exists(other[1]) and backend.batch_exists(other) == 2
    indices = host.alloc(2 * host.page_size)
    assert backend.batch_get_v1(other, indices) == [True, True]


def test_a_killed_daemon_turns_into_misses_and_leaves_the_pages_as_they_were(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]]
) -> None:
    writer, source = backends(extra_config(daemon.address, request_timeout_s=2.0, connect_timeout_s=1.0))
    keys = page_keys(8)
    stored(writer, source, keys)
    reader, target = backends(extra_config(daemon.address, request_timeout_s=2.0, connect_timeout_s=1.0))
    indices = target.alloc(PAGES * target.page_size)
    fill_random(target, page_starts(indices, target.page_size), seed=9)
    before = [page_bytes(target, s) for s in page_starts(indices, target.page_size)]
    assert reader.batch_get_v1(keys[:2], indices[: 2 * target.page_size]) == [True, True]

    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(10)
    rest = indices[2 * target.page_size :]
    assert reader.batch_get_v1(keys[2:], rest) == [False] * 3
    for page, start in enumerate(page_starts(indices, target.page_size)[2:], start=2):
        assert torch.equal(page_bytes(target, start), before[page]), f"a failed load wrote into page {page}"
    assert reader.batch_exists(keys) == 0
    assert writer.batch_set_v1(page_keys(10, 2), source.alloc(8)) == [False, False]
    assert reader.get(keys[0]) is None and not reader.set(keys[0], page_bytes(target, 0).view(torch.bfloat16))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_block_of_the_wrong_size_is_a_miss_never_a_load(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]], transport: str
) -> None:
    backend, host = backends(extra_config(daemon.address, transport=transport))
    keys = page_keys(11, 2)
    k_namespace = backend._page_keys().namespace_ids[0]
    with KVPoolClient([daemon.address]) as foreign:  # a writer of another shape under the same key
        assert foreign.put([BlockKey(k_namespace, bytes.fromhex(keys[0]))], [bytes(1024)]).stored == 1
    indices = host.alloc(2 * host.page_size)
    fill_random(host, page_starts(indices, host.page_size), seed=12)
    before = page_bytes(host, int(indices[0]))
    assert backend.batch_get_v1(keys, indices) == [False, False]
    assert torch.equal(page_bytes(host, int(indices[0])), before), "the wrong-size block wrote into the page"


def test_models_and_tp_ranks_do_not_share_mha_pages(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]]
) -> None:
    extra = extra_config(daemon.address)
    rank0, host0 = backends(extra, tp_rank=0, tp_size=2)
    keys = page_keys(13)
    stored(rank0, host0, keys)
    rank1, _ = backends(extra, tp_rank=1, tp_size=2)
    other_model, _ = backends(extra, model="test/other-model", tp_rank=0, tp_size=2)
    by_model_id, _ = backends(extra_config(daemon.address, model_id="renamed"), tp_rank=0, tp_size=2)
    assert rank0.batch_exists(keys) == PAGES
    assert (rank1.batch_exists(keys), other_model.batch_exists(keys), by_model_id.batch_exists(keys)) == (0, 0, 0)
    ids = rank0._page_keys().namespace_ids
    assert ids[0] == "test--tiny-model@bf16@sglang-mha-page_first-L2-H2-D8-P4-pp0of1-k@tp0of2", ids
    assert rank1._page_keys().namespace_ids[0].endswith("@tp1of2")
    rank0.clear()  # SGLang's cache flush: this engine's namespaces only
    assert rank0.batch_exists(keys) == 0


def test_mla_pages_are_written_by_rank_0_and_read_by_every_rank(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]]
) -> None:
    extra = extra_config(daemon.address)
    rank0, host0 = backends(extra, TINY_MLA, tp_rank=0, tp_size=2)
    rank1, host1 = backends(extra, TINY_MLA, tp_rank=1, tp_size=2)
    keys = page_keys(14)
    want = stored(rank0, host0, keys)
    indices = host1.alloc(PAGES * host1.page_size)
    assert rank1.batch_exists(keys) == PAGES and rank1.batch_get_v1(keys, indices) == [True] * PAGES
    assert all(torch.equal(page_bytes(host1, s), w) for s, w in zip(page_starts(indices, 4), want, strict=True))
    fresh = page_keys(15, 2)
    assert rank1.batch_set_v1(fresh, host1.alloc(8)) == [False, False], "rank 1 does not write MLA pages"
    assert rank0.batch_exists(fresh) == 0


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        ({"nodez": "127.0.0.1:1"}, "unknown key 'nodez' (did you mean 'nodes'?)"),
        ({}, "hicache-storage-backend-extra-config"),
        ({"nodes": "127.0.0.1:1", "transport": "pigeon"}, "transport"),
        ({"nodes": "127.0.0.1:1", "model_id": ""}, "model_id"),
    ],
)
def test_a_bad_extra_config_stops_sglang_naming_the_key(
    backends: Callable[..., tuple[KVPoolStore, Any]], monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], names: str
) -> None:
    for name in ("KVPOOL_NODES", "KVPOOL_ETCD_ENDPOINTS"):
        monkeypatch.delenv(name, raising=False)
    config = {k: v for k, v in extra_config("unused").items() if k != "nodes"} | extra
    with pytest.raises(UsageError, match=re.escape(names)) as raised:
        backends(config)
    assert "hicache-storage-backend-extra-config" in str(raised.value)


def test_a_pool_down_at_start_only_costs_hits(backends: Callable[..., tuple[KVPoolStore, Any]]) -> None:
    backend, host = backends(extra_config("127.0.0.1:9", connect_timeout_s=1.0))  # nothing listens there
    keys = page_keys(16, 2)
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, host.alloc(8)) == [False, False]
    assert backend.batch_get_v1(keys, host.alloc(8)) == [False, False]


V_HEAD_DIM = TINY_ASYMMETRIC.v_head_dim


def asymmetric_host_pool(layout: str, pages: int = 16) -> Any:
    """SGLang's host pool for a model whose K and V head sizes differ, of the class SGLang's own
    ``get_mha_host_pool_cls`` picks from a CPU device pool, as its server does from its GPU pool."""
    host = host_pool(TINY_ASYMMETRIC, layout, pages)
    assert isinstance(host, AsymmetricMHATokenToKVPoolHost)
    return host


def k_and_v(host: Any, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The page at ``start`` of an asymmetric pool, read off its layout: its K and V bytes (views)."""
    if host.layout == "page_first":  # [token, layer, head, dim]
        page = slice(start, start + host.page_size)
    else:  # page_first_direct: [page, layer, token, head, dim]
        page = slice(start // host.page_size, start // host.page_size + 1)
    return host.k_buffer[page].view(torch.uint8), host.v_buffer[page].view(torch.uint8)


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_pages_of_a_model_with_different_k_and_v_head_sizes_round_trip_byte_exact(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]], layout: str
) -> None:
    extra = extra_config(daemon.address)
    writer, source = backends(extra, layout=layout, host=asymmetric_host_pool(layout))
    assert writer._host().dense, "K and V are each one span of their own buffer: no copy"
    keys = page_keys(17)
    indices = source.alloc(PAGES * source.page_size)
    generator = torch.Generator().manual_seed(17)
    want = []
    for start in page_starts(indices, source.page_size):
        for part in k_and_v(source, start):
            part.copy_(torch.randint(0, 256, part.shape, dtype=torch.uint8, generator=generator))
        want.append([part.clone().flatten() for part in k_and_v(source, start)])
    assert writer.batch_set_v1(keys, indices) == [True] * PAGES

    k_ns, v_ns = writer._page_keys().namespace_ids
    assert k_ns == f"test--tiny-model@bf16@sglang-mha-{layout}-L2-H2-D8-V{V_HEAD_DIM}-P4-pp0of1-k@tp0of1"
    with KVPoolClient([daemon.address]) as pool:  # the pool holds each part's bytes, nothing else
        got = pool.get([BlockKey(ns, bytes.fromhex(keys[0])) for ns in (k_ns, v_ns)])
        assert [bytes(b) for b in got.buffers] == [w.numpy().tobytes() for w in want[0]]

    reader, target = backends(extra, layout=layout, host=asymmetric_host_pool(layout))
    symmetric, _ = backends(extra, layout=layout)
    assert reader.batch_exists(keys) == PAGES and symmetric.batch_exists(keys) == 0, "V's head size keys the pages"
    indices = target.alloc(PAGES * target.page_size)
    assert reader.batch_get_v1(keys, indices) == [True] * PAGES
    for page, start in enumerate(page_starts(indices, target.page_size)):
        got_k, got_v = (part.flatten() for part in k_and_v(target, start))
        assert torch.equal(got_k, want[page][0]) and torch.equal(got_v, want[page][1]), f"page {page} differs"


def test_a_model_with_different_k_and_v_head_sizes_needs_interface_v1(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]]
) -> None:
    extra = {k: v for k, v in extra_config(daemon.address).items() if k != "interface_v1"}
    with pytest.raises(UsageError, match=re.escape('"interface_v1": 1')) as raised:
        backends(extra, host=asymmetric_host_pool("page_first"))
    assert "AsymmetricMHATokenToKVPoolHost" in str(raised.value)


def test_an_mxfp8_host_pool_is_refused_at_attach_naming_kv_cache_dtype(
    daemon: DaemonProcess, backends: Callable[..., tuple[KVPoolStore, Any]]
) -> None:
    # SGLang builds this pool only beside a CUDA or HIP device (its JIT write-back kernel): an
    # instance without state, as SGLang's own tests make pools they cannot build. The refusal
    # reads nothing but the class.
    host = object.__new__(MHATokenToKVPoolMXFP8Host)
    with pytest.raises(UsageError, match=re.escape("--kv-cache-dtype mxfp8")) as raised:
        backends(extra_config(daemon.address), host=host)
    assert "MHATokenToKVPoolMXFP8Host" in str(raised.value)
