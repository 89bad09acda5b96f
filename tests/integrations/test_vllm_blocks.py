"""vLLM's per-layer KV tensors as pool blocks: every layout vLLM allocates round-trips, in place when it can."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_client.buffers import Regions, spans
from kvpool_client.core.errors import UsageError
from kvpool_client.integrations.vllm.blocks import BlockLayers, StagingBuffers


def caches(layers: int, blocks: int, page: int, block_major: bool, kv_split: bool = False) -> dict[str, torch.Tensor]:
    """Per-layer views of one int8 buffer, as vLLM's allocator makes them (uint8 here)."""
    buffer = torch.zeros(layers * blocks * page, dtype=torch.uint8)
    out = {}
    for layer in range(layers):
        # BLHNC: block b of every layer is one span; LBNHC: layer after layer
        view = buffer.view(blocks, layers, page)[:, layer] if block_major else buffer.view(layers, blocks, page)[layer]
        if kv_split:  # (2, blocks, page/2): K and V apart
            view = view.view(blocks, 2, page // 2).transpose(0, 1)
        out[f"layer.{layer}"] = view
    return out


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 5),
    blocks=st.integers(3, 6),
    page=st.sampled_from([16, 64, 96]),
    block_major=st.booleans(),
    kv_split=st.booleans(),
    data=st.data(),
)
def test_a_block_scattered_then_gathered_is_the_same_and_touches_no_other_block(
    layers: int, blocks: int, page: int, block_major: bool, kv_split: bool, data: st.DataObject
) -> None:
    tensors = caches(layers, blocks, page, block_major, kv_split)
    paged = BlockLayers(tensors, list(tensors), blocks)
    assert paged.block_nbytes == layers * page
    block = data.draw(st.integers(0, blocks - 1))
    payload = torch.randint(0, 256, (paged.block_nbytes,), dtype=torch.uint8)
    before = {n: t.clone() for n, t in tensors.items()}
    paged.scatter(block, payload)
    out = torch.empty_like(payload)
    paged.gather(block, out)
    assert torch.equal(out, payload)
    for name, tensor in tensors.items():
        index = (slice(None), block) if kv_split else (block,)
        changed = tensor.clone()
        changed[index] = before[name][index]
        assert torch.equal(changed, before[name]), f"{name}: bytes outside block {block} changed"


def test_a_block_major_cache_is_read_in_place() -> None:
    tensors = caches(3, 4, 64, block_major=True)
    paged = BlockLayers(tensors, list(tensors), 4)
    assert paged.direct
    block = paged.block(2)
    assert isinstance(block, memoryview), "one slice of the cache"
    block[:] = b"\x07" * len(block)
    assert all(bool((t[2] == 7).all()) and not bool((t[1] == 7).any()) for t in tensors.values())
    assert not BlockLayers(caches(3, 4, 64, block_major=False), [f"layer.{i}" for i in range(3)], 4).direct


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 4), page=st.sampled_from([16, 64]), kv_split=st.booleans(), data=st.data())
def test_a_layer_major_blocks_regions_are_its_bytes_in_block_order(
    layers: int, page: int, kv_split: bool, data: st.DataObject
) -> None:
    tensors = caches(layers, 4, page, block_major=False, kv_split=kv_split)
    paged = BlockLayers(tensors, list(tensors), 4)
    block = data.draw(st.integers(0, 3))
    written = data.draw(st.binary(min_size=paged.block_nbytes, max_size=paged.block_nbytes))
    target = paged.block(block)
    assert isinstance(target, Regions) != paged.direct and len(target) == paged.block_nbytes
    at = 0
    for view in spans(target):  # what a get does: fill the regions in order
        view[:] = written[at : at + len(view)]
        at += len(view)
    out = torch.empty(paged.block_nbytes, dtype=torch.uint8)
    paged.gather(block, out)
    assert out.numpy().tobytes() == written, "the regions are not the block's bytes in the order a gather reads"


def test_layer_order_is_the_group_order() -> None:
    tensors = caches(2, 3, 16, block_major=False)
    paged = BlockLayers(tensors, ["layer.1", "layer.0"], 3)
    tensors["layer.1"][0].fill_(1)
    tensors["layer.0"][0].fill_(2)
    out = torch.empty(32, dtype=torch.uint8)
    paged.gather(0, out)
    assert out[:16].tolist() == [1] * 16 and out[16:].tolist() == [2] * 16


@pytest.mark.parametrize(
    ("tensors", "names", "message"),
    [
        ({"a": torch.zeros(5, 8, dtype=torch.uint8)}, ["a", "b"], "no KV cache registered"),
        ({"a": torch.zeros(3, 8, dtype=torch.uint8)}, ["a"], "indexes no 5 blocks"),
        ({"a": torch.zeros(8, 5, dtype=torch.uint8).t()}, ["a"], "not one dense span"),
    ],
)
def test_a_tensor_that_is_not_a_paged_cache_is_refused(
    tensors: dict[str, torch.Tensor], names: list[str], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        BlockLayers(tensors, names, 5)


def test_block_ids_out_of_range_are_refused() -> None:
    tensors = caches(1, 4, 16, block_major=False)
    with pytest.raises(UsageError, match="out of range"):
        BlockLayers(tensors, list(tensors), 4).check([0, 4])


def test_staging_buffers_are_reused() -> None:
    paged = BlockLayers(caches(2, 4, 16, block_major=False), ["layer.0", "layer.1"], 4)
    staging = StagingBuffers(paged)
    first = staging.take(2)
    assert [b.numel() for b in first] == [32, 32]
    staging.give_back(first)
    again = staging.take(3)
    assert sum(any(b is f for f in first) for b in again) == 2
