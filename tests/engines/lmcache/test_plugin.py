"""kvpool as LMCache's remote storage plugin, inside LMCache's real StorageManager, against real daemons.

Each engine is LMCache's own StorageManager (event-loop thread, LocalCPUBackend, and a
RemoteBackend that LMCache's plugin loader built from docs/lmcache.md's config). Two
engines share nothing but the pool.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from collections.abc import Callable
from typing import Any

import pytest
import torch

from bench.lmcache.engine import StorageEngine, chunk_bytes, wait_for
from kvpool_client import BlockKey, KVPoolClient
from kvpool_client.integrations.lmcache.connector import KVPoolConnector
from tests.engines.lmcache.conftest import CHUNK, EngineFactory
from tests.engines.lmcache.doc import plugin_config
from tests.support.daemon import DaemonProcess
from tests.support.stopping import pause

# Chunk hashes as LMCache makes them: Python's signed hash() and sha256 folded to uint64.
HASHES = [0x1234, -5, 2**64 - 1, 2**63, -(2**63), 77]


def stored(engine: StorageEngine, hashes: list[int]) -> list[Any]:
    """Store chunks of ``hashes`` from ``engine`` through LMCache's put path; their keys."""
    keys = [engine.key(h) for h in hashes]
    engine.put(keys, engine.chunks(hashes))
    return keys


def exact(obj: Any, chunk_hash: int) -> bool:
    """Whether ``obj`` holds exactly the bytes of ``chunk_hash``'s chunk."""
    nbytes = obj.get_size()
    return bool(torch.equal(obj.raw_tensor[:nbytes], chunk_bytes(chunk_hash, nbytes)))


def released(objs: list[Any]) -> None:
    for obj in objs:
        if obj is not None:
            obj.ref_count_down()


def allocations(engine: StorageEngine) -> int:
    """Memory objects alive in the engine's LMCache CPU memory."""
    return engine.manager.storage_backends["LocalCPUBackend"].memory_allocator.pin_allocator.num_active_allocations


def leaked(caplog: pytest.LogCaptureFixture) -> list[str]:
    """LMCache's warnings about memory objects its garbage collector had to free (a reference never dropped)."""
    return [r.getMessage() for r in caplog.records if "being garbage collected" in r.getMessage()]


def on_loop(engine: StorageEngine, coroutine: Any) -> Any:
    """Run a RemoteBackend coroutine where LMCache runs them: on its storage event loop."""
    return asyncio.run_coroutine_threadsafe(coroutine, engine.manager.loop).result(30)


def test_a_second_engine_finds_and_reads_the_chunks_byte_exact(daemon: DaemonProcess, engines: EngineFactory) -> None:
    a = engines(nodes=daemon.address)
    assert isinstance(a.connector, KVPoolConnector), "LMCache loaded the plugin from the doc's config"
    keys = stored(a, HASHES)
    b = engines(nodes=daemon.address)
    remote = b.remote
    assert remote is not None
    assert b.contains(keys) == len(keys), "batched contains (one pool lookup on the engine's thread)"
    assert b.manager.contains(keys[2], search_range=[b.location]) == b.location
    assert on_loop(b, remote.batched_async_contains("lookup-1", keys)) == len(keys)
    gap = [keys[0], b.key(999), *keys[1:]]
    assert b.contains(gap) == 1 and on_loop(b, remote.batched_async_contains("lookup-2", gap)) == 1

    got = b.get(keys)
    try:
        for chunk_hash, obj in zip(HASHES, got, strict=True):
            assert obj is not None and exact(obj, chunk_hash), f"chunk {chunk_hash:#x} differs from what A stored"
            assert obj.get_shapes() == b.metadata.get_shapes()
    finally:
        released(got)
    prefix = on_loop(b, remote.batched_get_non_blocking("lookup-3", gap))
    try:
        assert len(prefix) == 1 and exact(prefix[0], HASHES[0]), "the leading chunks up to the miss"
    finally:
        released(prefix)


def test_the_pool_holds_each_chunk_under_the_documented_key(daemon: DaemonProcess, engines: EngineFactory) -> None:
    a = engines(nodes=daemon.address)
    stored(a, HASHES)
    namespace = f"Qwen--Qwen2.5-0.5B@bf16@lmcache-KV_2LTD-T{CHUNK}-2x2x{CHUNK}x16@tp0of1"
    with KVPoolClient([daemon.address]) as pool:  # another process's view: the doc's encoding
        keys = [BlockKey(namespace, h.to_bytes(9, "big", signed=True)) for h in HASHES]
        assert pool.exists(keys) == [True] * len(HASHES)
        got = pool.get(keys[:1])
        assert bytes(got.buffers[0]) == chunk_bytes(HASHES[0], a.shape.chunk_nbytes).numpy().tobytes()


def test_a_daemon_killed_mid_way_turns_into_misses_never_wrong_bytes(
    daemon_factory: Callable[..., DaemonProcess], engines: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    daemons = [daemon_factory("--dram-capacity", "64MiB", "--slab-size", "1MiB") for _ in range(2)]
    nodes = ",".join(d.address for d in daemons)
    hashes = list(range(100, 140))
    keys = stored(engines(nodes=nodes, request_timeout_s=2), hashes)
    b = engines(nodes=nodes, request_timeout_s=2)
    assert b.contains(keys) == len(keys)
    assert on_loop(b, b.connector.ping()) == 0
    daemons[0].process.send_signal(signal.SIGKILL)  # after the lookup, before the retrieve
    daemons[0].process.wait(10)

    before = allocations(b)
    got = b.get(keys)
    survivors = [h for h, obj in zip(hashes, got, strict=True) if obj is not None]
    try:
        assert 0 < len(survivors) < len(hashes), "the killed node's chunks miss, the other node's arrive"
        assert all(exact(obj, h) for h, obj in zip(hashes, got, strict=True) if obj is not None)
    finally:
        released(got)
    assert allocations(b) == before, "the objects of the misses went back to LMCache"

    daemons[1].process.send_signal(signal.SIGKILL)
    daemons[1].process.wait(10)
    assert b.get(keys) == [None] * len(keys)
    assert allocations(b) == before
    assert b.contains(keys) == 0
    assert b.manager.contains(keys[0], search_range=[b.location]) is None
    assert on_loop(b, b.remote.batched_async_contains("lookup", keys)) == 0
    assert b.connector.exists_sync(keys[0]) is False and b.connector.remove_sync(keys[0]) is False
    assert on_loop(b, b.connector.ping()) != 0
    b.put([b.key(7)], b.chunks([7]))  # LMCache's put path ends, nothing raised into its loop
    assert b.remote is not None and not b.remote.put_tasks
    assert not leaked(caplog)


def test_a_get_lmcache_gives_up_on_releases_its_memory(
    daemon: DaemonProcess, engines: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # tcp: over shm a get would copy a stopped daemon's blocks out of its arena, with no answer to wait for
    config = plugin_config(CHUNK, nodes=daemon.address, request_timeout_s=4, transport="tcp")
    config["blocking_timeout_secs"] = 1  # LMCache cancels the plugin's get after this
    b = engines(config=config)
    keys = stored(b, HASHES)
    before = allocations(b)
    pause(daemon.process)  # the node hangs: no answer, no error
    try:
        assert b.get(keys) == [None] * len(keys)
        assert allocations(b) > before, "the read still in flight keeps its objects: nothing reuses them under it"
        wait_for(lambda: allocations(b) == before, "the cancelled get's memory objects to go back", 20)
        assert not leaked(caplog), "released by the plugin, not by LMCache's garbage-collection safety net"
    finally:
        daemon.process.send_signal(signal.SIGCONT)


def test_models_and_workers_do_not_see_each_others_chunks(daemon: DaemonProcess, engines: EngineFactory) -> None:
    a = engines(model="org/model-a", worker_id=0, world_size=2, nodes=daemon.address)
    keys = stored(a, HASHES)
    same = engines(model="org/model-a", worker_id=0, world_size=2, nodes=daemon.address)
    assert same.contains(keys) == len(keys), "the same model and worker finds them"
    for other in (
        engines(model="org/model-b", worker_id=0, world_size=2, nodes=daemon.address),
        engines(model="org/model-a", worker_id=1, world_size=2, nodes=daemon.address),
    ):
        theirs = [other.key(h) for h in HASHES]
        assert other.contains(theirs) == 0
        assert other.get(theirs) == [None] * len(HASHES)
    renamed = engines(model="/models/model-a", worker_id=0, world_size=2, nodes=daemon.address, model_id="org/model-a")
    assert renamed.contains([renamed.key(h) for h in HASHES]) == len(HASHES), "model_id names the model in the pool"


def test_a_block_of_the_wrong_size_is_a_miss(
    daemon: DaemonProcess, engines: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    b = engines(nodes=daemon.address)
    key = b.key(4242)
    with KVPoolClient([daemon.address]) as pool:  # a foreign writer: 1 KiB under a 2 KiB chunk's key
        assert pool.put([b.connector.keys.key(key)], [bytes(1024)]).stored == 1
    before = allocations(b)
    assert b.contains([key]) == 1, "the pool holds a block under the key ..."
    assert b.get([key]) == [None], "... but it is not a chunk: a miss"
    assert allocations(b) == before and not leaked(caplog)


def test_partial_last_chunks_round_trip_where_lmcache_saves_them(daemon: DaemonProcess, engines: EngineFactory) -> None:
    config = plugin_config(CHUNK, nodes=daemon.address)
    config["save_unfull_chunk"] = True
    a = engines(config=config)
    shape = a.metadata.get_shapes(num_tokens=10)
    obj = a.manager.allocate(shape, a.metadata.get_dtypes())
    obj.raw_tensor[: obj.get_size()].copy_(chunk_bytes(55, obj.get_size()))
    a.put([a.key(55)], [obj])
    got = engines(config=config).get([a.key(55)])
    try:
        assert got[0] is not None and got[0].get_shapes() == shape and exact(got[0], 55)
    finally:
        released(got)
    assert engines(nodes=daemon.address).get([a.key(55)]) == [None], "without save_unfull_chunk: a miss"


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"nodes": None, "nodez": "127.0.0.1:1"}, "unknown key 'nodez' (did you mean 'nodes'?)"),
        ({"nodes": None}, "extra_config remote_storage_plugin.kvpool.*"),
        ({"transport": "carrier-pigeon"}, "transport"),
        ({"lookup_threads": 2}, "remote_storage_plugin.kvpool.lookup_threads"),
        ({"nodes": None, "etcd_endpoints": "127.0.0.1:2379"}, "remote_storage_plugin.kvpool.nodes"),
    ],
    ids=["misspelt", "no-pool", "bad-value", "not-here", "etcd"],
)
def test_a_bad_plugin_config_is_reported_naming_the_key(
    engines: EngineFactory, caplog: pytest.LogCaptureFixture, settings: dict[str, Any], names: str
) -> None:
    caplog.set_level(logging.ERROR, "kvpool_client.integrations.lmcache")
    engine = engines(**settings)
    assert engine.remote is None, "LMCache leaves the plugin's backend out"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(names in m for m in errors), f"no error naming {names!r}: {errors}"
    lmcache_line = re.compile(r"Failed to create remote backend for plugin kvpool: .*" + re.escape(names))
    assert any(lmcache_line.search(m) for m in errors), f"LMCache's own error names the key too: {errors}"


@pytest.mark.parametrize(
    ("lmcache", "names", "fix"),
    [
        ({"remote_serde": "cachegen"}, "remote_serde 'cachegen'", "remote_serde: naive"),
        ({"remote_serde": "kivi"}, "remote_serde 'kivi'", "remote_serde: naive"),
        ({"enable_scheduler_bypass_lookup": True}, "enable_scheduler_bypass_lookup", "bypass_lookup: false"),
        ({"use_layerwise": True}, "use_layerwise", "use_layerwise: false"),
    ],
    ids=["cachegen-serde", "kivi-serde", "scheduler-bypass-lookup", "layerwise"],
)
def test_an_lmcache_setting_the_plugin_cannot_serve_is_refused_naming_it(
    engines: EngineFactory, caplog: pytest.LogCaptureFixture, lmcache: dict[str, Any], names: str, fix: str
) -> None:
    caplog.set_level(logging.ERROR, "kvpool_client.integrations.lmcache")
    config = plugin_config(CHUNK) | lmcache  # LMCache's own settings, beside the doc's
    # A model LMCache's CacheGen has settings for: with any other, LMCache itself refuses cachegen.
    engine = engines(model="meta-llama/Llama-3.1-8B-Instruct", config=config)
    assert engine.remote is None, "LMCache leaves the plugin's backend out"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(names in m and fix in m for m in errors), f"no error naming {names!r} and {fix!r}: {errors}"
    lmcache_line = re.compile(r"Failed to create remote backend for plugin kvpool: .*" + re.escape(names))
    assert any(lmcache_line.search(m) for m in errors), f"LMCache's own error names the setting too: {errors}"
