"""SGLang 0.5.23's host KV pools that kvpool stores: each one's page shape and the views of a page's parts.

- ``MHATokenToKVPoolHost``: a page's K and V are SGLang's ``get_data_page(index, flat=False)``
  views, in its ``kv_buffer``.
- ``AsymmetricMHATokenToKVPoolHost`` (models whose K and V head sizes differ, e.g. MiMo-V2):
  K and V lie in two buffers and SGLang has no ``get_data_page`` for them; a page's K and V
  are the spans SGLang's ``get_page_buffer_meta`` names, the bytes its zero-copy backends
  (Mooncake) store. Only ``"interface_v1": 1`` moves them: SGLang's legacy (flat page) path
  needs the ``get_data_page`` these pools lack.
- ``MLATokenToKVPoolHost``: a page's latent cache is SGLang's ``get_data_page`` view.

Refused at attach, naming the setting: ``--kv-cache-dtype mxfp8``
(``MHATokenToKVPoolMXFP8Host``: a page's UE8M0 scales lie outside ``kv_buffer``, and
SGLang gives no view of them), and any other pool class.
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.mem_cache.pool_host.mha import AsymmetricMHATokenToKVPoolHost, MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mha_mxfp8 import MHATokenToKVPoolMXFP8Host
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

from kvpool_client.core.errors import UsageError
from kvpool_client.integrations.sglang.pages import HostPages, PageView
from kvpool_client.integrations.sglang.shape import PageShape


def page_shape(config: Any, host: Any, model: str) -> PageShape:
    """The shape of the host pool's pages at this rank.

    Args:
        config: SGLang's ``HiCacheStorageConfig`` (the parallel position).
        host: the host KV pool SGLang registered.
        model: the model's name in the pool.

    Raises:
        UsageError: an MXFP8 pool (naming ``--kv-cache-dtype``), or a pool that is neither
            SGLang's MHA nor its MLA pool (naming its class).
    """
    check_supported(host)
    common = dict(
        model=model,
        dtype=str(host.dtype).removeprefix("torch."),
        host_layout=str(host.layout),
        layers=int(host.layer_num),
        page_size=int(host.page_size),
        tp_rank=config.tp_rank,
        tp_size=config.tp_size,
        pp_rank=config.pp_rank,
        pp_size=config.pp_size,
        cp_rank=config.attn_cp_rank,
        cp_size=config.attn_cp_size,
    )
    if isinstance(host, MLATokenToKVPoolHost):
        return PageShape(kind="mla", heads=1, head_dim=int(host.kv_cache_dim), **common)
    return PageShape(
        kind="mha", heads=int(host.head_num), head_dim=int(host.head_dim), v_head_dim=int(host.v_head_dim), **common
    )


def check_supported(host: Any) -> None:
    """Raises UsageError: ``host`` is a pool whose pages kvpool cannot store whole.

    Checked on the class alone, before any of the pool's state is read.
    """
    name = type(host).__name__
    if isinstance(host, MHATokenToKVPoolMXFP8Host):
        raise UsageError(
            f"kvpool does not store SGLang's MXFP8 host KV pool ({name}, from --kv-cache-dtype mxfp8): "
            "a page's UE8M0 scales lie outside its kv_buffer, so its pages cannot be stored whole; "
            "use another --kv-cache-dtype (auto, bf16, fp8_e4m3) with kvpool"
        )
    if not isinstance(host, MHATokenToKVPoolHost | MLATokenToKVPoolHost):
        raise UsageError(f"kvpool stores SGLang's MHA and MLA host KV pools, not {name}")


def is_asymmetric(host: Any) -> bool:
    """Whether K and V lie in two buffers (different head sizes): the pages move with ``interface_v1`` only."""
    return isinstance(host, AsymmetricMHATokenToKVPoolHost)


def host_pages(host: Any, shape: PageShape) -> HostPages:
    """The host pool's pages, each part the view SGLang defines for it (module docstring).

    Raises:
        UsageError: a layout whose pages SGLang cannot view or this backend cannot address.
    """
    buffers: tuple[torch.Tensor, ...]
    try:
        if is_asymmetric(host):
            buffers = (host.k_buffer, host.v_buffer)
            view = _split_page_view(host, buffers)
        else:
            buffers = (host.kv_buffer,)
            view = _data_page_view(host, shape)
        return HostPages(buffers, view, shape.page_size, int(host.size))
    except (ValueError, IndexError, RuntimeError, NotImplementedError) as exc:  # SGLang's or torch's refusals
        raise UsageError(f"host KV pool {type(host).__name__}, layout {shape.host_layout!r}: {exc}") from None


def _data_page_view(host: Any, shape: PageShape) -> PageView:
    """A page's parts as SGLang's ``get_data_page(start, flat=False)`` views them."""
    if shape.kind == "mla":

        def view(start: int) -> tuple[torch.Tensor, ...]:
            return (host.get_data_page(start, flat=False),)
    else:

        def view(start: int) -> tuple[torch.Tensor, ...]:
            return tuple(host.get_data_page(start, flat=False).unbind(0))  # K, V

    return view


def _split_page_view(host: Any, buffers: tuple[torch.Tensor, ...]) -> PageView:
    """A page's K and V as the byte spans SGLang's ``get_page_buffer_meta`` gives (K, then V)."""
    flat = tuple(b.view(-1).view(torch.uint8) for b in buffers)

    def view(start: int) -> tuple[torch.Tensor, ...]:
        pointers, sizes = host.get_page_buffer_meta(torch.arange(start, start + host.page_size))
        parts = []
        for data, buffer, pointer, size in zip(flat, buffers, pointers, sizes, strict=True):
            at = pointer - buffer.data_ptr()
            if not 0 <= at <= data.numel() - size:
                raise ValueError(f"SGLang's page at {start} lies outside its host buffer")
            parts.append(data[at : at + size])
        return tuple(parts)

    return view
