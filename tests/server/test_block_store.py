"""BlockStore (DRAM in front of SSD) and its Demoter, on a real arena file and real segments.

DRAM is 64 KiB of 4 KiB blocks: sixteen slots, evicted in LRU order. SSD holds 32
such blocks. Each test ends with a leak check: once every held block is released
and every key deleted, the DRAM allocator must be empty again.
"""

from __future__ import annotations

import asyncio
import gc
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from kvpool_server.alloc.arena import SharedArena
from kvpool_server.alloc.slab import SlabAllocator
from kvpool_server.eviction import LRUPolicy
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.demoter import Demoter, count_lost_evictions
from kvpool_server.tiers.dram import DramTier, checksum
from kvpool_server.tiers.records import RecordFlags, WalkResult, walk_records
from kvpool_server.tiers.ssd import SsdConfig, SsdTier, record_size
from kvpool_server.tiers.store import BlockStore, HeldBlock
from kvpool_server.tiers.usage import TierUsage

KiB = 1024
BLOCK = 4 * KiB
DRAM = 64 * KiB
SLAB = 16 * KiB
NS = "m@fp16@tp0"


def k(i: int) -> StoreKey:
    return (NS, b"blk-%04d" % i)


SEG = 4 * record_size(k(0), BLOCK)


def data_for(i: int) -> bytes:
    return random.Random(i).randbytes(BLOCK)


def wait_until(condition: Callable[[], bool], what: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out; saw {what()}"
        time.sleep(0.002)


class Harness:
    """A BlockStore over a fresh arena and SSD directory, and the helpers to drive and audit it."""

    def __init__(self, directory: Path, promote_on_hit: bool = True, read_ahead: int = 0) -> None:
        self.directory = directory
        self.counters = Counters()
        self.arena = SharedArena(str(directory), "arena", DRAM, prefault=False)
        self.alloc = SlabAllocator(DRAM, SLAB)
        self.ssd_config = SsdConfig(str(directory / "ssd"), 8 * SEG, SEG, fsync=False)
        self.ssd_policy = LRUPolicy()
        self.ssd = SsdTier(self.ssd_config, self.counters, lambda: self.ssd_policy)
        self.dram = DramTier(
            self.arena, self.alloc, self.counters, on_evict=count_lost_evictions(self.ssd, self.counters)
        )
        self.store = BlockStore(
            self.dram, self.ssd, self.counters, promote_on_hit=promote_on_hit, io_threads=2, read_ahead=read_ahead
        )
        self.keys: set[StoreKey] = set()

    def close(self) -> None:
        self.store.close()
        self.ssd.close()
        self.arena.close()

    def put(self, i: int) -> BlockEntry:
        entry = self.dram.reserve(k(i), BLOCK)
        assert isinstance(entry, BlockEntry), f"reserve {k(i)} gave {entry!r}"
        self.keys.add(k(i))
        self.dram.view(entry)[:] = data_for(i)
        self.dram.commit(entry)
        return entry

    def put_ssd(self, i: int) -> None:
        payload = data_for(i)
        assert self.ssd.write(k(i), memoryview(payload), checksum(payload)), f"SSD refused {k(i)}"
        self.keys.add(k(i))

    def acquire(self, indices: Sequence[int], touch: bool = True) -> list[HeldBlock | None]:
        return asyncio.run(self.store.acquire([k(i) for i in indices], touch=touch))

    def read(self, indices: Sequence[int], touch: bool = True) -> list[bytes | None]:
        held = self.acquire(indices, touch)
        try:
            return [None if h is None else bytes(h.view) for h in held]
        finally:
            self.store.release(held)

    def pins(self, i: int) -> int | None:
        """Pins on the DRAM block of ``k(i)`` besides this look's own; None when not in DRAM."""
        entry = self.dram.acquire(k(i), touch=False)
        if entry is None:
            return None
        pins = entry.pins - 1
        self.dram.release(entry)
        return pins

    def in_dram(self) -> list[int]:
        return sorted(int(key[1][4:]) for key in self.dram.readable_keys())

    def reopen_ssd(self) -> SsdTier:
        self.ssd.close()
        self.ssd = SsdTier(self.ssd_config, Counters())
        return self.ssd

    def graves(self) -> list[StoreKey]:
        found = []
        while True:
            try:
                found.append(self.store.graves.get_nowait())
            except queue.Empty:
                return found

    def assert_no_leak(self, held: Sequence[HeldBlock | None] = ()) -> None:
        # A read planned by the last get may still be running: it would commit a block after the deletes.
        wait_until(lambda: not self.store._reading_ahead, lambda: self.store._reading_ahead)
        self.store.release(held)
        for key in self.keys:
            self.dram.delete(key)
        usage = self.dram.usage()
        assert usage == TierUsage(DRAM, 0, 0), f"leak: {usage}"
        assert self.alloc.used_bytes == 0, f"leak: {self.alloc.used_bytes} bytes still allocated"


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def factory(**kwargs: bool | int) -> Harness:
        directory = tmp_path / f"store-{len(made)}"
        directory.mkdir()
        harness = Harness(directory, **kwargs)
        made.append(harness)
        return harness

    yield factory
    for harness in made:
        harness.close()


@pytest.fixture
def s(make: Callable[..., Harness]) -> Harness:
    return make()


def disk_keys(directory: str) -> list[tuple[StoreKey, bool]]:
    """(key, is a tombstone) of every record in the segment files, in log order."""
    found = []
    for path in sorted(Path(directory).glob("*.seg")):
        raw = path.read_bytes()
        for record in walk_records(lambda o, n, raw=raw: raw[o : o + n], len(raw), False, WalkResult()):
            found.append(((record.namespace.decode(), record.hash), bool(record.header.flags & RecordFlags.TOMBSTONE)))
    return found


# -- lookups --------------------------------------------------------------------------


def test_contains_and_prefix_hits_span_both_tiers(s: Harness) -> None:
    s.put(0)
    s.put(1)
    s.put_ssd(2)
    s.put(4)
    s.put(5)
    s.put_ssd(5)  # on both
    assert [s.store.contains(k(i)) for i in range(6)] == [True, True, True, False, True, True]
    assert s.store.prefix_hits([k(i) for i in range(6)]) == 3
    assert s.store.prefix_hits([k(3), k(0)]) == 0
    assert sorted(s.store.readable_keys()) == [k(i) for i in (0, 1, 2, 4, 5)], s.store.readable_keys()
    assert s.counters.snapshot().get("dram_hits") is None, "lookups are not reads"
    s.assert_no_leak()


# -- acquire --------------------------------------------------------------------------


def test_dram_hits_are_served_in_place_and_pinned(s: Harness) -> None:
    s.put(0)
    held = s.acquire([0, 7])
    first = held[0]
    assert first is not None and first.entry is not None and held[1] is None, held
    assert bytes(first.view) == data_for(0) and first.checksum == checksum(data_for(0))
    assert s.pins(0) == 1
    s.store.release(held)
    assert s.pins(0) == 0
    snapshot = s.counters.snapshot()
    assert (snapshot.get("dram_hits"), snapshot.get("dram_misses"), snapshot.get("ssd_misses")) == (1, 1, None), (
        snapshot
    )
    s.assert_no_leak()


def test_ssd_hit_is_promoted_into_dram_and_pinned_until_release(s: Harness) -> None:
    s.put_ssd(0)
    held = s.acquire([0])
    block = held[0]
    assert block is not None and block.entry is not None, "a promoted block is served from DRAM"
    assert bytes(block.view) == data_for(0) and block.checksum == checksum(data_for(0))
    assert s.in_dram() == [0] and s.pins(0) == 1
    for i in range(1, 17):  # fill DRAM and more: the pinned block must survive
        s.put(i)
    assert 0 in s.in_dram() and bytes(block.view) == data_for(0), s.in_dram()
    s.store.release(held)
    assert s.pins(0) == 0
    snapshot = s.counters.snapshot()
    assert (snapshot["ssd_promotions"], snapshot["ssd_hits"], snapshot["dram_misses"]) == (1, 1, 1), snapshot
    assert s.read([0]) == [data_for(0)] and s.counters.get("dram_hits") == 1, "now a DRAM hit"
    report = {r.name: r for r in s.store.reports()}
    assert (report["ssd"].hits, report["ssd"].promotions, report["ssd"].failure) == (1, 1, ""), report
    s.assert_no_leak()


def test_a_batch_of_ssd_blocks_is_read_in_one_pass_and_promoted_tail_first(s: Harness) -> None:
    s.put(1)
    for i in (0, 2, 3, 4):
        s.put_ssd(i)
    batches: list[list[StoreKey]] = []
    real = s.ssd.read_many

    def recorded(keys: Sequence[StoreKey], targets: Sequence[memoryview], *, touch: bool = True) -> list[int | None]:
        batches.append(list(keys))
        return real(keys, targets, touch=touch)

    s.ssd.read_many = recorded  # type: ignore[method-assign]
    held = s.acquire([0, 1, 2, 3, 4, 99])
    assert [None if h is None else bytes(h.view) for h in held] == [data_for(i) for i in range(5)] + [None]
    assert batches == [[k(0), k(2), k(3), k(4)]], "one read for the request's SSD blocks, in its order"
    assert all(h is not None and h.entry is not None for h in held[:5]) and s.in_dram() == [0, 1, 2, 3, 4]
    s.store.release(held)
    assert s.counters.get("ssd_promotions") == 4
    for i in range(5, 16):  # DRAM's sixteen slots are now full
        s.put(i)
    s.put(16)
    s.put(17)
    assert s.in_dram()[:3] == [0, 1, 2], f"the chain lost its head first: {s.in_dram()}"  # 4 and 3 went
    s.assert_no_leak()


def test_a_failed_batch_read_leaves_no_slot_reserved(s: Harness) -> None:
    s.put(0)
    s.put_ssd(1)
    s.put_ssd(2)

    def broken(keys: Sequence[StoreKey], targets: Sequence[memoryview], *, touch: bool = True) -> list[int | None]:
        raise RuntimeError("boom")

    s.ssd.read_many = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError) as failure:
        s.acquire([0, 1, 2])
    del failure
    gc.collect()  # the traceback's frames hold arena views, which would keep the arena from closing
    assert s.in_dram() == [0] and s.pins(0) == 0, "the DRAM hit was released, the reserved slots aborted"
    s.assert_no_leak()


def test_a_failed_commit_of_a_promotion_leaves_nothing_reserved_or_pinned(s: Harness) -> None:
    s.put(0)
    for i in (1, 2, 3):
        s.put_ssd(i)
    real = s.dram.commit

    def broken(entry: BlockEntry, known_checksum: int | None = None, *, keep_pin: bool = False) -> None:
        if entry.key == k(2):  # after k(1) was committed for the reader, before k(3)
            raise RuntimeError("boom")
        real(entry, known_checksum, keep_pin=keep_pin)

    s.dram.commit = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        s.acquire([0, 1, 2, 3])
    del s.dram.commit
    assert (s.pins(0), s.pins(1)) == (0, 0), "a block committed for the failed reader stayed pinned"
    assert s.read([2, 3]) == [data_for(2), data_for(3)] and s.in_dram() == [0, 1, 2, 3], "slots left reserved"
    gc.collect()  # late: the pool thread that raised may still hold the traceback, whose frames hold arena views
    s.assert_no_leak()


def test_no_promotion_when_dram_is_full_of_pinned_blocks(s: Harness) -> None:
    for i in range(16):
        s.put(i)
    pinned = s.acquire(list(range(16)))
    s.put_ssd(99)
    held = s.acquire([99])
    block = held[0]
    assert block is not None and block.entry is None, "served from a private buffer"
    assert bytes(block.view) == data_for(99) and block.checksum == checksum(data_for(99))
    assert 99 not in s.in_dram() and s.in_dram() == list(range(16))
    snapshot = s.counters.snapshot()
    assert ("ssd_promotions" not in snapshot, snapshot["ssd_hits"]) == (True, 1), snapshot
    s.store.release(held)
    s.assert_no_leak(pinned)


def test_untouched_reads_do_not_promote_count_or_refresh(s: Harness) -> None:
    s.put_ssd(0)
    s.put_ssd(1)
    s.put(2)
    before = s.counters.snapshot()
    held = s.acquire([0, 2], touch=False)
    assert [h is not None and bytes(h.view) for h in held] == [data_for(0), data_for(2)]
    assert held[0] is not None and held[0].entry is None and s.in_dram() == [2]
    s.store.release(held)
    assert s.counters.snapshot() == before, (before, s.counters.snapshot())
    assert s.ssd.eviction_order() == [k(0), k(1)], "SSD recency must not change"
    s.assert_no_leak()


def test_promotion_off_serves_from_a_buffer(make: Callable[..., Harness]) -> None:
    s = make(promote_on_hit=False)
    s.put_ssd(0)
    held = s.acquire([0])
    assert held[0] is not None and held[0].entry is None and bytes(held[0].view) == data_for(0)
    assert s.in_dram() == [] and s.counters.get("ssd_hits") == 1
    s.assert_no_leak(held)


def test_corrupt_ssd_record_is_a_miss_and_frees_its_dram_slot(s: Harness) -> None:
    payload = data_for(0)
    assert s.ssd.write(k(0), memoryview(payload), checksum(payload) ^ 1)
    s.keys.add(k(0))
    assert s.acquire([0]) == [None]
    assert s.in_dram() == [] and not s.store.contains(k(0))
    assert s.counters.get("ssd_corrupt_blocks") == 1 and s.dram.usage().used_bytes == 0, s.counters.snapshot()
    s.assert_no_leak()


def test_cancelled_acquire_leaves_nothing_pinned(s: Harness) -> None:
    s.put(0)
    s.put_ssd(1)
    started, gate = threading.Event(), threading.Event()
    real = s.ssd.read_many

    def slow(keys: Sequence[StoreKey], targets: Sequence[memoryview], *, touch: bool = True) -> list[int | None]:
        started.set()
        gate.wait(5)
        return real(keys, targets, touch=touch)

    s.ssd.read_many = slow  # type: ignore[method-assign]

    async def cancel_mid_read() -> None:
        task = asyncio.ensure_future(s.store.acquire([k(0), k(1)]))
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_mid_read())
    gate.set()
    s.store.close()  # waits for the read still running
    assert (s.pins(0), s.pins(1)) == (0, 0), "a cancelled reader's blocks stayed pinned"
    s.assert_no_leak()


def delete_after_ssd_reads(s: Harness) -> None:
    """Make every SSD batch read delete its keys right after reading them: a DELETE landing
    between a promotion's read and its commit."""
    real = s.ssd.read_many

    def read_then_delete(
        keys: Sequence[StoreKey], targets: Sequence[memoryview], *, touch: bool = True
    ) -> list[int | None]:
        found = real(keys, targets, touch=touch)
        for key in keys:
            assert s.store.delete(key)
        return found

    s.ssd.read_many = read_then_delete  # type: ignore[method-assign]


def test_delete_during_promotion_keeps_no_dram_copy(s: Harness) -> None:
    s.put_ssd(0)
    delete_after_ssd_reads(s)
    held = s.acquire([0])
    block = held[0]
    assert block is None or (block.entry is None and bytes(block.view) == data_for(0)), block
    assert s.in_dram() == [] and not s.store.contains(k(0)), "the deleted block came back into DRAM"
    assert s.graves() == [k(0)] and "ssd_promotions" not in s.counters.snapshot()
    s.assert_no_leak(held)


def test_arena_only_read_of_a_block_deleted_during_promotion_is_left_unread(s: Harness) -> None:
    """A LOCATE (arena_only) must get arena blocks or None, never the private copy a GET gets."""
    s.put_ssd(0)
    delete_after_ssd_reads(s)
    held = asyncio.run(s.store.acquire([k(0)], arena_only=True))
    assert held == [None], f"held {held}"
    assert s.in_dram() == [] and not s.store.contains(k(0))
    s.assert_no_leak(held)


# -- read-ahead -----------------------------------------------------------------------

RECORD = record_size(k(0), BLOCK)  # four to a segment


def before_read_ahead(s: Harness, action: Callable[[], None]) -> None:
    """Run ``action`` before every read-ahead's SSD read (the reads with ``touch=False``)."""
    real = s.ssd.read_many

    def read_many(keys: Sequence[StoreKey], targets: Sequence[memoryview], *, touch: bool = True) -> list[int | None]:
        if not touch:
            action()
        return real(keys, targets, touch=touch)

    s.ssd.read_many = read_many  # type: ignore[method-assign]


def gate_read_ahead(s: Harness) -> threading.Event:
    """Hold every read-ahead's SSD read until the returned event is set."""
    gate = threading.Event()

    def wait() -> None:
        assert gate.wait(10), "the test never opened the gate"

    before_read_ahead(s, wait)
    return gate


def start_stream(s: Harness) -> None:
    """Read blocks 0-1, then 2-3: a stream, whose read-ahead starts with block 4."""
    s.read([0, 1])
    s.read([2, 3])


@pytest.fixture
def ra(make: Callable[..., Harness]) -> Harness:
    harness = make(read_ahead=3 * RECORD)
    for i in range(12):  # segments of four records: 0-3, 4-7, 8-11
        harness.put_ssd(i)
    return harness


def test_a_sequential_reader_finds_the_next_blocks_read_ahead_into_dram(ra: Harness) -> None:
    assert ra.read([0, 1]) == [data_for(0), data_for(1)]
    assert "ssd_read_ahead" not in ra.counters.snapshot(), "one read is not a stream"
    assert ra.read([2, 3]) == [data_for(2), data_for(3)]
    wait_until(lambda: ra.counters.get("ssd_read_ahead") == 3, ra.counters.snapshot)
    assert ra.in_dram() == [0, 1, 2, 3, 4, 5, 6], "read ahead across the segment's end"
    assert ra.read([4, 5]) == [data_for(4), data_for(5)]
    snapshot = ra.counters.snapshot()
    assert (snapshot["ssd_hits"], snapshot["ssd_read_ahead_hits"]) == (4, 2), snapshot
    wait_until(lambda: ra.counters.get("ssd_read_ahead") == 4, ra.counters.snapshot)  # 7: up to the segment's end
    assert ra.read([6, 7]) == [data_for(6), data_for(7)]
    wait_until(lambda: ra.counters.get("ssd_read_ahead") == 7, ra.counters.snapshot)  # 8, 9, 10
    assert ra.read([8, 9, 10, 11]) == [data_for(i) for i in range(8, 12)]  # 11: read ahead as 8-10 were taken
    snapshot = ra.counters.snapshot()
    assert (snapshot["ssd_hits"], snapshot["ssd_read_ahead_hits"]) == (4, 8), snapshot
    ra.assert_no_leak()


def test_blocks_taken_from_read_ahead_are_fresh_on_ssd_as_if_read_from_there(ra: Harness) -> None:
    start_stream(ra)
    wait_until(lambda: ra.counters.get("ssd_read_ahead") == 3, ra.counters.snapshot)
    assert ra.ssd.eviction_order()[-4:] == [k(1), k(0), k(3), k(2)], "not touched by the read-ahead itself"
    ra.read([4, 5])
    assert ra.ssd.eviction_order()[-2:] == [k(5), k(4)], "taken: most recent, the head last"
    ra.assert_no_leak()


@pytest.mark.parametrize("window", [0, 3 * RECORD])
def test_reads_out_of_order_or_with_read_ahead_off_read_nothing_ahead(
    make: Callable[..., Harness], window: int
) -> None:
    s = make(read_ahead=window)
    for i in range(12):
        s.put_ssd(i)
    started: list[int] = []
    before_read_ahead(s, lambda: started.append(1))
    reads = [[0, 1], [2, 3]] if not window else [[0, 1, 2, 3, 4, 5], [8, 9], [11]]
    for batch in reads:
        assert s.read(batch) == [data_for(i) for i in batch]
    # A read-ahead is in flight from the read that planned it until it ends: once none is,
    # every one these reads started has read, so none started.
    wait_until(lambda: not s.store._reading_ahead, lambda: s.store._reading_ahead)
    assert not started and "ssd_read_ahead" not in s.counters.snapshot(), s.counters.snapshot()
    s.assert_no_leak()


def test_a_reader_walking_the_log_down_is_read_ahead_of_too(make: Callable[..., Harness]) -> None:
    """A chain demoted tail first lies head last on disk: read head first, it walks the log down."""
    s = make(read_ahead=3 * RECORD)
    for i in reversed(range(12)):  # on disk: 11-8, 7-4, 3-0
        s.put_ssd(i)
    assert s.read([0, 1]) == [data_for(0), data_for(1)]
    assert s.read([2, 3]) == [data_for(2), data_for(3)]
    wait_until(lambda: s.counters.get("ssd_read_ahead") == 3, s.counters.snapshot)
    assert s.in_dram() == [0, 1, 2, 3, 4, 5, 6], "read ahead down into the segment before"
    assert s.read([4, 5, 6, 7]) == [data_for(i) for i in range(4, 8)]  # 7: read ahead as 4-6 were taken
    snapshot = s.counters.snapshot()
    assert (snapshot["ssd_hits"], snapshot["ssd_read_ahead_hits"]) == (4, 4), snapshot
    s.assert_no_leak()


def test_a_get_of_blocks_being_read_ahead_waits_for_them_instead_of_reading_twice(ra: Harness) -> None:
    reading, gate = threading.Event(), threading.Event()

    def hold() -> None:
        reading.set()
        assert gate.wait(10), "the test never opened the gate"

    before_read_ahead(ra, hold)
    start_stream(ra)
    assert reading.wait(10), "no read-ahead started after a stream of reads"

    async def get_while_read_ahead_runs() -> list[bytes | None]:
        get = asyncio.ensure_future(ra.store.acquire([k(4), k(5)]))
        await asyncio.sleep(0)  # the get's first step: it finds blocks 4 and 5 still being read ahead
        gate.set()
        held = await get
        try:
            return [None if h is None else bytes(h.view) for h in held]
        finally:
            ra.store.release(held)

    assert asyncio.run(get_while_read_ahead_runs()) == [data_for(4), data_for(5)]
    snapshot = ra.counters.snapshot()
    assert (snapshot["ssd_hits"], snapshot["ssd_read_ahead_hits"]) == (4, 2), snapshot
    ra.assert_no_leak()


def test_a_block_deleted_while_read_ahead_does_not_come_back(ra: Harness) -> None:
    gate = gate_read_ahead(ra)
    start_stream(ra)
    assert ra.store.delete(k(5))
    gate.set()
    wait_until(lambda: not ra.store._reading_ahead, lambda: ra.store._reading_ahead)
    assert ra.in_dram() == [0, 1, 2, 3, 4, 6] and not ra.store.contains(k(5))
    assert ra.read([4, 5, 6]) == [data_for(4), None, data_for(6)]
    ra.assert_no_leak()


def test_a_failed_read_ahead_leaves_no_slot_reserved(ra: Harness, caplog: pytest.LogCaptureFixture) -> None:
    def fail() -> None:
        raise RuntimeError("injected")

    before_read_ahead(ra, fail)
    start_stream(ra)
    wait_until(lambda: not ra.store._reading_ahead, lambda: ra.store._reading_ahead)
    assert "SSD read-ahead failed" in caplog.text
    assert ra.in_dram() == [0, 1, 2, 3] and ra.read([4]) == [data_for(4)], "served from SSD instead"
    ra.assert_no_leak()


# -- delete ---------------------------------------------------------------------------


def test_persist_writes_committed_blocks_through_to_ssd_and_unpins_them(s: Harness) -> None:
    entries = []
    for i in range(3):
        entry = s.dram.reserve(k(i), BLOCK, depth=i)
        assert isinstance(entry, BlockEntry), f"reserve gave {entry!r}"
        s.keys.add(k(i))
        s.dram.view(entry)[:] = data_for(i)
        s.dram.commit(entry, keep_pin=True)  # as a write-through put does
        entries.append(entry)
    assert [s.pins(i) for i in range(3)] == [1, 1, 1]
    asyncio.run(s.store.persist(entries))
    assert [s.pins(i) for i in range(3)] == [0, 0, 0], "persist must release the writer's pins"
    copies = [bytearray(BLOCK) for _ in range(3)]
    sums = [s.ssd.read_into(k(i), memoryview(copies[i]), touch=False) for i in range(3)]
    assert all(sums) and [bytes(c) for c in copies] == [data_for(i) for i in range(3)], f"SSD holds {sums}"
    s.assert_no_leak()


@pytest.mark.parametrize("when", ["before the write", "during the write"])
def test_write_through_block_deleted_before_it_reaches_ssd_does_not_come_back(s: Harness, when: str) -> None:
    entry = s.dram.reserve(k(0), BLOCK)
    assert isinstance(entry, BlockEntry), f"reserve gave {entry!r}"
    s.keys.add(k(0))
    s.dram.view(entry)[:] = data_for(0)
    s.dram.commit(entry, keep_pin=True)  # a write-through put, about to persist
    real = s.ssd.write

    def racing_write(key: StoreKey, payload: memoryview, checksum_: int, depth: int = 0) -> bool:
        written = real(key, payload, checksum_, depth)
        if when == "during the write":
            assert s.store.delete(key)  # another connection's DELETE
        return written

    s.ssd.write = racing_write  # type: ignore[method-assign]
    if when == "before the write":
        assert s.store.delete(k(0))
    asyncio.run(s.store.persist([entry]))
    for key in s.graves():  # what the demoter does with them
        s.ssd.bury(key)
    assert not s.store.contains(k(0)), "a deleted block is served again"
    assert s.reopen_ssd().keys() == [], "the deleted block came back after a restart"
    s.assert_no_leak()


def test_flush_removes_a_namespace_from_both_tiers_and_keeps_the_others(s: Harness) -> None:
    s.put(0)
    s.put_ssd(1)
    other = ("other-ns", b"key-000")
    entry = s.dram.reserve(other, BLOCK)
    assert isinstance(entry, BlockEntry)
    s.dram.commit(entry)
    assert s.store.flush(k(0)[0].__eq__) == 2
    assert not s.store.contains(k(0)) and not s.store.contains(k(1)) and s.store.contains(other)
    assert sorted(s.graves()) == [k(0), k(1)], "each flushed key leaves a tombstone"
    assert s.store.delete(other)
    s.assert_no_leak()


def test_delete_removes_from_both_tiers_and_queues_a_tombstone(s: Harness) -> None:
    s.put(0)
    s.put_ssd(0)
    s.put_ssd(1)
    s.put(2)
    assert [s.store.delete(k(i)) for i in (0, 1, 2, 3)] == [True, True, True, False]
    assert not any(s.store.contains(k(i)) for i in range(4))
    graves = s.graves()
    assert graves == [k(0), k(1), k(2)], "a tombstone for every block held, none for unknown keys"
    for key in graves:
        s.ssd.bury(key)
    assert s.reopen_ssd().keys() == []
    s.assert_no_leak()


def test_delete_of_a_block_evicted_from_ssd_stays_deleted_after_restart(s: Harness) -> None:
    s.put(0)
    for i in (0, *range(100, 127)):
        s.put_ssd(i)  # segment 1: 0 (demoted earlier), 100..102; SSD is now full
    for i in (100, 101, 102):
        assert s.ssd.read_into(k(i), memoryview(bytearray(BLOCK))) is not None  # now recent
    s.put_ssd(127)  # SSD evicts block 0, then 103..105, and compacts segment 2: segment 1 stays
    assert not s.ssd.contains(k(0)) and s.store.contains(k(0)), s.ssd.keys()
    assert (k(0), False) in disk_keys(s.ssd_config.directory), "block 0's record should still be on disk"
    assert s.store.delete(k(0))
    for key in s.graves():
        s.ssd.bury(key)
    assert k(0) not in s.reopen_ssd().keys(), "the deleted block came back from its evicted record"
    s.assert_no_leak()


# -- the demoter ----------------------------------------------------------------------


def test_demoter_needs_an_ssd_tier(tmp_path: Path) -> None:
    arena = SharedArena(str(tmp_path), "arena", DRAM, prefault=False)
    try:
        store = BlockStore(DramTier(arena, SlabAllocator(DRAM, SLAB), Counters()), None, Counters())
        with pytest.raises(ValueError):
            Demoter(store, 0.25)
    finally:
        arena.close()


def test_coldest_share_is_on_ssd_before_dram_evicts_it(s: Harness) -> None:
    for i in range(16):
        s.put(i)
    demoter = Demoter(s.store, share=0.25, idle_s=0.005)
    demoter.start()
    try:
        wait_until(lambda: all(s.ssd.contains(k(i)) for i in range(4)), lambda: s.ssd.keys())
    finally:
        demoter.stop()
    assert sorted(s.ssd.keys()) == [k(i) for i in range(4)], "only the coldest quarter is copied"
    assert s.in_dram() == list(range(16)), "demotion copies: the blocks stay in DRAM"
    for i in range(16, 20):
        s.put(i)  # evicts 0..3
    assert s.in_dram() == list(range(4, 20)), s.in_dram()
    snapshot = s.counters.snapshot()
    assert (snapshot["dram_evictions"], snapshot.get("dram_evictions_lost")) == (4, None), snapshot
    assert s.read([0, 1, 2, 3], touch=False) == [data_for(i) for i in range(4)]
    s.assert_no_leak()


def test_evictions_the_demoter_missed_are_counted_lost(s: Harness) -> None:
    for i in range(16):
        s.put(i)
    s.put_ssd(1)
    s.put(16)  # evicts 0: not on SSD
    s.put(17)  # evicts 1: on SSD
    snapshot = s.counters.snapshot()
    assert (snapshot["dram_evictions"], snapshot["dram_evictions_lost"]) == (2, 1), snapshot
    assert s.read([0, 1], touch=False) == [None, data_for(1)]
    s.assert_no_leak()


@pytest.mark.parametrize("when", ["before the write", "after the write"])
def test_block_deleted_while_demoted_does_not_come_back(s: Harness, when: str) -> None:
    s.put(0)
    s.put(1)
    real = s.ssd.write

    def racing_write(key: StoreKey, payload: memoryview, checksum_: int, depth: int = 0) -> bool:
        if key == k(0) and when == "before the write":
            assert s.store.delete(key)
        written = real(key, payload, checksum_, depth)
        if key == k(0) and when == "after the write":
            assert s.store.delete(key)
        return written

    s.ssd.write = racing_write  # type: ignore[method-assign]
    Demoter(s.store, share=1.0).stop(flush_within_s=5.0)  # a flush: one synchronous pass
    assert not s.store.contains(k(0)) and s.store.contains(k(1))
    assert (k(0), True) in disk_keys(s.ssd_config.directory), disk_keys(s.ssd_config.directory)
    assert s.reopen_ssd().keys() == [k(1)], "the deleted block came back after a restart"
    s.assert_no_leak()


def test_stop_flushes_dram_coldest_first(s: Harness) -> None:
    for i in range(10):
        s.put(i)
    s.read([0])  # now the hottest
    assert Demoter(s.store, share=0.25).stop(flush_within_s=0.0) == 0
    assert s.ssd.keys() == []
    assert Demoter(s.store, share=0.25).stop(flush_within_s=5.0) == 10
    assert [key for key, _ in disk_keys(s.ssd_config.directory)] == [k(i) for i in (*range(1, 10), 0)]
    ssd = s.reopen_ssd()
    for i in range(10):
        target = bytearray(BLOCK)
        assert ssd.read_into(k(i), memoryview(target)) == checksum(data_for(i)) and target == data_for(i)
    s.assert_no_leak()


def test_stop_writes_pending_tombstones(s: Harness) -> None:
    s.put_ssd(0)
    s.store.delete(k(0))
    assert Demoter(s.store, share=0.25).stop() == 0
    assert disk_keys(s.ssd_config.directory) == [(k(0), False), (k(0), True)]
    assert s.reopen_ssd().keys() == []
    s.assert_no_leak()


def test_no_demotion_while_the_ssd_tier_has_failed(s: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    s.put(0)
    monkeypatch.setattr(s.ssd, "failure", lambda: "ENOSPC: No space left on device")
    assert Demoter(s.store, share=1.0).stop(flush_within_s=5.0) == 0
    assert s.ssd.keys() == []
    s.assert_no_leak()


def test_demoter_thread_outlives_a_failing_pass(s: Harness, caplog: pytest.LogCaptureFixture) -> None:
    s.put(0)
    real = s.ssd.write
    calls: list[StoreKey] = []

    def fail_once(key: StoreKey, payload: memoryview, checksum_: int, depth: int = 0) -> bool:
        calls.append(key)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(key, payload, checksum_, depth)

    s.ssd.write = fail_once  # type: ignore[method-assign]
    demoter = Demoter(s.store, share=1.0, idle_s=0.005)
    demoter.start()
    try:
        wait_until(lambda: s.ssd.contains(k(0)), lambda: (calls, s.ssd.keys()))
    finally:
        demoter.stop()
    assert "demotion pass failed" in caplog.text
    caplog.clear()  # its traceback holds a view of the arena
    assert s.pins(0) == 0, "the failed pass left its block pinned"
    s.assert_no_leak()
