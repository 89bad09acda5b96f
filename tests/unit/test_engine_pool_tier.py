"""Engine connector: layouts and namespaces, key planning, zero-copy and staged transfers.

The pool here is an in-memory stand-in with the client's put/get/lookup contract, so
the connector's own logic is tested without sockets (the integration test uses a
real daemon).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from kvpool_client import BlockKey, ErrorCode, UsageError
from kvpool_client.connector import ConnectorScheduler, ConnectorWorker, KVLayout, KVPages
from kvpool_client.results import GetResult, PutResult

LAYOUT = KVLayout(layers=2, kv_heads=2, head_dim=4, block_size=4, dtype="fp32")
NS = LAYOUT.namespace("tiny-model")
TOKENS = list(range(1, 19))  # 4 full blocks and 2 tokens


class MemoryPool:
    """put-if-absent / get / lookup over a dict, returning the client's result types."""

    def __init__(self) -> None:
        self.blocks: dict[BlockKey, bytes] = {}
        self.get_targets: list[Any] = []

    def put(self, keys: Sequence[BlockKey], blocks: Sequence[Any]) -> PutResult:
        statuses = []
        for key, block in zip(keys, blocks, strict=True):
            assert block.is_contiguous()
            if key in self.blocks:
                statuses.append(ErrorCode.ALREADY_EXISTS)
            else:
                self.blocks[key] = block.numpy().tobytes()
                statuses.append(ErrorCode.OK)
        return PutResult(tuple(statuses))

    def get(self, keys: Sequence[BlockKey], into: Sequence[Any]) -> GetResult:
        self.get_targets = list(into)
        statuses = []
        for key, target in zip(keys, into, strict=True):
            data = self.blocks.get(key)
            if data is None:
                statuses.append(ErrorCode.NOT_FOUND)
                continue
            target.view(-1).copy_(torch.frombuffer(bytearray(data), dtype=torch.float32))
            statuses.append(ErrorCode.OK)
        return GetResult(tuple(statuses))

    def lookup(self, keys: Sequence[BlockKey]) -> int:
        count = 0
        while count < len(keys) and keys[count] in self.blocks:
            count += 1
        return count


def _pair(pool: MemoryPool, cache: torch.Tensor, page_dim: int = 0) -> tuple[ConnectorScheduler, ConnectorWorker]:
    pages = KVPages(cache, LAYOUT, page_dim)
    return ConnectorScheduler(pool, LAYOUT, NS), ConnectorWorker(pool, pages, NS)  # type: ignore[arg-type]


def test_layout_shapes_sizes_and_ids() -> None:
    assert LAYOUT.block_shape == (2, 2, 2, 4, 4)
    assert KVLayout(2, 2, 4, 4, "fp32", order="TLKHD").block_shape == (4, 2, 2, 2, 4)
    assert LAYOUT.block_nbytes == 2 * 2 * 2 * 4 * 4 * 4 and LAYOUT.token_nbytes == LAYOUT.block_nbytes // 4
    qwen = KVLayout(24, 2, 64, 32)  # Qwen2.5-0.5B in bf16: 12 KiB per token
    assert qwen.id == "L24-KV2-H2-D64-T32-LKHTD" and qwen.block_nbytes == 384 * 1024
    assert NS.id == "tiny-model@fp32@L2-KV2-H2-D4-T4-LKHTD@tp0of1"


@pytest.mark.parametrize("bad", [dict(layers=0), dict(dtype="float32"), dict(order="LKHT"), dict(order="LKHTT")])
def test_invalid_layouts_are_refused(bad: dict[str, Any]) -> None:
    args: dict[str, Any] = dict(layers=2, kv_heads=2, head_dim=4, block_size=4, dtype="fp32") | bad
    with pytest.raises(UsageError):
        KVLayout(**args)


def test_another_model_dtype_layout_or_rank_never_shares_a_key() -> None:
    variants = [
        NS,
        LAYOUT.namespace("other-model"),
        KVLayout(2, 2, 4, 4, "bf16").namespace("tiny-model"),
        KVLayout(2, 2, 4, 4, "fp32", order="LKTHD").namespace("tiny-model"),
        KVLayout(3, 2, 4, 4, "fp32").namespace("tiny-model"),
        LAYOUT.namespace("tiny-model", tp_rank=1, tp_size=2),
    ]
    pool = MemoryPool()
    keys = [ConnectorScheduler(pool, _layout_of(v), v).block_keys(TOKENS)[0] for v in variants]  # type: ignore[arg-type]
    assert len(set(keys)) == len(variants)
    assert len({k.hash for k in keys}) == 1  # the hash stays vLLM's; the namespace separates


def _layout_of(namespace: Any) -> KVLayout:
    layers = int(namespace.layout.split("-")[0][1:])
    return KVLayout(layers, 2, 4, 4, namespace.dtype, namespace.layout.rsplit("-", 1)[1])


def test_scheduler_refuses_a_namespace_of_another_layout() -> None:
    with pytest.raises(UsageError):
        ConnectorScheduler(MemoryPool(), LAYOUT, KVLayout(2, 2, 4, 8, "fp32").namespace("m"))  # type: ignore[arg-type]


def test_match_starts_after_local_blocks_and_respects_the_limit() -> None:
    pool = MemoryPool()
    scheduler, _ = _pair(pool, torch.zeros(4, *LAYOUT.block_shape))
    keys = scheduler.block_keys(TOKENS)
    assert len(keys) == 4
    for key in keys[:3]:
        pool.blocks[key] = b""
    assert scheduler.match(keys).blocks == 3
    match = scheduler.match(keys, computed_blocks=1, limit=1)
    assert (match.first_block, match.keys, match.tokens) == (1, (keys[1],), 4)
    assert scheduler.match(keys, computed_blocks=4).blocks == 0


def test_contiguous_pages_round_trip_with_zero_copy() -> None:
    pool = MemoryPool()
    cache = torch.randn(6, *LAYOUT.block_shape)
    scheduler, worker = _pair(pool, cache)
    keys = scheduler.block_keys(TOKENS)
    saved = worker.save(keys, [4, 1, 0, 5])
    assert (saved.stored, saved.already, saved.failed, saved.nbytes) == (4, 0, 0, 4 * LAYOUT.block_nbytes)
    assert worker.save(keys[:1], [4]).already == 1
    target = torch.zeros(6, *LAYOUT.block_shape)
    _, reader = _pair(pool, target)
    loaded = reader.load(keys, [2, 3, 0, 1])
    assert loaded.loaded == 4
    assert all(t.data_ptr() == target[p].data_ptr() for t, p in zip(pool.get_targets, [2, 3, 0, 1], strict=True))
    assert torch.equal(target[[2, 3, 0, 1]], cache[[4, 1, 0, 5]])


def test_strided_pages_go_through_staging() -> None:
    pool = MemoryPool()
    # vLLM-like: the page dimension inside the layer dimension, so a page is not contiguous.
    cache = torch.randn(LAYOUT.layers, 5, *LAYOUT.block_shape[1:])
    pages = KVPages(cache, LAYOUT, page_dim=1)
    assert not pages.direct
    scheduler = ConnectorScheduler(pool, LAYOUT, NS)  # type: ignore[arg-type]
    worker = ConnectorWorker(pool, pages, NS)  # type: ignore[arg-type]
    keys = scheduler.block_keys(TOKENS)[:2]
    worker.save(keys, [3, 0])
    target = torch.zeros_like(cache)
    reader = ConnectorWorker(pool, KVPages(target, LAYOUT, page_dim=1), NS)  # type: ignore[arg-type]
    assert reader.load(keys, [1, 4]).loaded == 2
    assert torch.equal(target[:, 1], cache[:, 3]) and torch.equal(target[:, 4], cache[:, 0])
    assert target[:, [0, 2, 3]].abs().sum() == 0


def test_a_missing_block_ends_the_loaded_prefix() -> None:
    pool = MemoryPool()
    scheduler, worker = _pair(pool, torch.randn(4, *LAYOUT.block_shape))
    keys = scheduler.block_keys(TOKENS)
    worker.save(keys, [0, 1, 2, 3])
    del pool.blocks[keys[1]]  # evicted between lookup and load
    result = worker.load(keys[:3], [3, 2, 1])
    assert (result.requested, result.loaded, result.nbytes) == (3, 1, LAYOUT.block_nbytes)
    assert result.statuses == (ErrorCode.OK, ErrorCode.NOT_FOUND, ErrorCode.OK)


def test_worker_refuses_foreign_keys_bad_pages_and_wrong_dtype() -> None:
    pool = MemoryPool()
    scheduler, worker = _pair(pool, torch.zeros(2, *LAYOUT.block_shape))
    keys = scheduler.block_keys(TOKENS)
    foreign = ConnectorScheduler(pool, _layout_of(LAYOUT.namespace("m")), LAYOUT.namespace("m"))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="namespace"):
        worker.save(foreign.block_keys(TOKENS)[:1], [0])
    with pytest.raises(UsageError, match="out of range"):
        worker.load(keys[:1], [2])
    with pytest.raises(UsageError, match="keys for"):
        worker.load(keys[:2], [0])
    with pytest.raises(UsageError, match="dtype"):
        KVPages(torch.zeros(2, *LAYOUT.block_shape, dtype=torch.float16), LAYOUT)
    with pytest.raises(UsageError, match="shape"):
        KVPages(torch.zeros(2, 3, 3), LAYOUT)
