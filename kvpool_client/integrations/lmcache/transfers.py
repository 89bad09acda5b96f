"""Chunks between the pool and LMCache memory objects: one pool call per batch, no copy.

A read allocates the batch's memory objects, then one ``get`` receives every chunk
straight into them; a write is one ``put`` sent straight from them. The memory the objects
lie in (LMCache's allocator hands out views of a few large buffers) is registered with the
one-sided data plane the first time an object of it is seen, so that over ``nixl`` too the
chunks move straight in and out.

The calls come from LMCache's storage event loop and run on the plugin's own threads with
the blocking client, as Mooncake's connector does: the loop never waits on a socket or a
shared-memory copy, and no ``grpc.aio`` channel is tied to LMCache's loop (grpc.aio
misbehaves with several event loops in one process, and the client's control calls are
gRPC). A call holds its own reference to the memory objects until its thread is done, so
a call that LMCache cancels (``blocking_timeout_secs``) never writes into, or sends from,
memory LMCache already reused.

Only a chunk whose bytes arrived whole and at a full chunk's length is handed to LMCache.
A block stored under a chunk's key at another length is a miss (the client drains it
without touching the object), except a partial last chunk where LMCache saves those
(``save_unfull_chunk``): its length is unknown before the read, so it takes a second
call for those keys and one copy into an object of its length.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from kvpool_client.client import KVPoolClient
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.keys import BlockKey
from kvpool_client.integrations.lmcache.chunks import ChunkAllocator, payload, release
from kvpool_client.integrations.lmcache.guard import Guard
from kvpool_client.integrations.lmcache.keys import ChunkKeys
from kvpool_client.results import PUT_SUCCESS

T = TypeVar("T")


class ChunkTransfers:
    """Reads and writes batches of LMCache chunks.

    Args:
        client: the blocking pool client.
        keys: the engine's key mapping.
        allocator: allocates LMCache memory objects for reads.
        guard: where failures that are not exceptions (per-key statuses) are reported.
        partial_chunks: read blocks shorter than a chunk as partial chunks.
        threads: calls that may run at once (LMCache overlaps puts, gets and lookups).
    """

    def __init__(
        self,
        client: KVPoolClient,
        keys: ChunkKeys,
        allocator: ChunkAllocator,
        guard: Guard,
        partial_chunks: bool,
        threads: int = 4,
    ) -> None:
        self._client = client
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="kvpool-lmcache")
        self._keys = keys
        self._allocator = allocator
        self._guard = guard
        self._partial = partial_chunks
        self._registered: set[int] = set()  # the storages registered with the client, by address

    async def read(self, keys: Sequence[Any]) -> list[Any | None]:
        """The memory objects of ``keys``' chunks, None for each miss.

        The caller owns each object returned (one reference). Objects that did not fill
        are released before this returns, also when it raises or is cancelled.

        Raises:
            UsageError, ValueError: a key cannot be mapped to a pool key.
            KVPoolError: the client failed as a whole (per-key failures are misses).
        """
        pool_keys = self._keys.keys(keys)
        found: list[Any | None] = [None] * len(keys)
        objs = self._allocator.full(len(keys))  # fewer when LMCache's memory is full
        if not objs:
            return found
        try:
            result = await self.run(self._client.get, pool_keys[: len(objs)], self._payloads(objs), holding=objs)
        except BaseException:
            release(objs)
            raise
        short = []
        for i, (obj, status) in enumerate(zip(objs, result.statuses, strict=True)):
            if status is ErrorCode.OK:
                found[i] = obj
                continue
            obj.ref_count_down()
            if status is ErrorCode.SIZE_MISMATCH:
                short.append(i)
        if short:
            try:
                await self._read_short(pool_keys, short, found)
            except BaseException:  # the hits too: the caller never sees them
                release(obj for obj in found if obj is not None)
                raise
        return found

    async def write(self, keys: Sequence[Any], memory_objs: Sequence[Any]) -> int:
        """Store the chunks (put-if-absent); returns how many the pool holds now.

        Every byte is sent before this returns: LMCache drops its reference to the
        objects right after.

        Raises:
            UsageError, ValueError: a key cannot be mapped, or an object has no host tensor.
            KVPoolError: the client failed as a whole.
        """
        pool_keys = self._keys.keys(keys)
        result = await self.run(self._client.put, pool_keys, self._payloads(memory_objs), holding=memory_objs)
        failed = [s for s in result.statuses if s not in PUT_SUCCESS]
        if failed:
            self._guard.failed("put", f"{len(failed)} of {len(keys)} chunks not stored ({failed[0].name})")
        return len(keys) - len(failed)

    def _payloads(self, memory_objs: Sequence[Any]) -> list[torch.Tensor]:
        """Each object's bytes (:func:`payload`), the storage they lie in registered once."""
        views = [payload(o) for o in memory_objs]
        for view in views:
            storage = view.untyped_storage()
            if storage.data_ptr() not in self._registered:
                self._registered.add(storage.data_ptr())
                self._client.register(torch.empty(0, dtype=torch.uint8).set_(storage))
        return views

    async def run(self, call: Callable[..., T], *args: Any, holding: Sequence[Any] = ()) -> T:
        """``call(*args)`` on a transfer thread, awaited from the loop.

        ``holding``: memory objects the call reads or writes; each keeps one more reference
        until the thread is done, even when the caller is cancelled before.
        """
        for obj in holding:
            obj.ref_count_up()
        job = self._threads.submit(call, *args)
        if holding:
            job.add_done_callback(lambda _: release(holding))
        return await asyncio.wrap_future(job)

    def close(self) -> None:
        """Wait for the calls in flight, then stop the threads."""
        self._threads.shutdown(wait=True)

    async def _read_short(self, pool_keys: list[BlockKey], indices: list[int], found: list[Any | None]) -> None:
        """Blocks of another length than a full chunk: partial chunks where LMCache saves
        those, else misses."""
        if not self._partial:
            self._guard.failed("get", f"{len(indices)} blocks of another size than a chunk (misses)")
            return
        result = await self.run(self._client.get, [pool_keys[i] for i in indices])
        for i, status, data in zip(indices, result.statuses, result.buffers, strict=True):
            if status is not ErrorCode.OK or data is None:
                continue
            obj = self._allocator.partial(len(data))
            if obj is None:
                self._guard.failed("get", f"a block of {len(data)} bytes is no partial chunk (a miss)")
                continue
            # The one copy of this path: the length was unknown until the block arrived.
            payload(obj).copy_(torch.frombuffer(data, dtype=torch.uint8))
            found[i] = obj
