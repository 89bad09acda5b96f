"""The ucx transport's framing (pure) and transport negotiation, without UCX."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool_client.core.channels.ucx_frames import (
    INLINE_LIMIT,
    MAX_SEGMENTS,
    Unit,
    decode_head,
    decode_hello,
    encode_head,
    encode_hello,
    fit_segments,
    plan_units,
)
from kvpool_client.core.config import ClientConfig
from kvpool_client.core.control import NodeInfo
from kvpool_client.core.errors import ProtocolError
from kvpool_client.core.routing import Member
from kvpool_client.core.wire import WireLimits
from kvpool_client.nodes import NodeHandle
from kvpool_client.transport import ucx
from kvpool_client.transport.nixl import LocalAgent

KiB, MiB = 1 << 10, 1 << 20


def test_a_frame_head_goes_inline_and_each_block_is_a_segment() -> None:
    assert plan_units([40, 512 * KiB, 512 * KiB]) == [Unit(range(1), range(1, 3))]


def test_small_leading_blocks_are_inlined_up_to_the_limit() -> None:
    units = plan_units([40, 4 * KiB, 4 * KiB, 4 * KiB, 4 * KiB, 4 * KiB])
    assert units == [Unit(range(4), range(4, 6))]  # 40 + 3 * 4 KiB fits in 16 KiB, a fourth does not
    assert sum([40, 4 * KiB, 4 * KiB, 4 * KiB]) <= INLINE_LIMIT


def test_a_big_first_buffer_leaves_the_head_empty() -> None:
    assert plan_units([INLINE_LIMIT + 1]) == [Unit(range(0), range(1))]


def test_too_many_segments_start_more_units() -> None:
    lengths = [40] + [INLINE_LIMIT] * (MAX_SEGMENTS + 2)
    units = plan_units(lengths)
    assert units[0].inline == range(1)  # a buffer of the whole limit does not fit beside the 40 bytes
    assert [len(u.segments) for u in units] == [MAX_SEGMENTS, 2]
    assert units[1].inline == range(units[0].segments.stop, units[0].segments.stop)


@given(st.lists(st.integers(1, 64 * KiB), max_size=40))
def test_units_cover_every_buffer_once_in_order(lengths: list[int]) -> None:
    order = [i for unit in plan_units(lengths) for i in (*unit.inline, *unit.segments)]
    assert order == list(range(len(lengths)))


@given(st.binary(max_size=300), st.lists(st.integers(1, 1 << 40), max_size=20))
def test_heads_round_trip(inline: bytes, sizes: list[int]) -> None:
    got_inline, got_sizes = decode_head(encode_head([inline[:100], inline[100:]], sizes), max_segment=1 << 40)
    assert bytes(got_inline) == inline and got_sizes == sizes


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x00" * 7, encode_head([b"abc"], [5])[:-1], encode_head([b"abc"], [5]) + b"x", encode_head([], [0])],
)
def test_malformed_heads_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_head(raw, max_segment=MiB)


def test_a_segment_over_the_limit_is_refused_before_anything_is_allocated() -> None:
    with pytest.raises(ProtocolError, match="out of range"):
        decode_head(encode_head([], [MiB + 1]), max_segment=MiB)


def test_segments_that_fit_their_targets_are_received_in_place() -> None:
    a, b = memoryview(bytearray(8)), memoryview(bytearray(8))
    segments = deque([4, 4, 8])
    slices, rest = fit_segments(segments, [a, b])
    assert [len(s) for s in slices] == [4, 4, 8] and rest == [] and not segments
    assert slices[0].obj is a.obj and slices[2].obj is b.obj  # views of the caller's buffers, no copy


def test_a_segment_larger_than_the_target_left_stops_the_fit() -> None:
    target = memoryview(bytearray(10))
    segments = deque([6, 6])
    slices, rest = fit_segments(segments, [target])
    assert [len(s) for s in slices] == [6] and [len(r) for r in rest] == [4] and list(segments) == [6]


def test_hello_round_trips_and_refuses_strangers() -> None:
    assert decode_hello(encode_hello(0xABC0)) == 0xABC0
    with pytest.raises(ProtocolError):
        decode_hello(b"HTTP/1.1 200 OK\r\n"[:16])


# -- negotiation ---------------------------------------------------------------------------------


def record(transport: str, endpoints: dict[str, str]) -> NodeHandle[object]:
    node: NodeHandle[object] = NodeHandle(
        Member("n1", "127.0.0.1:1"), ClientConfig(nodes=("127.0.0.1:1",), transport=transport), LocalAgent(1.0)
    )
    node._info = NodeInfo("127.0.0.1:1", "n1", endpoints, WireLimits(), 1)
    return node


ALL = {"tcp": "127.0.0.1:2", "ucx": "127.0.0.1:3"}


def test_auto_takes_ucx_when_the_node_offers_it_and_falls_back_after_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ucx, "import_error", lambda: None)
    node = record("auto", ALL)
    assert node.transport() == "ucx" and node.ucx_address() == "127.0.0.1:3"
    node.ucx_failed(ucx.UcxUnavailable("refused"))
    assert node.transport() == "tcp"
    node.reset_transport()
    assert node.transport() == "ucx"


def test_auto_uses_tcp_without_ucxx_or_without_a_ucx_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ucx, "import_error", lambda: "ImportError: no ucxx")
    assert record("auto", ALL).transport() == "tcp"
    monkeypatch.setattr(ucx, "import_error", lambda: None)
    assert record("auto", {"tcp": "127.0.0.1:2"}).transport() == "tcp"


def test_required_ucx_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ucx, "import_error", lambda: None)
    with pytest.raises(ucx.UcxUnavailable, match="offers no ucx"):
        record("ucx", {"tcp": "127.0.0.1:2"}).ucx_address()
    node = record("ucx", ALL)
    with pytest.raises(ucx.UcxUnavailable, match="refused"):
        node.ucx_failed(ucx.UcxUnavailable("refused"))
    monkeypatch.setattr(ucx, "import_error", lambda: "ImportError: no ucxx")
    with pytest.raises(ucx.UcxUnavailable, match="kvpool\\[ucx\\]"):
        record("ucx", ALL).ucx_address()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_tcp_and_shm_never_dial_ucx(monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    monkeypatch.setattr(ucx, "import_error", lambda: None)
    assert record(transport, ALL).ucx_address() is None
