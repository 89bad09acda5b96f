"""Worker side of the connector: load blocks into KV pages, save KV pages as blocks.

Contiguous CPU pages go to the client as they are (zero copy both ways); other pages
go through :class:`~kvpool_client.connector.staging.StagingArea`. A load reports how
many *leading* blocks arrived: a block missing in the middle (evicted since the
lookup) ends the usable prefix, and the engine prefills from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpool_client.aio import AsyncKVPoolClient
from kvpool_client.client import KVPoolClient
from kvpool_client.connector.staging import KVPages, Staged, StagingArea
from kvpool_client.core.errors import ErrorCode, UsageError
from kvpool_client.core.keys import BlockKey, Namespace
from kvpool_client.results import GetResult, PutResult


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Outcome of a load: ``loaded`` leading blocks hold the pool's bytes; the rest must be computed."""

    requested: int
    loaded: int
    nbytes: int
    statuses: tuple[ErrorCode, ...]


@dataclass(frozen=True, slots=True)
class SaveResult:
    """Outcome of a save: blocks stored now, found already stored, and failed (with their statuses)."""

    requested: int
    stored: int
    already: int
    failed: int
    nbytes: int
    statuses: tuple[ErrorCode, ...]


class _Transfers:
    """What both worker classes share: checks, staging, and turning client results into ours."""

    def __init__(self, pages: KVPages, namespace: Namespace) -> None:
        if namespace.layout != pages.layout.id or namespace.dtype != pages.layout.dtype:
            raise UsageError(f"namespace {namespace.id} does not describe the pages' layout {pages.layout.id}")
        self.pages = pages
        self.namespace_id = namespace.id
        self.staging = StagingArea(pages)

    def check(self, keys: Sequence[BlockKey], page_ids: Sequence[int]) -> None:
        if len(keys) != len(page_ids):
            raise UsageError(f"{len(keys)} keys for {len(page_ids)} pages")
        for key in keys:
            if key.namespace != self.namespace_id:
                raise UsageError(f"key {key} is not in this connector's namespace {self.namespace_id}")

    def loaded(self, staged: Staged, result: GetResult) -> LoadResult:
        count = result.prefix_hits
        self.staging.finish_load(staged, count)
        nbytes = count * self.pages.layout.block_nbytes
        return LoadResult(len(result), count, nbytes, result.statuses)

    def saved(self, result: PutResult) -> SaveResult:
        stored = result.stored
        already = sum(s in (ErrorCode.ALREADY_EXISTS, ErrorCode.BUSY) for s in result.statuses)
        failed = len(result) - stored - already
        return SaveResult(
            len(result), stored, already, failed, stored * self.pages.layout.block_nbytes, result.statuses
        )


class ConnectorWorker:
    """Worker side over a blocking :class:`KVPoolClient`.

    Args:
        client: the pool client.
        pages: the engine's KV cache, described as pages of one block each.
        namespace: the namespace every key must be in (the scheduler side's).

    Raises:
        UsageError: the namespace does not describe the pages' layout.
    """

    def __init__(self, client: KVPoolClient, pages: KVPages, namespace: Namespace) -> None:
        self._client = client
        self._t = _Transfers(pages, namespace)

    def load(self, keys: Sequence[BlockKey], page_ids: Sequence[int]) -> LoadResult:
        """Fetch ``keys`` into pages ``page_ids`` (``keys[i]`` into ``page_ids[i]``).

        Returns:
            How many leading blocks arrived; pages after those hold undefined bytes.

        Raises:
            UsageError: counts differ, a key of another namespace, a page out of range.
        """
        self._t.check(keys, page_ids)
        if not keys:
            return LoadResult(0, 0, 0, ())
        staged = self._t.staging.for_load(page_ids)
        try:
            return self._t.loaded(staged, self._client.get(keys, staged.buffers))
        finally:
            self._t.staging.release(staged)

    def save(self, keys: Sequence[BlockKey], page_ids: Sequence[int]) -> SaveResult:
        """Store pages ``page_ids`` as blocks ``keys`` (put-if-absent; failures are per key, not raised).

        Raises:
            UsageError: counts differ, a key of another namespace, a page out of range.
        """
        self._t.check(keys, page_ids)
        if not keys:
            return SaveResult(0, 0, 0, 0, 0, ())
        staged = self._t.staging.for_save(page_ids)
        try:
            return self._t.saved(self._client.put(keys, staged.buffers))
        finally:
            self._t.staging.release(staged)


class AsyncConnectorWorker:
    """Worker side over an :class:`AsyncKVPoolClient`; same contract as :class:`ConnectorWorker`.

    Do not touch the pages being transferred until the coroutine returns.
    """

    def __init__(self, client: AsyncKVPoolClient, pages: KVPages, namespace: Namespace) -> None:
        self._client = client
        self._t = _Transfers(pages, namespace)

    async def load(self, keys: Sequence[BlockKey], page_ids: Sequence[int]) -> LoadResult:
        self._t.check(keys, page_ids)
        if not keys:
            return LoadResult(0, 0, 0, ())
        staged = self._t.staging.for_load(page_ids)
        try:
            return self._t.loaded(staged, await self._client.get(keys, staged.buffers))
        finally:
            self._t.staging.release(staged)

    async def save(self, keys: Sequence[BlockKey], page_ids: Sequence[int]) -> SaveResult:
        self._t.check(keys, page_ids)
        if not keys:
            return SaveResult(0, 0, 0, 0, 0, ())
        staged = self._t.staging.for_save(page_ids)
        try:
            return self._t.saved(await self._client.put(keys, staged.buffers))
        finally:
            self._t.staging.release(staged)
