"""The paged KV cache: a fixed number of pages, the engine's scarce "VRAM".

One tensor ``[pages, *block_shape]`` where a page holds the K and V of
``block_size`` consecutive tokens for every layer, laid out as its
:class:`~kvpool_client.integrations.namespaces.KVLayout` says (``LKHTD``: layers x K/V x
kv heads x tokens x head_dim). A page is contiguous, so the pool reads into and writes from
it with no copy. Which page holds what is the prefix cache's business, not this
module's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kvpool_client.integrations.namespaces import KVLayout

if TYPE_CHECKING:
    from bench.engine.model import SeqBatch


@dataclass(frozen=True, slots=True)
class StepSlots:
    """Where this step's new tokens go: page and in-page slot per token, and each sequence's page table."""

    page: torch.Tensor  # int64 [n]
    slot: torch.Tensor  # int64 [n]
    tables: tuple[torch.Tensor, ...]  # one int64 page table per sequence


class PagedKVCache:
    """``num_pages`` pages of KV in ``layout`` (its dims must be ordered ``LKHTD``).

    Args:
        layout: the block layout (the namespace's layout field).
        num_pages: the budget of pages.
    Raises:
        ValueError: the layout's order is not ``LKHTD`` or its dtype is not a torch dtype.
    """

    def __init__(self, layout: KVLayout, num_pages: int) -> None:
        if layout.order != "LKHTD":
            raise ValueError(f"the engine's attention reads LKHTD pages, not {layout.order}")
        self.layout = layout
        self.num_pages = num_pages
        self.data = torch.zeros(num_pages, *layout.block_shape, dtype=layout.torch_dtype())

    @property
    def page_bytes(self) -> int:
        return self.layout.block_nbytes

    def page(self, page_id: int) -> torch.Tensor:
        """Page ``page_id`` as a contiguous ``block_shape`` view (no copy)."""
        return self.data[page_id]

    def slot_mapping(self, seqs: Sequence[SeqBatch], positions: torch.Tensor) -> StepSlots:
        """Page and slot of every new token of a ragged batch, and each sequence's page table."""
        block = self.layout.block_size
        tables = tuple(torch.tensor(list(s.pages), dtype=torch.int64) for s in seqs)
        pages = [t[positions[s.start : s.start + s.length] // block] for s, t in zip(seqs, tables, strict=True)]
        page = torch.cat(pages) if pages else torch.empty(0, dtype=torch.int64)
        return StepSlots(page, positions % block, tables)

    def write(self, layer: int, slots: StepSlots, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K and V ``[n, kv_heads, head_dim]`` of this step's tokens for ``layer``."""
        self.data[slots.page, layer, 0, :, slots.slot] = k
        self.data[slots.page, layer, 1, :, slots.slot] = v

    def gather(self, layer: int, table: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the first ``context`` positions of one sequence: two ``[kv_heads, context, head_dim]``."""
        kv = self.data[table, layer]  # [pages, 2, heads, block, head_dim]
        kv = kv.permute(1, 2, 0, 3, 4).reshape(2, kv.shape[2], -1, kv.shape[4])[:, :, :context]
        return kv[0], kv[1]
