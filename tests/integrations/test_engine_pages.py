"""Paged KV cache: slot mapping, writes and gathers through scattered page tables."""

from __future__ import annotations

import pytest
import torch

from bench.engine.model import SeqBatch
from bench.engine.pages import PagedKVCache
from kvpool_client.integrations.namespaces import KVLayout

LAYOUT = KVLayout(layers=2, kv_heads=2, head_dim=3, block_size=4, dtype="fp32")


def test_pages_are_contiguous_views_of_the_cache() -> None:
    kv = PagedKVCache(LAYOUT, 5)
    page = kv.page(3)
    assert page.shape == LAYOUT.block_shape == (2, 2, 2, 4, 3)
    assert page.is_contiguous() and page.data_ptr() == kv.data[3].data_ptr()
    assert kv.page_bytes == page.numel() * 4 == LAYOUT.block_nbytes


def test_slot_mapping_follows_each_page_table() -> None:
    kv = PagedKVCache(LAYOUT, 8)
    seqs = [SeqBatch(0, 3, 6, [6, 1], True), SeqBatch(3, 2, 2, [4], False)]
    positions = torch.tensor([3, 4, 5, 0, 1])
    slots = kv.slot_mapping(seqs, positions)
    assert slots.page.tolist() == [6, 1, 1, 4, 4]
    assert slots.slot.tolist() == [3, 0, 1, 0, 1]
    assert [t.tolist() for t in slots.tables] == [[6, 1], [4]]


def test_written_tokens_come_back_in_position_order() -> None:
    kv = PagedKVCache(LAYOUT, 8)
    seq = SeqBatch(0, 7, 7, [5, 2], True)
    positions = torch.arange(7)
    slots = kv.slot_mapping([seq], positions)
    k = torch.arange(7 * 2 * 3, dtype=torch.float32).view(7, 2, 3)
    kv.write(1, slots, k, -k)
    keys, values = kv.gather(1, slots.tables[0], 7)
    assert torch.equal(keys, k.transpose(0, 1)) and torch.equal(values, -k.transpose(0, 1))
    assert torch.equal(kv.page(5)[1, 0, :, 2], k[2]) and torch.equal(kv.page(2)[1, 1, :, 0], -k[4])
    assert kv.page(5)[0].abs().sum() == 0  # layer 0 untouched


def test_other_orders_are_refused() -> None:
    with pytest.raises(ValueError):
        PagedKVCache(KVLayout(2, 2, 3, 4, "fp32", order="LKTHD"), 2)
