"""SGLang's real HiCacheController drives KVPoolStore with its own storage threads.

The controller builds the backend from the extra config (factory, registration), picks the
zero-copy page calls for ``interface_v1``, backs pages up on its backup thread, and on a
prefetch asks the pool for the hit count on its prefetch thread and loads the pages on its
I/O thread. Only the scheduler is played here: it allocates host pages for the hits.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.mem_cache.utils import get_hash_str
from sglang.srt.runtime_context import get_parallel

from bench.sglang.pools import TINY_MHA, device_pool, extra_config, fill_random, host_pool, page_bytes, page_starts
from kvpool_client.core.keys import BlockKeyBuilder
from kvpool_client.integrations.sglang.store import KVPoolStore
from tests.support.daemon import DaemonProcess

PAGE = TINY_MHA.page_size
WAIT_S = 30.0  # the most a storage thread may take to answer; each queue get waits for its item


class _Allocator:
    """The scheduler's token allocator: all the controller reads of it is the device pool."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def get_kvcache(self) -> Any:
        return self._pool


@pytest.fixture
def controller(daemon: DaemonProcess) -> Iterator[HiCacheController]:
    """A single-rank controller with kvpool attached; its storage threads stop at the end."""
    # No server published a parallel layout in this process: one rank, no PP, no DCP.
    get_parallel().override_permanently(attn_dcp_size=1, attn_dcp_rank=0, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    extra, threshold, *_ = HybridCacheController.parse_storage_backend_extra_config(
        json.dumps(extra_config(daemon.address, prefetch_threshold=PAGE))
    )
    host = host_pool(TINY_MHA, "page_first", pages=32)
    cc = HiCacheController(
        _Allocator(device_pool(TINY_MHA, 8 * PAGE)),
        host,
        PAGE,
        None,
        threading.Event(),
        write_policy="write_through",
        storage_backend="dynamic",
        prefetch_threshold=threshold,
        model_name="test/tiny-model",
        storage_backend_extra_config=extra,
    )
    try:
        yield cc
    finally:
        cc.detach_storage_backend()


def test_sglang_keys_are_kvpools_sglang_page_hashes() -> None:
    tokens = list(range(7, 7 + 3 * PAGE))
    builder = BlockKeyBuilder("ns", PAGE, scheme="sglang")
    assert get_hash_str(tokens, None, page_size=PAGE) == [h.hex() for h in builder.hashes(tokens)]


def test_the_controller_backs_up_and_prefetches_pages_through_the_pool(controller: HiCacheController) -> None:
    cc = controller
    assert isinstance(cc.storage_backend, KVPoolStore)
    assert cc.page_get_func == cc._page_get_zero_copy and cc.page_set_func == cc._page_set_zero_copy
    host = cc.mem_pool_host
    tokens = list(range(7, 7 + 5 * PAGE))
    keys = get_hash_str(tokens, None, page_size=PAGE)
    source = host.alloc(len(tokens))
    fill_random(host, page_starts(source, PAGE), seed=3)
    want = [page_bytes(host, s) for s in page_starts(source, PAGE)]

    op_id = cc.write_storage(source, tokens, hash_value=keys)  # the backup thread runs batch_set_v1
    backed_up = cc.ack_backup_queue.get(timeout=WAIT_S)
    assert backed_up.id == op_id and backed_up.completed_tokens == len(tokens)

    # The prompt goes on past what the pool holds: the prefetch thread's batch_exists stops there.
    op = cc.prefetch("req-1", tokens + list(range(9000, 9000 + 3 * PAGE)))
    assert cc.prefetch_hit_queue.get(timeout=WAIT_S) is op and op.storage_hit_count == len(tokens)
    op.host_indices = host.alloc(op.storage_hit_count)  # the scheduler allocates the hits
    cc.prefetch_buffer.put(op)
    acks = [cc.ack_prefetch_queue.get(timeout=WAIT_S)]
    while not acks[-1].completed_req:
        acks.append(cc.ack_prefetch_queue.get(timeout=WAIT_S))
    assert max(a.completed_tokens or 0 for a in acks) == len(tokens)
    for page, start in enumerate(page_starts(op.host_indices, PAGE)):
        assert torch.equal(page_bytes(host, start), want[page]), f"page {page} differs"
