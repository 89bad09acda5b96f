"""``KVPoolStore``: kvpool as SGLang's HiCache L3 storage backend (``HiCacheStorage``).

SGLang 0.5.23 loads it with ``--hicache-storage-backend dynamic`` and an extra config naming
this module and class (docs/sglang.md). The factory calls ``KVPoolStore(storage_config,
kwargs)``, then ``register_mem_pool_host(host_pool)`` and ``on_host_pools_registered()`` on
the scheduler thread; every later call comes from the controller's storage threads
(backup, prefetch, prefetch I/O), concurrently.

Contracts SGLang relies on, and what this class does for them:

- ``batch_exists`` returns how many leading pages the pool holds: one batched ``lookup``.
- ``batch_set_v1`` / ``batch_get_v1`` (with ``"interface_v1": 1``) move pages straight
  between the host pool's memory and the pool (:mod:`.pages`) and return one bool per page.
  A set writes only the parts the pool lacks (one ``exists``, then one put-if-absent).
- The legacy ``get``/``set``/``batch_get``/``batch_set`` move SGLang's flat pages, with the
  same bytes under the same keys, so both interfaces share one pool.
- A pool failure is a miss or a False, logged, never raised into SGLang's threads; a page
  that did not arrive whole (node down, evicted, a block of another size) is False, and
  SGLang does not use it.
- Only settings and shapes raise (:class:`~kvpool_client.core.errors.UsageError`), at start:
  :mod:`.pools` says which of SGLang's host pools are stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo

from kvpool_client.buffers import byte_view
from kvpool_client.client import KVPoolClient
from kvpool_client.core.errors import ErrorCode, UsageError
from kvpool_client.core.keys import BlockKey
from kvpool_client.integrations.settings import PoolSettings
from kvpool_client.integrations.sglang.pages import HostPages
from kvpool_client.integrations.sglang.pools import host_pages, is_asymmetric, page_shape
from kvpool_client.integrations.sglang.shape import PageKeys, PageShape
from kvpool_client.results import PUT_SUCCESS

log = logging.getLogger("kvpool.sglang")

SOURCE = "hicache-storage-backend-extra-config"
# Keys of the extra config that SGLang itself reads (its factory and controller).
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")

Blocks = Callable[[list[int]], list[Any]]
"""Buffers for every part of the given pages, page after page."""


class KVPoolStore(HiCacheStorage):  # type: ignore[misc]
    """SGLang HiCache storage in a kvpool cluster.

    Args:
        storage_config: what SGLang's controller built: ranks, MLA or not, model name, and
            ``extra_config`` (the pool settings: ``nodes`` or ``etcd_endpoints``, ...).
        kwargs: the factory's extra arguments (SGLang passes none).

    Raises:
        UsageError: bad pool settings, no model name, or a parallel layout this backend
            does not store (decode context parallelism, heterogeneous TP head splits);
            the message names the setting.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None) -> None:
        extra = dict(storage_config.extra_config or {})
        settings = PoolSettings.parse(extra, SOURCE, ignore=SGLANG_KEYS)
        _check_parallel(storage_config)
        model = settings.model_id or storage_config.model_name
        if not model:
            raise UsageError(f"{SOURCE}: SGLang passed no model name; set model_id")
        self._zero_copy = bool(extra.get("interface_v1"))
        if not self._zero_copy:
            log.info('kvpool: without "interface_v1": 1 SGLang copies every page through the legacy interface')
        self._config = storage_config
        self._model = str(model)
        self._writer = bool(storage_config.is_storage_writer)  # MLA: one rank writes for all
        self._client = KVPoolClient(config=settings.client)
        self._pages: HostPages | None = None
        self._keys: PageKeys | None = None
        self.shape: PageShape | None = None

    # -- registration (scheduler thread) ------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Take the host KV pool whose pages this backend moves, and derive the namespaces.

        Raises:
            UsageError: the host pool is not an MHA or MLA pool of a layout with evenly
                spaced pages in CPU memory (an MXFP8 pool names ``--kv-cache-dtype``), or
                its pages have no flat form and ``interface_v1`` is off (:mod:`.pools`).
        """
        self.shape = page_shape(self._config, mem_pool_host, self._model)
        if is_asymmetric(mem_pool_host) and not self._zero_copy:
            raise UsageError(
                f'{SOURCE}: set "interface_v1": 1 for this model: its K and V head sizes differ '
                f"({self.shape.head_dim} and {self.shape.v_head_dim}), and SGLang's "
                f"{type(mem_pool_host).__name__} has no flat pages for the legacy interface"
            )
        super().register_mem_pool_host(mem_pool_host)
        self._keys = PageKeys(self.shape.namespaces())
        self._pages = host_pages(mem_pool_host, self.shape)
        for buffer in self._pages.buffers:  # pages move straight in and out of the pool over nixl
            if buffer.is_contiguous():
                self._client.register(buffer)
        log.info(
            "kvpool: SGLang pages in %s (%s)",
            ", ".join(self._keys.namespace_ids),
            "zero copy, a part one span" if self._pages.dense else "zero copy, a part one span per layer",
        )

    def on_host_pools_registered(self) -> None:
        """Refuse hybrid models: their sidecar pools (Mamba, SWA, indexer...) need the v2 calls.

        Raises:
            UsageError: a pool other than the KV pool was registered.
        """
        others = [str(n) for n in getattr(self, "registered_pools", {}) if str(getattr(n, "value", n)) != "kv"]
        if others:
            raise UsageError(
                f"kvpool stores the KV pool only; this model also has {others} (hybrid models need "
                "HiCache's v2 storage calls, which kvpool does not implement)"
            )

    # -- zero-copy interface (storage threads) ------------------------------

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """How many leading pages of ``keys`` the pool holds (0 when it cannot be reached)."""
        if not keys:
            return 0
        try:
            page_keys = self._page_keys()
            return self._client.lookup(page_keys.of(keys, _depth(extra_info))) // page_keys.parts
        except Exception as exc:  # a pool failure costs hits, never the engine
            log.warning("kvpool: lookup of %d pages failed: %s", len(keys), exc)
            return 0

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        """Store the pages at ``host_indices`` (``len(keys) * page_size`` token slots) under
        ``keys``; True where the pool holds the page afterwards."""
        try:
            pages = self._host()
            starts = pages.page_starts(host_indices, len(keys))
            valid = [s is not None for s in starts]
            return self._write(keys, valid, lambda idx: pages.blocks(_valid_starts(starts, idx)), extra_info)
        except Exception as exc:
            log.warning("kvpool: store of %d pages failed: %s", len(keys), exc)
            return [False] * len(keys)

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        """Load ``keys``' pages into the host pool at ``host_indices``; True where a page
        arrived whole. A False page may hold part of its bytes: SGLang does not use it."""
        try:
            pages = self._host()
            starts = pages.page_starts(host_indices, len(keys))
            valid = [s is not None for s in starts]
            return self._read(keys, valid, lambda idx: pages.blocks(_valid_starts(starts, idx)))
        except Exception as exc:
            log.warning("kvpool: load of %d pages failed: %s", len(keys), exc)
            return [False] * len(keys)

    # -- legacy interface: SGLang's flat pages ------------------------------

    def get(self, key: str, target_location: Any | None = None, target_sizes: Any | None = None) -> torch.Tensor | None:
        """Load one page into ``target_location`` (a flat page; a new one if None); None on a miss."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(
        self, keys: list[str], target_locations: Any | None = None, target_sizes: Any | None = None
    ) -> list[torch.Tensor | None]:
        """Load flat pages into ``target_locations``; each entry is its target, or None on a miss."""
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        try:
            self._host()
            targets = [self.mem_pool_host.get_dummy_flat_data_page() if t is None else t for t in targets]
            views = [self._flat_parts(t) for t in targets]
            arrived = self._read(
                keys, [v is not None for v in views], lambda idx: [p for i in idx for p in views[i] or ()]
            )
        except Exception as exc:
            log.warning("kvpool: load of %d flat pages failed: %s", len(keys), exc)
            return [None] * len(keys)
        return [t if ok else None for t, ok in zip(targets, arrived, strict=True)]

    def set(
        self, key: str, value: Any | None = None, target_location: Any | None = None, target_sizes: Any | None = None
    ) -> bool:
        """Store one flat page under ``key``; True when the pool holds it afterwards."""
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Store flat pages; True when the pool holds every one afterwards."""
        try:
            self._host()
            views = [self._flat_parts(v) for v in (values if values is not None else [None] * len(keys))]
            stored = self._write(
                keys, [v is not None for v in views], lambda idx: [p for i in idx for p in views[i] or ()], None
            )
            return all(stored)
        except Exception as exc:
            log.warning("kvpool: store of %d flat pages failed: %s", len(keys), exc)
            return False

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- housekeeping -------------------------------------------------------

    def clear(self) -> None:
        """Delete this engine's pages from the pool (SGLang's cache flush). MLA pages are
        shared by the TP ranks: only the writing rank deletes them."""
        if self._keys is None or not self._writer:
            return
        for namespace in self._keys.namespace_ids:
            try:
                self._client.flush_namespace(namespace)
            except Exception as exc:
                log.warning("kvpool: flush of %s failed: %s", namespace, exc)

    def get_stats(self) -> None:
        """No storage metrics: the daemons count hits and misses (``kvpoolctl top``)."""
        return None

    def close(self) -> None:
        self._client.close()

    # -- internals ----------------------------------------------------------

    def _host(self) -> HostPages:
        if self._pages is None:
            raise UsageError("KVPoolStore: register_mem_pool_host was not called")
        return self._pages

    def _page_keys(self) -> PageKeys:
        if self._keys is None:
            raise UsageError("KVPoolStore: register_mem_pool_host was not called")
        return self._keys

    def _flat_parts(self, flat: Any) -> list[memoryview] | None:
        """A flat page's bytes split into its parts; None if it is not one page of bytes."""
        if flat is None:
            return None
        view = byte_view(flat, writable=True)
        sizes = self._host().part_nbytes
        if view.nbytes != sum(sizes):
            return None
        out, at = [], 0
        for size in sizes:
            out.append(view[at : at + size])
            at += size
        return out

    def _write(
        self, keys: list[str], valid: list[bool], blocks: Blocks, extra_info: HiCacheStorageExtraInfo | None
    ) -> list[bool]:
        """Put the parts of the valid pages that the pool lacks; True per page it holds after."""
        parts = self._page_keys().parts
        pool_keys = self._page_keys().of(keys, _depth(extra_info))
        held = self._client.exists(pool_keys)
        missing = [i for i, ok in enumerate(valid) if ok and not all(held[i * parts : (i + 1) * parts])]
        if missing and self._writer:  # MLA's other ranks only report what the writer stored
            result = self._client.put(_select(pool_keys, missing, parts), blocks(missing))
            for n, status in enumerate(result.statuses):
                held[missing[n // parts] * parts + n % parts] = status in PUT_SUCCESS
            _log_failed("store", result.statuses, PUT_SUCCESS)
        return [ok and all(held[i * parts : (i + 1) * parts]) for i, ok in enumerate(valid)]

    def _read(self, keys: list[str], valid: list[bool], blocks: Blocks) -> list[bool]:
        """Get the valid pages into their buffers; True per page whose every part arrived."""
        parts = self._page_keys().parts
        wanted = [i for i, ok in enumerate(valid) if ok]
        arrived = [False] * len(keys)
        if not wanted:
            return arrived
        result = self._client.get(_select(self._page_keys().of(keys), wanted, parts), blocks(wanted))
        for n, index in enumerate(wanted):
            arrived[index] = all(s is ErrorCode.OK for s in result.statuses[n * parts : (n + 1) * parts])
        _log_failed("load", result.statuses, (ErrorCode.OK,))
        return arrived


def _select(pool_keys: Sequence[BlockKey], pages: Sequence[int], parts: int) -> list[BlockKey]:
    return [pool_keys[i * parts + j] for i in pages for j in range(parts)]


def _depth(extra_info: HiCacheStorageExtraInfo | None) -> int | None:
    """The first key's position in its chain, when SGLang passes the keys before it."""
    prefix = getattr(extra_info, "prefix_keys", None)
    return len(prefix) if prefix is not None else None


def _valid_starts(starts: Sequence[int | None], idx: list[int]) -> list[int]:
    """The starts of pages ``idx``, which the caller picked among the valid pages: none is None."""
    return cast("list[int]", [starts[i] for i in idx])


def _log_failed(what: str, statuses: Sequence[ErrorCode], good: Collection[ErrorCode]) -> None:
    failed = [s for s in statuses if s not in good and s is not ErrorCode.NOT_FOUND]
    if failed:
        log.info("kvpool %s: %d of %d blocks failed (%s)", what, len(failed), len(statuses), failed[0].name)


def _check_parallel(config: HiCacheStorageConfig) -> None:
    """Raises UsageError: a parallel layout whose pages this backend cannot key or address."""
    if getattr(config, "dcp_size", 1) > 1:
        raise UsageError("kvpool does not store decode-context-parallel (dcp_size > 1) MLA pages yet")
    if getattr(config, "should_split_heads", False):
        raise UsageError(f"{SOURCE}: tp_lcm_size (heterogeneous TP head splits) is not supported by kvpool")
