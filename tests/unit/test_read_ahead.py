"""ReadAheadPlanner (pure) and the SSD tier's log positions it works on (real segment files)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool_server.index import StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.readahead import ReadAheadPlanner, Stretch
from kvpool_server.tiers.ssd import SEGMENT_STRIDE, SsdConfig, SsdTier, record_size

WINDOW = 1000


def test_one_read_is_not_a_stream() -> None:
    planner = ReadAheadPlanner(WINDOW)
    assert planner.observe(Stretch(0, 300)) is None


def test_a_read_where_the_last_ended_reads_a_window_ahead_of_it() -> None:
    planner = ReadAheadPlanner(WINDOW)
    planner.observe(Stretch(0, 300))
    assert planner.observe(Stretch(300, 600)) == Stretch(600, 1600)


def test_a_read_elsewhere_reads_nothing_ahead() -> None:
    planner = ReadAheadPlanner(WINDOW)
    planner.observe(Stretch(0, 300))
    assert planner.observe(Stretch(301, 600)) is None, "a gap is not sequential"
    assert planner.observe(Stretch(0, 300)) is None, "a re-read is not sequential"


def test_refills_only_once_less_than_half_a_window_is_left() -> None:
    planner = ReadAheadPlanner(WINDOW)
    planner.observe(Stretch(0, 100))
    assert planner.observe(Stretch(100, 200)) == Stretch(200, 1200)
    assert planner.observe(Stretch(200, 600)) is None, "600 bytes still ahead"
    assert planner.observe(Stretch(600, 800)) == Stretch(800, 1800), "only 400 left"


def test_interleaved_streams_are_followed_each() -> None:
    planner = ReadAheadPlanner(WINDOW)
    a, b = 0, 10 * SEGMENT_STRIDE
    planner.observe(Stretch(a, a + 100))
    planner.observe(Stretch(b, b + 100))
    assert planner.observe(Stretch(a + 100, a + 200)) == Stretch(a + 200, a + 1200)
    assert planner.observe(Stretch(b + 100, b + 200)) == Stretch(b + 200, b + 1200)


def test_the_least_recent_stream_is_forgotten_past_the_limit() -> None:
    planner = ReadAheadPlanner(WINDOW, max_streams=2)
    for start in (0, 10_000, 20_000):
        planner.observe(Stretch(start, start + 100))
    assert planner.observe(Stretch(100, 200)) is None, "the oldest stream should be forgotten"
    assert planner.observe(Stretch(20_100, 20_200)) is not None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        ReadAheadPlanner(0)


@given(st.lists(st.integers(1, 700), min_size=1, max_size=60))
def test_a_sequential_reader_is_always_read_ahead_of(sizes: list[int]) -> None:
    """Read-ahead starts at the reader, never runs more than a window ahead of it, and
    keeps more than half a window ahead after every read but the first."""
    planner = ReadAheadPlanner(WINDOW)
    position, ahead_end = 0, 0
    for n, size in enumerate(sizes):
        ahead = planner.observe(Stretch(position, position + size))
        position += size
        if ahead is not None:
            assert n > 0, "the first read planned a read-ahead"
            assert ahead == Stretch(position, position + WINDOW), (ahead, position)
            ahead_end = ahead.end
        if n > 0:
            assert ahead_end - position > WINDOW // 2, (ahead_end, position)


# -- SSD tier: log positions ----------------------------------------------------------

NS = "m@fp16@tp0"
PAYLOAD = 512


def k(i: int) -> StoreKey:
    return (NS, b"blk-%04d" % i)


RECORD = record_size(k(0), PAYLOAD)


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[SsdTier]:
    tier = SsdTier(SsdConfig(str(tmp_path), 8 * 3 * RECORD, 3 * RECORD, fsync=False), Counters())
    for i in range(7):  # three per segment: segments 1, 2 and (active) 3
        assert tier.write(k(i), memoryview(bytes([i]) * PAYLOAD), 0)
    yield tier
    tier.close()


def stretch_of(tier: SsdTier, i: int) -> Stretch:
    location = tier.location_of(k(i))
    assert location is not None
    return tier.log_range(location)


def test_a_sealed_segment_ends_where_the_next_begins(tier: SsdTier) -> None:
    assert [tier.location_of(k(i)).segment_id for i in range(7)] == [1, 1, 1, 2, 2, 2, 3]  # type: ignore[union-attr]
    assert stretch_of(tier, 1) == Stretch(SEGMENT_STRIDE + RECORD, SEGMENT_STRIDE + 2 * RECORD)
    assert stretch_of(tier, 2).end == stretch_of(tier, 3).start == 2 * SEGMENT_STRIDE
    assert stretch_of(tier, 6).end == 3 * SEGMENT_STRIDE + RECORD, "the active segment may still grow"


def test_keys_between_walk_one_segment_in_log_order(tier: SsdTier) -> None:
    start = stretch_of(tier, 0).start
    assert tier.keys_between(Stretch(start, start + 1)) == [k(0)], "the record holding the end is in"
    assert tier.keys_between(Stretch(start, start + 10 * RECORD)) == [k(0), k(1), k(2)], "stops at the segment's end"
    assert tier.keys_between(Stretch(start + 1, start + RECORD)) == [], "not where a record starts"


def test_keys_between_stop_at_a_dead_record(tier: SsdTier) -> None:
    assert tier.forget(k(4))
    start = stretch_of(tier, 3).start
    assert tier.keys_between(Stretch(start, start + 3 * RECORD)) == [k(3)]
