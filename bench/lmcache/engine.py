"""One LMCache engine's storage side, as LMCache 0.5.6 builds it, on CPU: for tests and the benchmark.

:class:`StorageEngine` is LMCache's real ``StorageManager`` (its event-loop thread, its
``LocalCPUBackend`` and a ``RemoteBackend`` per remote storage plugin, loaded by LMCache's
own plugin loader) for one model shape and parallel rank. It adds what an engine's
forward pass would: chunks whose bytes depend only on their hash, and keys.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.event_manager import EventManager
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.remote_backend import RemoteBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A model's KV shape and LMCache's chunking of it (bf16)."""

    name: str
    layers: int
    kv_heads: int
    head_size: int
    chunk_size: int = 256

    @property
    def chunk_nbytes(self) -> int:
        return 2 * self.layers * self.chunk_size * self.kv_heads * self.head_size * 2  # K and V, bf16


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll ``condition`` until it holds.

    Raises:
        TimeoutError: it did not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.0005)


_PATTERN_BYTES = 1 << 20


def chunk_bytes(chunk_hash: int, nbytes: int) -> torch.Tensor:
    """The bytes a chunk of ``chunk_hash`` holds: they depend on the hash alone.

    Random up to 1 MiB, then that MiB repeated: drawing 32 MiB chunks at random would take
    longer than moving them.
    """
    generator = torch.Generator().manual_seed(chunk_hash & 0x7FFF_FFFF_FFFF_FFFF)
    pattern = torch.randint(0, 256, (min(nbytes, _PATTERN_BYTES),), dtype=torch.uint8, generator=generator)
    return pattern.repeat(-(-nbytes // pattern.numel()))[:nbytes]


class StorageEngine:
    """An LMCache ``StorageManager`` built from an LMCache config dict.

    Args:
        config: the LMCache config (what a user writes in LMCache's YAML).
        shape: the model's KV shape; ``config['chunk_size']`` must match it.
        worker_id, world_size: the engine's parallel rank.
        plugin: the remote storage plugin's name in ``config``.
    """

    def __init__(
        self, config: dict[str, Any], shape: ModelShape, worker_id: int = 0, world_size: int = 1, plugin: str = "kvpool"
    ) -> None:
        self.shape = shape
        self.config = LMCacheEngineConfig.from_dict(config)
        self.metadata = LMCacheMetadata(
            model_name=shape.name,
            world_size=world_size,
            local_world_size=world_size,
            worker_id=worker_id,
            local_worker_id=worker_id,
            kv_dtype=torch.bfloat16,
            kv_shape=(shape.layers, 2, shape.chunk_size, shape.kv_heads, shape.head_size),
            use_mla=False,
            role="worker",
            chunk_size=shape.chunk_size,
        )
        self.manager = StorageManager(self.config, self.metadata, EventManager())
        self.location = f"RemoteBackend-{plugin}"

    @property
    def remote(self) -> RemoteBackend | None:
        """LMCache's backend of the plugin; None when LMCache could not load it."""
        backend = self.manager.storage_backends.get(self.location)
        return backend if isinstance(backend, RemoteBackend) else None

    @property
    def connector(self) -> Any:
        """The plugin's connector object (inside LMCache's instrumentation wrapper)."""
        assert self.remote is not None and self.remote.connection is not None, "the plugin is not loaded"
        return self.remote.connection.getWrappedConnector()

    def key(self, chunk_hash: int, model: str | None = None) -> CacheEngineKey:
        """The key LMCache's token database makes for a chunk of this engine."""
        meta = self.metadata
        return CacheEngineKey(model or meta.model_name, meta.world_size, meta.worker_id, chunk_hash, meta.kv_dtype)

    def chunks(self, hashes: Sequence[int]) -> list[MemoryObj]:
        """Memory objects holding each hash's bytes, as the engine's GPU->CPU copy leaves them."""
        made = []
        for chunk_hash in hashes:
            obj = self.manager.allocate(self.metadata.get_shapes(), self.metadata.get_dtypes())
            assert obj is not None, "LMCache's local CPU memory is full"
            obj.raw_tensor[: obj.get_size()].copy_(chunk_bytes(chunk_hash, obj.get_size()))
            made.append(obj)
        return made

    def put(self, keys: Sequence[CacheEngineKey], objs: list[MemoryObj], timeout_s: float = 30.0) -> None:
        """Store through LMCache's remote backend of the plugin and wait until every put ended.

        What ``StorageManager.batched_put(keys, objs, location=...)`` does for one remote
        backend (submit the batch, drop the engine's references), plus the completion
        callback LMCache's RemoteBackend offers, which the StorageManager does not pass on.

        Raises:
            TimeoutError: the puts did not end within ``timeout_s``.
        """
        remote = self.remote
        assert remote is not None, "the plugin is not loaded"
        left = len(keys)
        lock = threading.Lock()
        done = threading.Event()

        def one_done(key: CacheEngineKey) -> None:
            nonlocal left
            with lock:
                left -= 1
                if left == 0:
                    done.set()

        remote.batched_submit_put_task(list(keys), objs, on_complete_callback=one_done)
        for obj in objs:
            obj.ref_count_down()
        if keys and not done.wait(timeout_s):
            raise TimeoutError(f"the plugin's puts did not end in {timeout_s} s")

    def get(self, keys: Sequence[CacheEngineKey]) -> list[MemoryObj | None]:
        """LMCache's blocking retrieve from the plugin (``StorageManager.batched_get``: the
        remote backend's get, then LMCache writes the chunks back into its local CPU cache
        when all arrived); the caller releases what it returns."""
        return self.manager.batched_get(list(keys), location=self.location)

    def get_remote(self, keys: Sequence[CacheEngineKey]) -> list[MemoryObj | None]:
        """The remote backend's part of :meth:`get` alone (``RemoteBackend.batched_get_blocking``)."""
        assert self.remote is not None, "the plugin is not loaded"
        return self.remote.batched_get_blocking(list(keys))

    def prefault(self) -> None:
        """Touch every page of LMCache's CPU buffer. On a GPU machine LMCache pins it at start,
        which maps every page; on CPU it is mapped lazily, at first use by whoever writes
        first (a benchmark would time page faults as reads)."""
        self.manager.storage_backends["LocalCPUBackend"].memory_allocator.buffer.zero_()

    def contains(self, keys: Sequence[CacheEngineKey]) -> int:
        """LMCache's batched prefix lookup in the plugin."""
        hits, _ = self.manager.batched_contains(list(keys), search_range=[self.location])
        return int(hits)

    def drop_local(self) -> None:
        """Empty LMCache's local CPU cache (a retrieve writes the chunks it read back into it)."""
        self.manager.clear(locations=["LocalCPUBackend"])

    def close(self) -> None:
        self.manager.close()
