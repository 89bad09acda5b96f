"""SGLang host pages as pool blocks: each part's target holds exactly SGLang's view of it, in place.

The host buffers here are laid out as SGLang 0.5.23's MHA host pool lays out ``layer_first``
(``[2, layers, tokens, heads, dim]``) and ``page_first`` (``[2, tokens, layers, heads, dim]``);
tests/engines/sglang runs the same against SGLang's own pools.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_client.buffers import Regions, spans
from kvpool_client.core.errors import UsageError
from kvpool_client.integrations.sglang.pages import HostPages, PageView

PAGE, HEADS, DIM = 4, 2, 8


def host_pool(layout: str, layers: int, pages: int) -> tuple[torch.Tensor, PageView]:
    """A bf16 host buffer and SGLang's view of a page's K and V in ``layout``."""
    tokens = pages * PAGE
    if layout == "layer_first":
        buffer = torch.zeros(2, layers, tokens, HEADS, DIM, dtype=torch.bfloat16)

        def view(start: int) -> Sequence[torch.Tensor]:
            return buffer[:, :, start : start + PAGE].unbind(0)
    else:
        buffer = torch.zeros(2, tokens, layers, HEADS, DIM, dtype=torch.bfloat16)

        def view(start: int) -> Sequence[torch.Tensor]:
            return buffer[:, start : start + PAGE].unbind(0)

    return buffer, view


@settings(max_examples=40, deadline=None)
@given(layout=st.sampled_from(["layer_first", "page_first"]), layers=st.integers(1, 4), data=st.data())
def test_a_parts_target_is_sglangs_view_of_it_in_place(layout: str, layers: int, data: st.DataObject) -> None:
    buffer, view = host_pool(layout, layers, pages=5)
    pages = HostPages([buffer], view, PAGE, 5 * PAGE)
    assert (
        pages.dense == (layout == "page_first" or layers == 1)
        and pages.part_nbytes == (layers * PAGE * HEADS * DIM * 2,) * 2
    )
    starts = data.draw(st.lists(st.sampled_from(range(0, 5 * PAGE, PAGE)), min_size=1, max_size=3, unique=True))
    targets = pages.blocks(starts)
    assert len(targets) == 2 * len(starts)
    for index, target in enumerate(targets):
        assert isinstance(target, Regions) != pages.dense
        written = data.draw(st.binary(min_size=len(target), max_size=len(target)))
        at = 0
        for span in spans(target):  # what a get does: fill the spans in order
            span[:] = written[at : at + len(span)]
            at += len(span)
        part = view(starts[index // 2])[index % 2]
        assert part.contiguous().view(torch.uint8).numpy().tobytes() == written, "not SGLang's bytes of the part"
    touched = sum(len(t) for t in targets)
    assert int((buffer.view(torch.uint8) != 0).sum()) <= touched, "bytes outside the pages' parts changed"


def test_pages_that_are_not_evenly_spaced_are_refused() -> None:
    buffer, view = host_pool("page_first", 2, pages=4)

    def uneven(start: int) -> Sequence[torch.Tensor]:
        return view(start if start < 3 * PAGE else 2 * PAGE)

    with pytest.raises(UsageError, match="not where its layout predicts"):
        HostPages([buffer], uneven, PAGE, 4 * PAGE)
    with pytest.raises(UsageError, match="not a view of its host buffers"):
        HostPages([torch.zeros(8)], view, PAGE, 4 * PAGE)
