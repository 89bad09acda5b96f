"""Namespaces of every engine integration: the ids stored blocks live under, to the byte.

A change here orphans every block an existing deployment stored: the ids below are literal
on purpose. (vLLM's offloading tier, which needs vLLM to build its config, is pinned in
tests/engines/vllm/test_tier.py.)
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from kvpool_client import BlockKeyBuilder, UsageError
from kvpool_client.integrations.lmcache.keys import ChunkFormat, ChunkKeys
from kvpool_client.integrations.namespaces import DTYPES, KVLayout, NamespaceFields, dtype_field
from kvpool_client.integrations.sglang.shape import PageShape
from kvpool_client.integrations.vllm.shape import CacheShape


def test_every_torch_dtype_name_of_the_table_maps_to_its_field_and_back() -> None:
    for field, (torch_name, size) in DTYPES.items():
        dtype = getattr(torch, torch_name)
        assert dtype_field(dtype) == dtype_field(torch_name) == dtype_field(f"torch.{torch_name}") == field
        assert dtype.itemsize == size
    assert dtype_field(torch.int8) == "int8", "a dtype the table lacks keeps its torch name"
    assert NamespaceFields.of("Qwen/Qwen2.5-0.5B", torch.bfloat16, "main") == NamespaceFields(
        "Qwen--Qwen2.5-0.5B~main", "bf16"
    )


def test_kv_layout_shapes_sizes_and_ids() -> None:
    layout = KVLayout(layers=2, kv_heads=2, head_dim=4, block_size=4, dtype="fp32")
    assert layout.block_shape == (2, 2, 2, 4, 4)
    assert KVLayout(2, 2, 4, 4, "fp32", order="TLKHD").block_shape == (4, 2, 2, 2, 4)
    assert layout.block_nbytes == 2 * 2 * 2 * 4 * 4 * 4 and layout.token_nbytes == layout.block_nbytes // 4
    assert layout.torch_dtype() is torch.float32
    qwen = KVLayout(24, 2, 64, 32)  # Qwen2.5-0.5B in bf16: 12 KiB per token
    assert qwen.id == "L24-KV2-H2-D64-T32-LKHTD" and qwen.block_nbytes == 384 * 1024


def test_kv_layout_namespaces() -> None:
    assert [
        KVLayout(24, 2, 64, 16, "bf16").namespace("Qwen2.5-0.5B").id,
        KVLayout(2, 2, 4, 4, "fp32", order="TLKHD").namespace("tiny", tp_rank=1, tp_size=2).id,
        KVLayout(32, 8, 128, 16, "fp8e4m3").namespace("m").id,
    ] == [
        "Qwen2.5-0.5B@bf16@L24-KV2-H2-D64-T16-LKHTD@tp0of1",
        "tiny@fp32@L2-KV2-H2-D4-T4-TLKHD@tp1of2",
        "m@fp8e4m3@L32-KV2-H8-D128-T16-LKHTD@tp0of1",
    ]


@pytest.mark.parametrize("bad", [dict(layers=0), dict(dtype="float32"), dict(order="LKHT"), dict(order="LKHTT")])
def test_invalid_layouts_are_refused(bad: dict[str, Any]) -> None:
    args: dict[str, Any] = dict(layers=2, kv_heads=2, head_dim=4, block_size=4, dtype="fp32") | bad
    with pytest.raises(UsageError):
        KVLayout(**args)


def test_another_model_dtype_layout_or_rank_never_shares_a_key() -> None:
    layout = KVLayout(2, 2, 4, 4, "fp32")
    variants = [
        layout.namespace("tiny-model"),
        layout.namespace("other-model"),
        KVLayout(2, 2, 4, 4, "bf16").namespace("tiny-model"),
        KVLayout(2, 2, 4, 4, "fp32", order="LKTHD").namespace("tiny-model"),
        KVLayout(3, 2, 4, 4, "fp32").namespace("tiny-model"),
        layout.namespace("tiny-model", tp_rank=1, tp_size=2),
    ]
    keys = [BlockKeyBuilder(v, 4, seed="0").keys(list(range(1, 19)))[0] for v in variants]
    assert len(set(keys)) == len(variants)
    assert len({k.hash for k in keys}) == 1  # the hash stays vLLM's; the namespace separates


@pytest.mark.parametrize(
    ("shape", "ids"),
    [
        (
            CacheShape("Qwen/Qwen2.5-0.5B", "bfloat16", "NHD", "mha", 24, 2, 64, 16),
            ["Qwen--Qwen2.5-0.5B@bf16@vllm-NHD-mha-L24-H2-D64-T16-pp0of1@tp0of1"],
        ),
        (
            CacheShape("Qwen/Qwen2.5-0.5B", "bfloat16", None, "mha", 24, 2, 64, 16, tp_size=2, pp_size=2),
            [
                "Qwen--Qwen2.5-0.5B@bf16@vllm-default-mha-L24-H2-D64-T16-pp0of2@tp0of2",
                "Qwen--Qwen2.5-0.5B@bf16@vllm-default-mha-L24-H2-D64-T16-pp0of2@tp1of2",
                "Qwen--Qwen2.5-0.5B@bf16@vllm-default-mha-L24-H2-D64-T16-pp1of2@tp0of2",
                "Qwen--Qwen2.5-0.5B@bf16@vllm-default-mha-L24-H2-D64-T16-pp1of2@tp1of2",
            ],
        ),
        (
            CacheShape("deepseek-ai/DeepSeek-V2-Lite", "float8_e4m3fn", "HND", "mla", 27, 1, 576, 64, tp_size=4),
            ["deepseek-ai--DeepSeek-V2-Lite@fp8e4m3@vllm-HND-mla-L27-H1-D576-T64-pp0of1@tp0of1"],
        ),
        (
            CacheShape("meta llama@x", "float16", "LBNHC", "mha", 2, 8, 128, 32, revision="abc123", quantization="awq"),
            ["meta_llama_x~abc123@fp16@vllm-LBNHC-mha-qawq-L2-H8-D128-T32-pp0of1@tp0of1"],
        ),
        (CacheShape("m", "uint8", "NHD", "mha", 2, 2, 8, 4), ["m@u8@vllm-NHD-mha-L2-H2-D8-T4-pp0of1@tp0of1"]),
        (
            CacheShape("m", "float8_e5m2", "NHD", "mha", 2, 2, 8, 4),
            ["m@fp8e5m2@vllm-NHD-mha-L2-H2-D8-T4-pp0of1@tp0of1"],
        ),
        (CacheShape("m", "int8", "NHD", "mha", 2, 2, 8, 4), ["m@int8@vllm-NHD-mha-L2-H2-D8-T4-pp0of1@tp0of1"]),
        (CacheShape("m", "float32", "NHD", "mha", 2, 2, 8, 4), ["m@fp32@vllm-NHD-mha-L2-H2-D8-T4-pp0of1@tp0of1"]),
    ],
)
def test_vllm_connector_namespaces(shape: CacheShape, ids: list[str]) -> None:
    assert shape.namespaces().writers() == ids


@pytest.mark.parametrize(
    ("shape", "ids"),
    [
        (
            PageShape("Qwen/Qwen2.5-0.5B", "bfloat16", "mha", "page_first", 24, 2, 64, 64),
            [
                "Qwen--Qwen2.5-0.5B@bf16@sglang-mha-page_first-L24-H2-D64-P64-pp0of1-k@tp0of1",
                "Qwen--Qwen2.5-0.5B@bf16@sglang-mha-page_first-L24-H2-D64-P64-pp0of1-v@tp0of1",
            ],
        ),
        (
            PageShape(
                "Qwen/Qwen2.5-0.5B",
                "bfloat16",
                "mha",
                "layer_first",
                24,
                2,
                64,
                64,
                tp_rank=1,
                tp_size=2,
                pp_rank=1,
                pp_size=2,
            ),
            [
                "Qwen--Qwen2.5-0.5B@bf16@sglang-mha-layer_first-L24-H2-D64-P64-pp1of2-k@tp1of2",
                "Qwen--Qwen2.5-0.5B@bf16@sglang-mha-layer_first-L24-H2-D64-P64-pp1of2-v@tp1of2",
            ],
        ),
        (
            PageShape(
                "ds",
                "float8_e4m3fn",
                "mla",
                "page_first_direct",
                61,
                1,
                576,
                64,
                tp_rank=3,
                tp_size=8,
                cp_rank=1,
                cp_size=2,
            ),
            ["ds@fp8e4m3@sglang-mla-page_first_direct-L61-H1-D576-P64-pp0of1-cp1of2-kv@tp0of1"],
        ),
        (
            PageShape("XiaomiMiMo/MiMo-V2", "float16", "mha", "page_head", 4, 4, 192, 16, v_head_dim=128),
            [
                "XiaomiMiMo--MiMo-V2@fp16@sglang-mha-page_head-L4-H4-D192-V128-P16-pp0of1-k@tp0of1",
                "XiaomiMiMo--MiMo-V2@fp16@sglang-mha-page_head-L4-H4-D192-V128-P16-pp0of1-v@tp0of1",
            ],
        ),
        (
            PageShape("m", "float32", "mha", "page_first", 2, 2, 8, 4, v_head_dim=8),
            [
                "m@fp32@sglang-mha-page_first-L2-H2-D8-P4-pp0of1-k@tp0of1",
                "m@fp32@sglang-mha-page_first-L2-H2-D8-P4-pp0of1-v@tp0of1",
            ],
        ),
    ],
)
def test_sglang_namespaces(shape: PageShape, ids: list[str]) -> None:
    assert [n.id for n in shape.namespaces()] == ids


def _key(model: str, world: int, worker: int, dtype: Any) -> Any:
    return types.SimpleNamespace(
        model_name=model, world_size=world, worker_id=worker, chunk_hash=1, dtype=dtype, tags=None
    )


@pytest.mark.parametrize(
    ("chunk_format", "model_id", "key", "namespace"),
    [
        (
            ChunkFormat.of(
                types.SimpleNamespace(name="KV_2LTD"), 256, [torch.Size([2, 24, 256, 128])], [torch.bfloat16]
            ),
            None,
            _key("Qwen/Qwen2.5-0.5B", 2, 1, torch.bfloat16),
            "Qwen--Qwen2.5-0.5B@bf16@lmcache-KV_2LTD-T256-2x24x256x128@tp1of2",
        ),
        (
            ChunkFormat.of(
                types.SimpleNamespace(name="KV_MLA_FMT"), 256, [torch.Size([1, 61, 256, 576])], [torch.float8_e4m3fn]
            ),
            "ds-prod",
            _key("ds", 1, 0, torch.float8_e4m3fn),
            "ds-prod@fp8e4m3@lmcache-KV_MLA_FMT-T256-1x61x256x576@tp0of1",
        ),
        (
            ChunkFormat.of(
                types.SimpleNamespace(name="KV_2LTD"),
                16,
                [torch.Size([2, 2, 16, 16]), torch.Size([2, 1, 16, 8])],
                [torch.float16, torch.float32],
            ),
            None,
            _key("m", 4, 3, torch.float16),
            "m@fp16@lmcache-KV_2LTD-T16-2x2x16x16+2x1x16x8fp32@tp3of4",
        ),
        (
            ChunkFormat.of("KV_T2D", 8, [(2, 2, 8, 4)], ["torch.uint8"]),
            None,
            _key("m", 1, 0, "torch.uint8"),
            "m@u8@lmcache-KV_T2D-T8-2x2x8x4@tp0of1",
        ),
    ],
)
def test_lmcache_namespaces(chunk_format: ChunkFormat, model_id: str | None, key: Any, namespace: str) -> None:
    assert ChunkKeys(chunk_format, model_id).namespace(key) == namespace
