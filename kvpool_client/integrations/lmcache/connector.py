"""``KVPoolConnector``: kvpool as an LMCache 0.5.6 remote storage plugin (a ``RemoteConnector``).

LMCache loads it from its config::

    remote_storage_plugins: ["kvpool"]
    extra_config:
      remote_storage_plugin.kvpool.module_path: kvpool_client.integrations.lmcache.connector
      remote_storage_plugin.kvpool.class_name: KVPoolConnector
      remote_storage_plugin.kvpool.nodes: "10.0.0.5:7700"

and wraps it in its ``RemoteBackend``. The async methods are awaited on LMCache's storage
event loop and hand their pool call to the plugin's threads (:mod:`.transfers` says why);
``exists_sync``, ``batched_contains`` and ``remove_sync`` run on the engine's thread. All
use one blocking client. Every batched call is one pool call. Any failure is a miss
(None, False, 0), logged: never an exception into LMCache (:mod:`.guard`). How chunks
move: :mod:`.transfers`; their keys: :mod:`.keys`.
"""

from __future__ import annotations

import asyncio
import builtins  # builtins.list: LMCache's list() method takes the name inside the class
from typing import Any

from lmcache.utils import CacheEngineKey
from lmcache.v1.exceptions import IrrecoverableException
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvpool_client.client import KVPoolClient
from kvpool_client.core.errors import ErrorCode, UsageError
from kvpool_client.integrations.lmcache.chunks import ChunkAllocator, release
from kvpool_client.integrations.lmcache.guard import Guard, log
from kvpool_client.integrations.lmcache.keys import ChunkFormat, ChunkKeys
from kvpool_client.integrations.lmcache.settings import PluginSettings, read_settings
from kvpool_client.integrations.lmcache.transfers import ChunkTransfers


class PluginConfigError(UsageError, IrrecoverableException):  # type: ignore[misc]  # lmcache is untyped
    """The plugin's configuration is wrong.

    Also an ``IrrecoverableException``: LMCache's ``RemoteBackend`` then gives up on the
    plugin at once (its backend is left out, and LMCache logs the message as an error)
    instead of retrying a config that cannot get better every 10 s.
    """


class KVPoolConnector(RemoteConnector):  # type: ignore[misc]
    """An LMCache remote storage plugin that stores chunks in a kvpool cluster.

    Args:
        loop: LMCache's storage event loop (the async methods run on it).
        local_cpu_backend: LMCache's ``LocalCPUBackend``: read chunks are allocated there.
        config: LMCache's ``LMCacheEngineConfig``.

    Raises:
        PluginConfigError: bad settings; the message names the ``extra_config`` key, and
            is logged as an error here too, since LMCache only logs and goes on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any) -> None:
        settings, metadata = _settings(config, type(self), getattr(local_cpu_backend, "metadata", None))
        # LMCache's dynamic loader passes no metadata; the base class needs it (chunk shapes).
        super().__init__(config, metadata)
        self.settings = settings
        self.loop = loop
        self.keys = ChunkKeys(
            ChunkFormat.of(self.meta_fmt, metadata.chunk_size, self.meta_shapes, self.meta_dtypes),
            settings.pool.model_id,
        )
        self._guard = Guard()
        self._sync = KVPoolClient(config=settings.pool.client)
        allocator = ChunkAllocator(
            local_cpu_backend, self.meta_shapes, self.meta_dtypes, self.meta_fmt, self.single_token_size
        )
        self._transfers = ChunkTransfers(self._sync, self.keys, allocator, self._guard, settings.partial_chunks)
        log.info(
            "kvpool LMCache plugin %r: nodes %s, chunks of %d bytes in namespaces like %s",
            settings.name,
            ",".join(settings.pool.client.nodes) or "from etcd",
            self.full_chunk_size_bytes,
            self.keys.chunk_format.layout("<dtype>"),
        )

    # -- single chunks (LMCache falls back to these without the batched flags) --------

    async def exists(self, key: CacheEngineKey) -> bool:
        """Whether the pool holds ``key``'s chunk; False when it cannot be asked."""
        return await self._guard.wait("exists", self._exists_async(key), False)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        """:meth:`exists` on the caller's thread (LMCache's ``use_exists_sync``)."""
        return self._guard.call("exists_sync", lambda: self._sync.exists([self.keys.key(key)])[0], False)

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        """``key``'s chunk in a new memory object the caller owns, or None."""
        return (await self.batched_get([key]))[0]

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key`` (put-if-absent); its bytes are sent on return."""
        await self.batched_put([key], [memory_obj])

    async def list(self) -> list[str]:
        """Always empty: placement is computed from the key, so no node or client holds a
        list of the pool's chunks (LMCache only lists for its file-system loader)."""
        return []

    async def close(self) -> None:
        """Wait for the calls in flight (off the loop), then close the client."""
        await asyncio.to_thread(self._guard.call, "close", self._close, None)

    def remove_sync(self, key: CacheEngineKey) -> bool:
        """Delete ``key``'s chunk from every node holding it; False if none did or the pool is down."""
        return self._guard.call("remove", lambda: self._sync.delete([self.keys.key(key)])[0], False)

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when a node answers, else the failure's ``ErrorCode`` (LMCache's health check)."""
        return await self._guard.wait("ping", self._ping(), int(ErrorCode.UNAVAILABLE))

    # -- batches: one pool call each -------------------------------------------------

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: builtins.list[CacheEngineKey]) -> builtins.list[MemoryObj | None]:
        """One object per key (None: a miss), read by one pool ``get`` into LMCache memory."""
        return await self._guard.wait("get", self._transfers.read(keys), [None] * len(keys))

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: builtins.list[CacheEngineKey], memory_objs: builtins.list[MemoryObj]) -> None:
        """One pool ``put`` of every chunk, sent from the objects; failures are logged."""
        await self._guard.wait("put", self._transfers.write(keys, memory_objs), 0)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(
        self, lookup_id: str, keys: builtins.list[CacheEngineKey], pin: bool = False
    ) -> int:
        """How many leading chunks the pool holds: one ``lookup``. ``pin`` is not needed:
        a block being read is pinned by the node for the read."""
        return await self._guard.wait("lookup", self._lookup_async(keys), 0)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: builtins.list[CacheEngineKey]
    ) -> builtins.list[MemoryObj]:
        """The leading chunks that arrived (one ``get``); objects after a miss are released."""
        found = await self.batched_get(keys)
        hits = next((i for i, obj in enumerate(found) if obj is None), len(found))
        release(obj for obj in found[hits:] if obj is not None)
        return [obj for obj in found[:hits] if obj is not None]  # all of them: the misses start at hits

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: builtins.list[CacheEngineKey]) -> int:
        """:meth:`batched_async_contains` on the caller's thread."""
        return self._guard.call("lookup", lambda: self._sync.lookup(self.keys.keys(keys)), 0)

    def __repr__(self) -> str:
        return f"<KVPoolConnector {self.settings.name}>"

    # -- internals -------------------------------------------------------------------

    async def _exists_async(self, key: CacheEngineKey) -> bool:
        return (await self._transfers.run(self._sync.exists, [self.keys.key(key)]))[0]

    async def _lookup_async(self, keys: builtins.list[CacheEngineKey]) -> int:
        return await self._transfers.run(self._sync.lookup, self.keys.keys(keys))

    async def _ping(self) -> int:
        return await self._transfers.run(self._ping_nodes)

    def _ping_nodes(self) -> int:
        failure: ErrorCode = ErrorCode.UNAVAILABLE
        for member in self._sync.placement().router.members():
            try:
                self._sync.stats(member.address)
                return 0
            except Exception as exc:  # try the next node; the last failure is the answer
                failure = getattr(exc, "code", ErrorCode.UNAVAILABLE)
        return int(failure)

    def _close(self) -> None:
        self._transfers.close()
        self._sync.close()


def _settings(config: Any, cls: type, metadata: Any | None) -> tuple[PluginSettings, Any]:
    """The plugin's settings and LMCache's metadata (chunk shapes), which must be there; a problem
    is logged as an error and raised as PluginConfigError."""
    try:
        # Settings first: a setting that leads here without a backend (the scheduler's engine
        # under enable_scheduler_bypass_lookup) is named, rather than its symptom.
        settings = read_settings(config, cls)
        if metadata is None:
            raise UsageError("LMCache gave the plugin no local CPU backend (scheduler role?): it has no chunk shape")
        return settings, metadata
    except UsageError as exc:
        message = str(exc.args[0])
        log.error("kvpool LMCache plugin not loaded: %s", message)
        raise PluginConfigError(message) from None
