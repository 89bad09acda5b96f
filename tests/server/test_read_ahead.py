"""ReadAheadPlanner (pure) and the SSD tier's log positions it works on (real segment files)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool_server.index import StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.read_streams import ReadAheadPlanner, Stretch
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


def test_a_read_ending_where_the_last_started_reads_a_window_below_it() -> None:
    planner = ReadAheadPlanner(WINDOW)
    planner.observe(Stretch(5000, 5300))
    assert planner.observe(Stretch(4700, 5000)) == Stretch(3700, 4700, backward=True)
    assert planner.observe(Stretch(4400, 4700)) is None, "700 bytes still ahead below"
    assert planner.observe(Stretch(4100, 4400)) == Stretch(3100, 4100, backward=True), "only 400 left"


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


@given(st.lists(st.integers(1, 700), min_size=1, max_size=60), st.booleans())
def test_a_sequential_reader_is_always_read_ahead_of(sizes: list[int], backward: bool) -> None:
    """Read-ahead starts at the reader, runs in its direction, and keeps more than half
    a window ahead of it after every read but the first."""
    planner = ReadAheadPlanner(WINDOW)
    step = -1 if backward else 1
    position = ahead_end = 100_000
    for n, size in enumerate(sizes):
        read = Stretch(position - size, position) if backward else Stretch(position, position + size)
        ahead = planner.observe(read)
        position += step * size
        if ahead is not None:
            assert n > 0, "the first read planned a read-ahead"
            expected = Stretch(position - WINDOW, position, True) if backward else Stretch(position, position + WINDOW)
            assert ahead == expected, (ahead, position)
            ahead_end = ahead.start if backward else ahead.end
        if n > 0:
            assert step * (ahead_end - position) > WINDOW // 2, (ahead_end, position)


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
    end = stretch_of(tier, 5).end
    assert tier.keys_before(Stretch(end - 3 * RECORD, end, True)) == [k(5)]


def test_keys_before_walk_down_into_the_segment_before(tier: SsdTier) -> None:
    end = stretch_of(tier, 4).end
    assert tier.keys_before(Stretch(end - 1, end, True)) == [k(4)], "the record holding the start is in"
    assert tier.keys_before(Stretch(end - 3 * RECORD, end, True)) == [k(4), k(3), k(2)]
    assert tier.keys_before(Stretch(0, end, True)) == [k(i) for i in (4, 3, 2, 1, 0)], "stops at the log's start"
    assert tier.keys_before(Stretch(end - RECORD, end - 1, True)) == [], "not where a record ends"
