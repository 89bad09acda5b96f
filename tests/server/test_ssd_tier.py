"""The SSD tier on real segment files in tmp_path, at a capacity of a dozen records.

Every block is 1000 bytes, so one record takes ``REC`` bytes and a segment holds
exactly four. At the default capacity of four segments, appends stop at twelve
records (one segment stays free for compaction), so every eviction, every
compaction and every segment id can be asserted exactly. Each test ends with an
accounting check: every indexed key reads back its own bytes, the per-segment
live counts match the index, and the files never exceed the capacity.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import kvpool_server.tiers.segments as segments_module
import kvpool_server.tiers.ssd as ssd_module
from kvpool_server.eviction import LRUPolicy
from kvpool_server.index import StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import checksum
from kvpool_server.tiers.quotas import GroupQuotas, QuotaGroup
from kvpool_server.tiers.records import (
    HEADER_SIZE,
    RecordFlags,
    WalkResult,
    encode_record_header,
    walk_records,
)
from kvpool_server.tiers.segment_files import segment_name
from kvpool_server.tiers.segments import SegmentMissing
from kvpool_server.tiers.spans import RecordAddress
from kvpool_server.tiers.ssd import SsdConfig, SsdTier, record_size

NS = "m@fp16@tp0"
PAYLOAD = 1000
KiB = 1024


def k(i: int) -> StoreKey:
    return (NS, b"blk-%04d" % i)


REC = record_size(k(0), PAYLOAD)  # one block's record
TOMB = record_size(k(0), 0)  # one tombstone
SEG = 4 * REC


def data_for(i: int, length: int = PAYLOAD) -> bytes:
    return random.Random(i).randbytes(length)


class FakeClock:
    """Stands in for the ``time`` module inside ssd.py, so pauses pass without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class RecordingLRU(LRUPolicy):
    """LRU that remembers the key of every block it was told to remove, in order."""

    __slots__ = ("removed", "key_of")

    def __init__(self) -> None:
        super().__init__()
        self.removed: list[StoreKey] = []
        self.key_of: Callable[[int], StoreKey] | None = None  # the tier's, set once it exists

    def remove(self, block: int) -> None:
        assert self.key_of is not None, "the harness sets key_of"
        self.removed.append(self.key_of(block))
        super().remove(block)


@dataclass(frozen=True, slots=True)
class DiskRecord:
    segment_id: int
    key: StoreKey
    tombstone: bool


def records_on_disk(directory: str | Path) -> list[DiskRecord]:
    """Every well-formed record in the segment files, oldest first, read without opening a log."""
    found: list[DiskRecord] = []
    for path in sorted(Path(directory).glob("*.seg")):
        raw = path.read_bytes()
        walk = WalkResult()
        for record in walk_records(lambda offset, n, raw=raw: raw[offset : offset + n], len(raw), False, walk):
            key = (record.namespace.decode(), record.hash)
            tomb = bool(record.header.flags & RecordFlags.TOMBSTONE)
            found.append(DiskRecord(int(path.stem), key, tomb))
    return found


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ 0x40]))


class Harness:
    """One SSD tier on a directory, plus what a test needs to drive, reopen and audit it."""

    def __init__(
        self,
        directory: Path,
        capacity: int = 4 * SEG,
        segment: int = SEG,
        gc_live_ratio: float = 0.5,
        retry_after_error_s: float = 10.0,
        namespace_quota: int = 0,
        group_quotas: GroupQuotas | None = None,
    ) -> None:
        self.directory = directory
        self.group_quotas = group_quotas
        self.config = SsdConfig(
            str(directory),
            capacity,
            segment,
            fsync=False,
            gc_live_ratio=gc_live_ratio,
            retry_after_error_s=retry_after_error_s,
            namespace_quota=namespace_quota,
        )
        self.counters = Counters()
        self.policy = RecordingLRU()
        self.tier = self._open()
        self.peak_bytes = 0
        self._watch_appends()

    def _open(self) -> SsdTier:
        tier = SsdTier.__new__(SsdTier)
        self.policy.key_of = lambda block: tier._index.keys.key_of(block)  # the rebuild evicts too
        tier.__init__(self.config, self.counters, lambda: self.policy, self.group_quotas)  # type: ignore[misc]
        return tier

    def _watch_appends(self) -> None:
        """Record the bytes on disk after every append, compaction copies included."""
        log = self.tier._log
        append = log.append

        def watched(*args: object, **kwargs: object) -> RecordAddress:
            location = append(*args, **kwargs)  # type: ignore[arg-type]
            self.peak_bytes = max(self.peak_bytes, log.stats().bytes)
            return location

        log.append = watched  # type: ignore[method-assign]

    def put(self, i: int, length: int = PAYLOAD) -> bool:
        payload = data_for(i, length)
        return self.tier.write(k(i), memoryview(payload), checksum(payload))

    def get(self, i: int, length: int = PAYLOAD, touch: bool = True) -> bytes | None:
        target = bytearray(length)
        found = self.tier.read_into(k(i), memoryview(target), touch=touch)
        if found is None:
            return None
        assert found == checksum(target), f"{k(i)}: returned checksum {found:#x} is not the bytes'"
        return bytes(target)

    def delete(self, i: int) -> bool:
        found = self.tier.forget(k(i))
        self.tier.bury(k(i))
        return found

    def held(self) -> list[int]:
        """Indices of the stored keys of namespace NS, sorted."""
        return sorted(int(key[1][4:]) for key in self.tier.keys() if key[0] == NS)

    def evicted(self) -> list[int]:
        return [int(key[1][4:]) for key in self.policy.removed]

    def segments(self) -> list[int]:
        return self.tier._log.segment_ids()

    def segment_path(self, segment_id: int) -> Path:
        return self.directory / segment_name(segment_id)

    def location(self, i: int) -> RecordAddress:
        location = self.tier.location_of(k(i))
        assert location is not None, f"{k(i)} is not indexed"
        return location

    def reopen(self) -> None:
        """Close and open again on the same files, with fresh counters and policy."""
        self.tier.close()
        self.counters = Counters()
        self.policy = RecordingLRU()
        self.tier = self._open()
        self._watch_appends()

    def crash_reopen(self) -> SsdTier:
        """Open a second tier on the files without closing the first (as after SIGKILL)."""
        old = self.tier
        self.counters = Counters()
        self.policy = RecordingLRU()
        self.tier = self._open()
        self._watch_appends()
        return old

    def audit(self, lengths: Callable[[int], int] = lambda i: PAYLOAD) -> None:
        """Every key reads back its own bytes; the bookkeeping matches the index and the files."""
        tier = self.tier
        for i in self.held():
            got = self.get(i, lengths(i), touch=False)
            assert got == data_for(i, lengths(i)), f"{k(i)} read back {None if got is None else 'other bytes'}"
        live: dict[int, int] = {}
        keys = tier.keys()
        for key in keys:
            location = tier.location_of(key)
            assert location is not None, f"{key} listed but not indexed"
            live[location.segment_id] = live.get(location.segment_id, 0) + location.length
            _, block = tier._index.runs[location.segment_id].at(location.offset)
            assert block >= 0 and tier._index.keys.key_of(block) == key, f"{key} missing from its segment's records"
        assert sum(len(run.live()) for run in tier._index.runs.values()) == len(keys), "stale records in the runs"
        tracked = {s: n for s, n in tier._index.live.items() if n}
        assert tracked == live, f"live bytes per segment: tracked {tracked}, index says {live}"
        sizes = tier._log.segment_sizes()
        assert set(live) <= set(sizes), f"records in deleted segments: {set(live) - set(sizes)}"
        used = tier.usage().used_bytes
        assert used == sum(sizes.values()) == sum(p.stat().st_size for p in self.directory.glob("*.seg"))
        assert self.peak_bytes <= self.config.capacity, f"disk use peaked at {self.peak_bytes} > {self.config.capacity}"
        assert self.counters.get("ssd_corrupt_blocks") == 0, self.counters.snapshot()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def factory(**kwargs: object) -> Harness:
        harness = Harness(tmp_path / f"ssd-{len(made)}", **kwargs)  # type: ignore[arg-type]
        made.append(harness)
        return harness

    yield factory
    for harness in made:
        harness.tier.close()


@pytest.fixture
def h(make: Callable[..., Harness]) -> Harness:
    return make()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(ssd_module, "time", fake)
    return fake


def fill(h: Harness, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        assert h.put(i), f"write of {k(i)} refused; held {h.held()}, counters {h.counters.snapshot()}"


# -- writes and reads -----------------------------------------------------------------


def test_round_trip_returns_identical_bytes_for_any_length(h: Harness) -> None:
    lengths = {0: 1, 1: 999, 2: PAYLOAD, 3: 2048, 4: 4096 - REC + PAYLOAD}
    for i, length in lengths.items():
        assert h.put(i, length), f"write {i} of {length} bytes refused"
    for i, length in lengths.items():
        assert h.tier.length_of(k(i)) == length
        assert h.get(i, length) == data_for(i, length), f"block {i} came back with other bytes"
    assert h.tier.contains(k(0)) and not h.tier.contains(k(99))
    assert h.tier.usage().blocks == 5 and h.tier.usage().capacity_bytes == 4 * SEG, h.tier.usage()
    snapshot = h.counters.snapshot()
    assert (snapshot.get("ssd_demotions"), snapshot.get("ssd_hits"), snapshot.get("ssd_misses")) == (5, 5, None), (
        snapshot
    )
    h.audit(lambda i: lengths[i])


def test_a_key_already_stored_is_not_written_again(h: Harness) -> None:
    assert h.put(0)
    before = h.tier.usage()
    assert h.put(0) is False
    assert h.tier.usage() == before, (before, h.tier.usage())
    assert h.counters.get("ssd_demotions") == 1
    h.audit()


def test_miss_and_untouched_reads(h: Harness) -> None:
    fill(h, 2)
    assert h.get(7) is None
    assert h.get(0, touch=False) == data_for(0)
    assert h.counters.snapshot().get("ssd_misses") == 1 and "ssd_hits" not in h.counters.snapshot()
    assert h.tier.eviction_order() == [k(0), k(1)], "touch=False must not refresh recency"
    assert h.get(0) == data_for(0)
    assert h.tier.eviction_order() == [k(1), k(0)]
    assert h.counters.get("ssd_hits") == 1
    h.audit()


def test_target_of_another_length_is_a_miss_and_keeps_the_block(h: Harness) -> None:
    fill(h, 1)
    assert h.get(0, PAYLOAD + 1) is None and h.get(0, PAYLOAD - 1) is None
    assert h.tier.contains(k(0)), "a caller's wrong length must not drop a good block"
    assert h.get(0) == data_for(0)
    h.audit()


def test_bytes_changed_since_their_checksum_read_back_as_corrupt(h: Harness) -> None:
    payload = data_for(0)
    assert h.tier.write(k(0), memoryview(payload), checksum(payload) ^ 1)
    assert h.get(0) is None
    assert h.counters.get("ssd_corrupt_blocks") == 1 and not h.tier.contains(k(0)), h.counters.snapshot()


def test_records_larger_than_a_segment_are_refused(h: Harness) -> None:
    biggest = SEG - (REC - PAYLOAD)
    assert h.put(0, biggest + 1) is False
    assert h.put(1, biggest)
    assert h.get(1, biggest) == data_for(1, biggest)
    h.audit(lambda i: biggest)


def test_capacity_under_three_segments_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="three segments"):
        SsdTier(SsdConfig(str(tmp_path), 3 * SEG - 1, SEG, fsync=False), Counters())


def test_smallest_capacity_keeps_taking_writes(make: Callable[..., Harness]) -> None:
    h = make(capacity=3 * SEG)
    refused = [i for i in range(40) if not h.put(i)]
    assert refused == [], f"refused {refused}; segments {h.tier._log.segment_sizes()}"
    assert h.held()[-4:] == [36, 37, 38, 39], h.held()
    h.audit()


# -- eviction -------------------------------------------------------------------------


def test_eviction_order_is_lru_at_tiny_capacity(h: Harness) -> None:
    fill(h, 12)
    assert h.segments() == [1, 2, 3] and h.evicted() == [], (h.segments(), h.evicted())
    assert h.put(12)
    # Evict until segment 1 is under half live (3 of 4 gone), then compact it:
    # block 3 moves to the head, segment 1 goes.
    assert h.evicted() == [0, 1, 2], h.evicted()
    assert h.held() == list(range(3, 13)), h.held()
    assert h.segments() == [2, 3, 4] and h.location(3).segment_id == 4, h.tier._log.segment_sizes()
    snapshot = h.counters.snapshot()
    assert (snapshot["ssd_evictions"], snapshot["ssd_compactions"]) == (3, 1), snapshot
    h.audit()


def test_a_namespace_past_its_quota_evicts_its_own_oldest_records_only(make: Callable[..., Harness]) -> None:
    h = make(namespace_quota=3 * REC)
    other = [("other@u8", b"o-%04d" % i) for i in range(3)]  # records a little smaller than REC: 3 fit
    for key in other[:2]:
        assert h.tier.write(key, memoryview(data_for(99)), checksum(data_for(99)))
    fill(h, 5)  # NS may hold 3 records: 0 and 1 make room for 3 and 4, the other namespace is untouched
    assert h.held() == [2, 3, 4] and h.evicted() == [0, 1], (h.held(), h.evicted())
    for key in other[2:]:  # the other namespace stays within its own quota: nothing of NS goes
        assert h.tier.write(key, memoryview(data_for(99)), checksum(data_for(99)))
    assert h.held() == [2, 3, 4] and all(h.tier.contains(key) for key in other)
    snapshot = h.counters.snapshot()
    assert snapshot["ssd_quota_evictions"] == 2 and "ssd_quota_refusals" not in snapshot, snapshot
    assert not h.tier.write(k(50), memoryview(bytes(4 * REC)), 0)  # larger than the quota: refused
    assert h.counters.get("ssd_quota_refusals") == 1 and h.held() == [2, 3, 4]
    h.audit()


def test_a_group_quota_bounds_its_namespaces_together(make: Callable[..., Harness]) -> None:
    """A tenant's quota over the namespaces it writes: NS and a sibling share 3 records; a third is untouched."""
    group = QuotaGroup("tenant m", 3 * REC, lambda namespace: namespace.startswith("m@"))
    h = make(group_quotas=lambda namespace: [group] if group.covers(namespace) else [])
    sibling, other = ("m@bf16@tp0", b"s-0000"), ("x@u8", b"o-0000")
    for key in (sibling, other):
        assert h.tier.write(key, memoryview(data_for(99)), checksum(data_for(99)))
    fill(h, 3)  # the third record of the group makes the sibling's, its least recent, go
    assert not h.tier.contains(sibling) and h.held() == [0, 1, 2], h.held()
    fill(h, 1, start=3)  # then NS's own oldest
    assert h.held() == [1, 2, 3] and h.tier.contains(other), "a namespace outside the group is not its victim"
    assert h.counters.get("ssd_quota_evictions") == 2
    h.audit()


def test_reads_refresh_recency(h: Harness) -> None:
    fill(h, 12)
    assert h.get(0) == data_for(0) and h.get(1) == data_for(1)
    assert h.get(2, touch=False) == data_for(2)
    assert h.put(12)
    # 0 and 1 were read: 2..6 are the least recent; segment 2 (4..7) falls to one live block first.
    assert h.evicted() == [2, 3, 4, 5, 6], h.evicted()
    assert h.held() == [0, 1, 7, 8, 9, 10, 11, 12], h.held()
    assert h.segments() == [1, 3, 4] and h.location(7).segment_id == 4
    h.audit()


def test_eviction_order_continues_in_log_order_after_reopen(h: Harness) -> None:
    fill(h, 12)
    h.reopen()
    assert h.put(12)
    assert h.evicted() == [0, 1, 2], h.evicted()
    h.audit()


# -- compaction -----------------------------------------------------------------------


@pytest.mark.parametrize(("ratio", "compacted"), [(0.5, True), (0.2, False)])
def test_segments_under_the_live_ratio_are_compacted(
    make: Callable[..., Harness], ratio: float, compacted: bool
) -> None:
    h = make(gc_live_ratio=ratio)
    fill(h, 12)
    for i in (0, 1, 2):
        assert h.tier.forget(k(i))
    assert h.put(12)
    snapshot = h.counters.snapshot()
    if compacted:  # 1 of 4 live (0.25 < 0.5): moved, nothing evicted
        assert h.segments() == [2, 3, 4] and h.location(3).segment_id == 4, h.tier._log.segment_sizes()
        assert "ssd_evictions" not in snapshot and snapshot["ssd_compactions"] == 1, snapshot
        assert h.held() == list(range(3, 13)), h.held()
    else:  # 0.25 >= 0.2: evict 3 (segment 1 empty), then compact it
        assert h.evicted()[-1:] == [3] and snapshot["ssd_evictions"] == 1, (h.evicted(), snapshot)
        assert h.segments() == [2, 3, 4] and h.held() == list(range(4, 13)), (h.segments(), h.held())
    h.audit()


def test_long_run_stays_within_capacity_and_reads_back(make: Callable[..., Harness]) -> None:
    h = make(capacity=5 * SEG)
    rng = random.Random(7)
    lengths = {i: rng.choice((200, 600, PAYLOAD)) for i in range(150)}
    deleted: set[int] = set()
    for i in range(150):
        h.put(i, lengths[i])
        for j in rng.sample(h.held(), min(3, len(h.held()))):
            assert h.get(j, lengths[j]) == data_for(j, lengths[j]), f"after write {i}, {k(j)} read wrong"
        if i % 5 == 0 and h.held():
            victim = rng.choice(h.held())
            h.delete(victim)
            deleted.add(victim)
    assert h.counters.get("ssd_compactions") > 10, h.counters.snapshot()
    assert h.tier.usage().used_bytes <= 5 * SEG
    h.audit(lambda i: lengths[i])
    before = h.held()
    h.reopen()
    assert set(before) <= set(h.held()), f"lost on reopen: {sorted(set(before) - set(h.held()))}"
    assert deleted.isdisjoint(h.held()), f"deleted, back after reopen: {sorted(deleted & set(h.held()))}"
    h.audit(lambda i: lengths[i])


def test_read_racing_a_compaction_retries_at_the_new_location(h: Harness) -> None:
    fill(h, 12)
    for i in (0, 1, 2):
        h.tier.forget(k(i))
    log = h.tier._log
    real = log.read_into
    calls: list[int] = []

    def compact_first(location: RecordAddress, target: memoryview, key: StoreKey | None = None) -> None:
        calls.append(location.segment_id)
        if len(calls) == 1:
            assert h.put(12)  # compacts segment 1 under this read: it reads inline, once more
        real(location, target, key)

    log.read_into = compact_first  # type: ignore[method-assign]
    assert h.get(3) == data_for(3)
    assert calls == [1, 1, 4], f"reads went to segments {calls}"  # ours, the move's, our retry
    assert h.counters.get("ssd_hits") == 1 and "ssd_misses" not in h.counters.snapshot()
    log.read_into = real  # type: ignore[method-assign]
    h.audit()


def test_read_of_a_record_that_keeps_moving_gives_up_as_a_miss(h: Harness) -> None:
    fill(h, 1)
    log = h.tier._log

    def always_gone(location: RecordAddress, target: memoryview, key: StoreKey | None = None) -> None:
        raise SegmentMissing(location.segment_id)

    log.read_into = always_gone  # type: ignore[method-assign]
    assert h.get(0) is None
    assert h.counters.get("ssd_misses") == 1 and h.tier.contains(k(0))


# -- batched reads ------------------------------------------------------------------


def read_many(h: Harness, indices: list[int], touch: bool = True) -> list[bytes | None]:
    targets = [bytearray(PAYLOAD) for _ in indices]
    sums = h.tier.read_many([k(i) for i in indices], [memoryview(t) for t in targets], touch=touch)
    for i, found, target in zip(indices, sums, targets, strict=True):
        assert found is None or found == checksum(target), f"{k(i)}: returned checksum is not the bytes'"
    return [None if found is None else bytes(t) for found, t in zip(sums, targets, strict=True)]


def test_read_many_returns_each_block_in_the_callers_order(h: Harness) -> None:
    fill(h, 10)  # segments 1, 2, 3: records 0-3, 4-7, 8-9
    h.tier.forget(k(5))
    order = [9, 2, 5, 0, 7, 3, 11, 1]  # across segments, a deleted key, one never stored
    assert read_many(h, order) == [None if i in (5, 11) else data_for(i) for i in order]
    assert h.counters.get("ssd_hits") == 6 and h.counters.get("ssd_misses") == 2, h.counters.snapshot()
    h.audit()


def test_read_many_touches_tail_first_so_the_head_stays_longest(h: Harness) -> None:
    fill(h, 12)  # the budget: the next write evicts
    read_many(h, [4, 5, 6])  # a chain: 4 is its head
    assert h.put(12) and h.put(13) and h.put(14)
    assert h.evicted()[:3] == [0, 1, 2], h.evicted()
    assert h.put(15) and h.put(16) and h.put(17) and h.put(18) and h.put(19) and h.put(20) and h.put(21) and h.put(22)
    later = [i for i in h.evicted() if i in (4, 5, 6)]
    assert later == [6, 5, 4][: len(later)], f"the chain went {later}, not tail first"


def test_read_many_with_a_corrupt_record_mid_span_serves_the_others(h: Harness) -> None:
    fill(h, 4)  # one segment, back to back: a single span
    location = h.location(2)
    flip(h.segment_path(location.segment_id), location.offset + location.length - 10)  # a payload byte
    assert read_many(h, [0, 1, 2, 3]) == [data_for(0), data_for(1), None, data_for(3)]
    assert h.counters.get("ssd_corrupt_blocks") == 1 and not h.tier.contains(k(2))
    assert read_many(h, [0, 1, 3]) == [data_for(0), data_for(1), data_for(3)]


def test_read_many_of_the_same_key_twice_reads_it_twice(h: Harness) -> None:
    fill(h, 3)
    assert read_many(h, [1, 1, 2]) == [data_for(1), data_for(1), data_for(2)]


def test_read_many_racing_a_compaction_reads_each_record_at_its_new_place(h: Harness) -> None:
    fill(h, 12)
    for i in (0, 1, 2):
        h.tier.forget(k(i))
    log = h.tier._log
    real = log.read_span
    calls: list[int] = []

    def compact_first(
        locations: list[RecordAddress], targets: list[memoryview], keys: list[StoreKey | None]
    ) -> list[object]:
        calls.append(locations[0].segment_id)
        if len(calls) == 1:
            assert h.put(12)  # moves record 3 out of segment 1 and deletes the segment
        return real(locations, targets, keys)  # type: ignore[return-value]

    log.read_span = compact_first  # type: ignore[method-assign]
    assert read_many(h, [3, 4]) == [data_for(3), data_for(4)]
    log.read_span = real  # type: ignore[method-assign]
    assert h.counters.get("ssd_hits") == 2 and "ssd_misses" not in h.counters.snapshot()
    h.audit()


def test_read_many_counts_a_disk_error_as_misses(h: Harness) -> None:
    fill(h, 4)

    def broken(locations: list[RecordAddress], targets: list[memoryview], keys: list[StoreKey | None]) -> list[object]:
        raise OSError(errno.EIO, "I/O error")

    h.tier._log.read_span = broken  # type: ignore[method-assign]
    assert read_many(h, [0, 1]) == [None, None]
    assert h.counters.get("ssd_io_errors") == 1 and h.counters.get("ssd_misses") == 2
    assert h.tier.contains(k(0)), "a read error must not drop the record"


def test_read_many_of_scattered_records_hints_the_spans_after_the_first(h: Harness) -> None:
    fill(h, 8)
    hinted: list[list[RecordAddress]] = []
    h.tier._log.will_need = hinted.append  # type: ignore[method-assign]
    assert read_many(h, [3, 2, 1, 0]) == [data_for(i) for i in (3, 2, 1, 0)]
    assert hinted == [], "one back-to-back span needs no hint: the kernel reads ahead of it"
    assert read_many(h, [5, 0, 2, 3]) == [data_for(i) for i in (5, 0, 2, 3)]
    places = {h.location(i).offset: i for i in (0, 2, 5)}
    assert [[(places[loc.offset], loc.length) for loc in hint] for hint in hinted] == [[(2, 2 * REC), (5, REC)]]


def test_concurrent_reads_during_writes_never_see_wrong_bytes(make: Callable[..., Harness]) -> None:
    h = make(capacity=4 * SEG)
    fill(h, 10)
    stop = threading.Event()
    wrong: list[str] = []
    reads = [0]

    def reader() -> None:
        rng = random.Random(1)
        while not stop.is_set():
            i = rng.randrange(0, 60)
            try:
                got = h.get(i)
            except BaseException as exc:  # surfaced below
                wrong.append(f"{k(i)}: {exc!r}")
                return
            reads[0] += 1
            if got is not None and got != data_for(i):
                wrong.append(f"{k(i)} read other bytes")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(10, 60):
            h.put(i)
            h.get(i - 5)
    finally:
        stop.set()
        thread.join(10)
    assert wrong == [] and reads[0] > 0, (wrong, reads)
    assert h.counters.get("ssd_compactions") > 5, h.counters.snapshot()
    h.audit()


# -- tombstones -----------------------------------------------------------------------


def test_deleted_key_stays_gone_after_reopen(h: Harness) -> None:
    fill(h, 4)
    assert h.delete(1) is True and h.delete(1) is False
    assert h.get(1) is None and not h.tier.contains(k(1))
    h.reopen()
    assert h.held() == [0, 2, 3], h.held()
    assert h.counters.get("ssd_corrupt_blocks") == 0
    h.audit()


def test_forget_without_a_tombstone_is_not_durable(h: Harness) -> None:
    fill(h, 2)
    assert h.tier.forget(k(0))
    h.reopen()
    assert h.held() == [0, 1], "forget alone leaves the record: the caller buries it"
    assert h.tier.forget(k(0))
    h.tier.bury(k(0))  # the tombstone hides the record the index no longer knows
    h.reopen()
    assert h.held() == [1], h.held()
    h.audit()


def test_bury_of_a_key_stored_again_writes_nothing(h: Harness) -> None:
    fill(h, 1)
    h.tier.forget(k(0))
    assert h.put(0)
    before = h.tier.usage().used_bytes
    h.tier.bury(k(0))
    assert h.tier.usage().used_bytes == before
    h.reopen()
    assert h.held() == [0]
    h.audit()


def test_put_after_delete_wins_on_reopen(h: Harness) -> None:
    fill(h, 2)
    h.delete(0)
    assert h.put(0)
    h.reopen()
    assert h.held() == [0, 1] and h.get(0) == data_for(0)
    assert [(r.key, r.tombstone) for r in records_on_disk(h.directory)] == [
        (k(0), False),
        (k(1), False),
        (k(0), True),
        (k(0), False),
    ]
    h.audit()


def test_tombstone_is_copied_forward_while_older_records_remain(make: Callable[..., Harness]) -> None:
    h = make(capacity=6 * SEG)  # appends stop at 5 segments (20 records)
    fill(h, 8)  # segments 1 and 2
    h.delete(0)  # the tombstone opens segment 3; block 0's record stays in segment 1
    fill(h, 3, start=8)
    for i in (8, 9, 10):
        h.delete(i)  # segment 3: T0, 8, 9, 10, T8, T9, T10: only tombstones kept
    assert h.segments() == [1, 2, 3], h.tier._log.segment_sizes()
    fill(h, 9, start=11)  # 11..19: segment 3 is compacted on the last write
    assert 3 not in h.segments() and h.counters.get("ssd_compactions") == 1, h.tier._log.segment_sizes()
    moved = [r for r in records_on_disk(h.directory) if r.tombstone]
    assert sorted(r.key for r in moved) == [k(0), k(8), k(9), k(10)], moved
    assert all(r.segment_id > 3 for r in moved), moved
    assert "ssd_evictions" not in h.counters.snapshot(), h.counters.snapshot()
    h.reopen()
    assert 0 not in h.held() and {8, 9, 10}.isdisjoint(h.held()), h.held()
    assert any(r.key == k(0) and not r.tombstone for r in records_on_disk(h.directory)), "block 0's record left"
    h.audit()


def test_tombstone_in_the_oldest_segment_is_dropped(h: Harness) -> None:
    fill(h, 1)
    h.delete(0)  # segment 1: 0, T0
    fill(h, 10, start=1)  # 1, 2 close segment 1; 3..10 fill 2 and 3
    assert [r.segment_id for r in records_on_disk(h.directory) if r.tombstone] == [1]
    assert h.put(11)  # evict 1 (segment 1 keeps only 2 live), compact segment 1: T0 goes
    assert h.evicted()[-1] == 1 and h.segments() == [2, 3, 4], (h.evicted(), h.segments())
    assert [r for r in records_on_disk(h.directory) if r.key == k(0)] == [], "nothing of block 0 may remain"
    h.reopen()
    assert 0 not in h.held() and h.get(2) == data_for(2), h.held()
    h.audit()


def test_segments_of_tombstones_do_not_stall_writes(make: Callable[..., Harness]) -> None:
    h = make()
    fill(h, 4)  # segment 1: live, and the oldest
    for i in range(100, 300):
        h.delete(i)  # tombstones only, for keys never stored
    fill(h, 36, start=4)
    assert h.held()[-4:] == [36, 37, 38, 39], h.held()
    h.reopen()
    assert set(h.held()) <= set(range(40)) and h.held()[-4:] == [36, 37, 38, 39], h.held()
    h.audit()


def test_tombstone_of_a_key_stored_again_is_not_copied(h: Harness) -> None:
    fill(h, 5)  # segment 1: 0..3; segment 2: 4
    h.delete(4)
    fill(h, 2, start=4)  # segment 2: 4, T4, 4, 5
    fill(h, 4, start=6)  # segment 3
    h.tier.forget(k(5))  # segment 2 keeps block 4 and T4: under half
    assert h.put(10)
    assert h.segments() == [1, 3, 4] and h.location(4).segment_id == 4, h.tier._log.segment_sizes()
    assert [r for r in records_on_disk(h.directory) if r.tombstone] == [], "block 4 is stored: T4 hides nothing"
    h.reopen()
    assert 4 in h.held() and h.get(4) == data_for(4), h.held()
    h.audit()


# -- crash-style reopen ---------------------------------------------------------------


def test_reopen_without_close_rebuilds_the_index(h: Harness) -> None:
    fill(h, 10)
    h.delete(4)
    before = (h.held(), h.tier.usage())
    old = h.crash_reopen()
    try:
        assert (h.held(), h.tier.usage()) == before, ((h.held(), h.tier.usage()), before)
        assert h.tier.eviction_order() == [k(i) for i in range(10) if i != 4], "log order is the LRU order"
        h.audit()
    finally:
        old.close()


def index_state(tier: SsdTier) -> dict[str, object]:
    """Everything a rebuild decides, as plain values."""
    return {
        "order": tier.eviction_order(),
        "locations": {key: tier.location_of(key) for key in tier.keys()},
        "lengths": {key: tier.length_of(key) for key in tier.keys()},
        "namespaces": tier.namespace_usage(),
        "namespace_bytes": tier.namespace_bytes(),
        "live": {s: n for s, n in tier._index.live.items() if n},
        "runs": {
            s: [tier._index.keys.key_of(b) for b in run.live()] for s, run in tier._index.runs.items() if run.live()
        },
        "tombstones": {s: sorted(keys) for s, keys in tier._index.tombstones_in.items() if keys},
    }


@pytest.mark.parametrize("seed", range(4))
def test_bulk_rebuild_decides_what_a_record_by_record_replay_decides(
    make: Callable[..., Harness], seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = make(capacity=8 * SEG)
    rng = random.Random(seed)
    for _ in range(40):  # puts, overwrites after deletes, deletes and other namespaces, over several segments
        i = rng.randrange(12)
        if rng.random() < 0.3:
            h.delete(i)
        elif rng.random() < 0.2:
            h.tier.write(("other", b"key-%03d" % i), memoryview(data_for(i)), checksum(data_for(i)))
        else:
            h.put(i)
    h.reopen()
    bulk = index_state(h.tier)

    def collide(*args: object) -> object:
        raise ssd_module.DigestCollision("forced by the test")

    monkeypatch.setattr(ssd_module, "survivors", collide)
    h.reopen()
    assert index_state(h.tier) == bulk, f"record by record: {index_state(h.tier)}\nin bulk: {bulk}"
    h.audit()


@pytest.mark.parametrize("tail", ["half a record", "half a header", "zeros"])
def test_torn_tail_is_truncated(h: Harness, tail: str) -> None:
    fill(h, 5)  # segment 2 holds block 4 only
    path = h.segment_path(2)
    good_size = path.stat().st_size
    payload = data_for(99)
    header = encode_record_header(NS.encode(), k(99)[1], len(payload), checksum(payload))
    record = header + NS.encode() + k(99)[1] + payload
    torn = {
        "half a record": record[: len(record) // 2],
        "half a header": header[: HEADER_SIZE // 2],
        "zeros": bytes(3000),
    }[tail]
    with open(path, "ab") as file:
        file.write(torn)
    h.reopen()
    assert h.held() == [0, 1, 2, 3, 4] and path.stat().st_size == good_size, (h.held(), path.stat().st_size)
    assert h.counters.get("ssd_corrupt_blocks") == 0, "a torn tail is not corruption"
    assert h.put(5) and h.location(5) == RecordAddress(2, good_size, REC), h.location(5)
    h.reopen()
    assert h.held() == [0, 1, 2, 3, 4, 5]
    h.audit()


@pytest.mark.parametrize(
    ("region", "at"),
    [
        ("payload", HEADER_SIZE + len(k(0)[0]) + len(k(0)[1]) + 500),
        ("key", HEADER_SIZE + 3),
        ("header", 13),
    ],
)
def test_flipped_byte_is_a_counted_miss_never_wrong_bytes(h: Harness, region: str, at: int) -> None:
    fill(h, 6)  # segment 1 (sealed): 0..3; segment 2: 4, 5
    location = h.location(1)
    flip(h.segment_path(1), location.offset + at)
    assert h.get(1) is None, f"flipped {region} byte served"
    assert h.counters.get("ssd_corrupt_blocks") == 1 and not h.tier.contains(k(1)), h.counters.snapshot()
    assert [h.get(i) == data_for(i) for i in (0, 2, 3, 4, 5)] == [True] * 5
    h.reopen()
    held = h.held()
    if region == "payload":  # headers intact: indexed again, caught again on read
        assert held == [0, 1, 2, 3, 4, 5] and h.get(1) is None and h.counters.get("ssd_corrupt_blocks") == 1
    elif region == "key":  # skipped by the scan, counted
        assert held == [0, 2, 3, 4, 5] and h.counters.get("ssd_corrupt_blocks") == 1, (held, h.counters.snapshot())
    else:  # lengths untrusted: the rest of segment 1 is unreachable, counted once
        assert held == [0, 4, 5] and h.counters.get("ssd_corrupt_blocks") == 1, (held, h.counters.snapshot())
    for i in held:
        assert h.get(i) in (None, data_for(i)), f"{k(i)} served wrong bytes"
    assert h.put(20) and h.get(20) == data_for(20)


def test_flipped_header_in_the_active_segment_starts_a_new_one(h: Harness) -> None:
    fill(h, 6)  # segment 2 (active): 4, 5
    flip(h.segment_path(2), h.location(5).offset + 2)
    h.reopen()
    assert h.held() == [0, 1, 2, 3, 4] and h.counters.get("ssd_corrupt_blocks") == 1, h.held()
    assert h.put(6) and h.location(6).segment_id == 3, h.tier._log.segment_sizes()
    h.reopen()
    assert h.held() == [0, 1, 2, 3, 4, 6] and h.counters.get("ssd_corrupt_blocks") == 1
    assert h.get(6) == data_for(6)


# -- disk errors ----------------------------------------------------------------------


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_write_error_pauses_then_clears(h: Harness, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(h, 3)
    real = segments_module.pwritev_all
    failing = [True]

    def full_disk(fd: int, buffers: list[memoryview], offset: int) -> None:
        if failing[0]:
            os.pwrite(fd, bytes(buffers[0][:10]), offset)  # a partial record, as a real disk leaves
            raise _enospc()
        real(fd, buffers, offset)

    monkeypatch.setattr(segments_module, "pwritev_all", full_disk)
    assert h.put(3) is False
    assert h.tier.failure() == "ENOSPC: No space left on device", h.tier.failure()
    assert h.counters.get("ssd_io_errors") == 1
    failing[0] = False
    assert h.put(4) is False and h.counters.get("ssd_io_errors") == 1, "paused: no write may be tried"
    clock.now += 9.9
    assert h.tier.failure() is not None
    clock.now += 0.2
    assert h.tier.failure() is None
    assert h.put(4) and h.held() == [0, 1, 2, 4], h.held()
    h.reopen()
    assert h.held() == [0, 1, 2, 4], h.held()
    h.audit()


def test_write_error_during_compaction_keeps_the_segment(
    h: Harness, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(h, 12)
    for i in (0, 1, 2):
        h.tier.forget(k(i))
    real = segments_module.pwritev_all
    failing = [True]

    def full_disk(fd: int, buffers: list[memoryview], offset: int) -> None:
        if failing[0]:
            raise _enospc()
        real(fd, buffers, offset)

    monkeypatch.setattr(segments_module, "pwritev_all", full_disk)
    assert h.put(12) is False  # the move of block 3 fails: segment 1 must stay
    assert h.segments()[:3] == [1, 2, 3] and h.held() == list(range(3, 12)), (h.segments(), h.held())
    assert h.tier.failure() is not None and h.get(3) == data_for(3)
    assert "ssd_compactions" not in h.counters.snapshot()
    failing[0] = False
    clock.now += 11
    assert h.put(12) and h.segments() == [2, 3, 4], h.segments()
    h.audit()


def _mount_tmpfs(directory: Path, size: int) -> None:
    """Mount a tmpfs of ``size`` bytes at ``directory``; skip the test (saying why) if not allowed."""
    if os.geteuid() != 0:
        pytest.skip("a real ENOSPC needs a tmpfs mount, and mounting needs root")
    directory.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted by the test: writes past it fail with a real ENOSPC."""
    mount = tmp_path / "disk"
    _mount_tmpfs(mount, 64 * KiB)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def ballast(directory: Path, leave: int) -> Path:
    """Fill the file system at ``directory`` until ``leave`` bytes stay free."""
    stat = os.statvfs(directory)
    path = directory / "ballast"
    with open(path, "wb") as file:
        file.write(bytes(max(0, stat.f_bavail * stat.f_frsize - leave)))
    return path


def test_full_disk_is_reported_and_loses_nothing(tiny_disk: Path, clock: FakeClock) -> None:
    directory = tiny_disk / "ssd"
    h = Harness(directory, capacity=64 * SEG)  # the configured capacity far exceeds the disk
    try:
        extra = ballast(tiny_disk, 16 * KiB)
        written = [i for i in range(40) if h.put(i)]
        assert 8 <= len(written) < 40 and written == list(range(len(written))), written
        assert h.tier.failure() == "ENOSPC: No space left on device", h.tier.failure()
        assert h.counters.get("ssd_io_errors") == 1, h.counters.snapshot()
        assert h.held() == written
        for i in written:
            assert h.get(i) == data_for(i), f"{k(i)} lost or wrong after ENOSPC"
        extra.unlink()
        assert h.put(100) is False, "still paused"
        clock.now += 10
        assert h.tier.failure() is None and h.put(100), h.counters.snapshot()
        h.reopen()
        assert h.held() == [*written, 100], h.held()
        h.audit()
    finally:
        h.tier.close()


def test_full_disk_during_compaction_loses_nothing(tiny_disk: Path, clock: FakeClock) -> None:
    directory = tiny_disk / "ssd"
    h = Harness(directory)
    try:
        fill(h, 12)
        for i in (0, 1, 2):
            h.tier.forget(k(i))
        extra = ballast(tiny_disk, 0)
        assert h.put(12) is False  # block 3's copy needs a new segment: ENOSPC
        assert h.tier.failure() is not None and h.segments()[:3] == [1, 2, 3], (h.tier.failure(), h.segments())
        assert h.held() == list(range(3, 12)) and h.get(3) == data_for(3), h.held()
        extra.unlink()
        clock.now += 10
        assert h.put(12) and h.segments() == [2, 3, 4], h.segments()
        h.audit()
    finally:
        h.tier.close()


# -- the tier against a model ---------------------------------------------------------

KEYS = 14


def model_length(i: int) -> int:
    return 100 + (i * 389) % 1400  # 100..1499 bytes: records of many sizes


class SsdMachine(RuleBasedStateMachine):
    """An SsdTier beside a dict of what may be stored.

    The same key always carries the same bytes (blocks are content-addressed). A
    key not deleted since its last write may be absent (evicted), never wrong;
    a deleted key is absent until written again, across reopens too.
    """

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="kvpool-ssd-machine-")
        self.h = Harness(Path(self.root) / "ssd", capacity=4 * 2 * KiB, segment=2 * KiB)
        self.model: set[int] = set()  # written and not deleted since

    def teardown(self) -> None:
        self.h.tier.close()
        shutil.rmtree(self.root)

    @rule(i=st.integers(0, KEYS - 1))
    def write(self, i: int) -> None:
        stored = self.h.put(i, model_length(i))
        assert not stored or self.h.tier.contains(k(i)), f"{k(i)} written but not indexed"
        if self.h.tier.contains(k(i)):
            self.model.add(i)

    @rule(i=st.integers(0, KEYS - 1), touch=st.booleans())
    def read(self, i: int, touch: bool) -> None:
        got = self.h.get(i, model_length(i), touch=touch)
        assert got is None or got == data_for(i, model_length(i)), f"{k(i)} read other bytes"
        if i not in self.model:
            assert got is None, f"deleted {k(i)} was served"

    @rule(indices=st.lists(st.integers(0, KEYS - 1), max_size=8), touch=st.booleans())
    def read_many(self, indices: list[int], touch: bool) -> None:
        targets = [bytearray(model_length(i)) for i in indices]
        sums = self.h.tier.read_many([k(i) for i in indices], [memoryview(t) for t in targets], touch=touch)
        for i, found, target in zip(indices, sums, targets, strict=True):
            assert found is None or (target == data_for(i, model_length(i)) and found == checksum(target)), (
                f"{k(i)} read other bytes in a batch"
            )
            if i not in self.model:
                assert found is None, f"deleted {k(i)} was served in a batch"

    @rule(i=st.integers(0, KEYS - 1))
    def delete(self, i: int) -> None:
        self.h.delete(i)
        self.model.discard(i)

    @rule()
    def reopen(self) -> None:
        before = set(self.h.held())
        self.h.reopen()
        after = set(self.h.held())
        assert before <= after, f"reopen lost {sorted(before - after)}"

    @invariant()
    def consistent(self) -> None:
        held = set(self.h.held())
        assert held <= self.model, f"stored but deleted: {sorted(held - self.model)}"
        self.h.audit(model_length)


SsdMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None, derandomize=True)
TestSsdMachine = SsdMachine.TestCase
