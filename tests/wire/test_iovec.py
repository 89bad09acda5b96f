"""Scatter/gather buffer lists: dropping what a socket call sent or filled."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvpool_client.core.channels.iovec import advance


@given(data=st.data(), sizes=st.lists(st.integers(1, 16), max_size=8))
def test_advance_leaves_exactly_the_bytes_not_yet_moved(data: st.DataObject, sizes: list[int]) -> None:
    whole = bytearray(range(sum(sizes)))
    views, start = [], 0
    for size in sizes:
        views.append(memoryview(whole)[start : start + size])
        start += size
    moved = data.draw(st.integers(0, len(whole)), label="moved")
    rest = advance(views, moved)
    assert b"".join(bytes(v) for v in rest) == bytes(whole[moved:]), f"moved {moved} of {sizes}: {rest}"
    assert all(len(v) for v in rest), f"an empty buffer is left: {[len(v) for v in rest]}"
    if rest:  # the rest are views of the caller's memory, not copies
        whole[-1] = 0xFF
        assert rest[-1][-1] == 0xFF, "advance copied a buffer"
