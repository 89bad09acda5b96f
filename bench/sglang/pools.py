"""SGLang's real host KV pools and storage configs on a CPU, for kvpool's tests and benchmark.

The host pools are SGLang's own classes (``MHATokenToKVPoolHost``, its asymmetric twin for
models whose K and V head sizes differ, ``MLATokenToKVPoolHost``) built from a small CPU device
pool, chosen as SGLang's server chooses them from its GPU pool; the only difference is
``pin_memory=False`` (pinning needs CUDA). The backend is attached the
way ``HiCacheController.attach_storage_backend`` does it: factory, then registration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def _define_torchvision_ops() -> Any:
    """PyPI's torchvision is a CUDA build: next to a CPU torch its ``_C`` cannot load, and its
    meta registrations then fail with "operator torchvision::nms does not exist". SGLang's
    configs import torchvision.transforms, so define the two op schemas it registers
    against, unless a working torchvision already did."""
    try:
        torch.ops.torchvision.nms  # noqa: B018 - raises when the op is missing
        return None
    except (AttributeError, RuntimeError):
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        return library


_TORCHVISION_OPS = _define_torchvision_ops()

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

MODULE = "kvpool_client.integrations.sglang.store"


@dataclass(frozen=True, slots=True)
class PoolShape:
    """A model's KV shape as SGLang's host pool holds it.

    Attributes:
        kind: ``mha`` or ``mla``; heads/head_dim: MHA's KV heads and head size (``v_head_dim``
            the V heads' when it differs); MLA's latent dimension is ``kv_lora_rank + rope_dim``.
    """

    name: str
    kind: str
    layers: int
    heads: int = 1
    head_dim: int = 0
    kv_lora_rank: int = 0
    rope_dim: int = 0
    page_size: int = 4
    dtype: torch.dtype = torch.bfloat16
    v_head_dim: int | None = None

    @property
    def page_nbytes(self) -> int:
        mha = self.heads * (self.head_dim + (self.v_head_dim or self.head_dim))
        per_token = mha if self.kind == "mha" else self.kv_lora_rank + self.rope_dim
        return per_token * self.layers * self.page_size * self.dtype.itemsize


TINY_MHA = PoolShape("tiny-mha", "mha", layers=2, heads=2, head_dim=8)
TINY_MLA = PoolShape("tiny-mla", "mla", layers=2, kv_lora_rank=16, rope_dim=8)
# V heads smaller than K heads (MiMo-V2's kind): SGLang keeps K and V in two buffers.
TINY_ASYMMETRIC = PoolShape("tiny-asymmetric", "mha", layers=2, heads=2, head_dim=8, v_head_dim=4)


def device_pool(shape: PoolShape, tokens: int) -> Any:
    """SGLang's device KV pool of ``shape`` on the CPU (what its model runner allocates)."""
    common = dict(
        size=tokens,
        page_size=shape.page_size,
        dtype=shape.dtype,
        layer_num=shape.layers,
        device="cpu",
        enable_memory_saver=False,
    )
    if shape.kind == "mla":
        return MLATokenToKVPool(kv_lora_rank=shape.kv_lora_rank, qk_rope_head_dim=shape.rope_dim, **common)
    return MHATokenToKVPool(head_num=shape.heads, head_dim=shape.head_dim, v_head_dim=shape.v_head_dim, **common)


def host_pool(shape: PoolShape, layout: str, pages: int) -> Any:
    """SGLang's host KV pool of ``shape`` and ``layout`` with room for ``pages`` pages."""
    device = device_pool(shape, 2 * shape.page_size)  # the host pool copies only its description
    info = device.get_device_pool_infos()[0].buffer_info
    common = dict(
        host_to_device_ratio=1.0,
        host_size=0,
        page_size=shape.page_size,
        layout=layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=pages * shape.page_size,
        start_layer=device.start_layer,
        end_layer=device.end_layer,
    )
    if shape.kind == "mla":
        return MLATokenToKVPoolHost(
            info, target_layer_num=device.layer_num, override_kv_cache_dim=device.kv_cache_dim, **common
        )
    return get_mha_host_pool_cls(info)(info, **common)


def storage_config(
    shape: PoolShape,
    layout: str,
    extra: dict[str, Any],
    model: str = "test/tiny-model",
    tp_rank: int = 0,
    tp_size: int = 1,
) -> HiCacheStorageConfig:
    """Field for field what ``HiCacheController._generate_storage_config`` builds (no PP, CP, DCP)."""
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=shape.kind == "mla",
        enable_storage_metrics=False,
        is_page_first_layout=layout == "page_first",
        model_name=model,
        extra_config=dict(extra),
    )


def attach(config: HiCacheStorageConfig, host: Any) -> HiCacheStorage:
    """The backend, made and registered as ``HiCacheController.attach_storage_backend`` does."""
    backend = StorageBackendFactory.create_backend("dynamic", config, host)
    backend.register_mem_pool_host(host)
    backend.on_host_pools_registered()
    return backend


def extra_config(nodes: str, **settings: Any) -> dict[str, Any]:
    """The dynamic-backend extra config of docs/sglang.md, for ``nodes``."""
    return {
        "backend_name": "kvpool",
        "module_path": MODULE,
        "class_name": "KVPoolStore",
        "interface_v1": 1,
        "nodes": nodes,
        **settings,
    }


def fill_random(host: Any, starts: list[int], seed: int) -> None:
    """Random bytes (NaNs included: compare as bytes) into the pages at ``starts``."""
    generator = torch.Generator().manual_seed(seed)
    for start in starts:
        page = host.get_data_page(start, flat=False).view(torch.uint8)
        page.copy_(torch.randint(0, 256, page.shape, dtype=torch.uint8, generator=generator))


def page_bytes(host: Any, start: int) -> torch.Tensor:
    """A copy of the page at ``start``, as bytes."""
    return host.get_data_page(start, flat=True).view(torch.uint8).clone()


def page_starts(indices: torch.Tensor, page_size: int) -> list[int]:
    return indices[::page_size].tolist()
