"""Same-node gets through the published index, without a daemon: a real arena file with its table,
a DRAM tier publishing into it, a hit marks file, and a client mapping of both in a temp folder.

The properties under test: a block never read before is copied with no request at all; a
block deleted, evicted or whose slot was reused is never served from a stale entry (the
node is asked instead); reads through the table keep their blocks in the eviction order
once the marks are drained; a retired table, or one whose heartbeat stopped, sends the
client to the node.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import xxhash

from kvpool_client import exchange
from kvpool_client.core.control import SharedArenaInfo
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.wire import GetResponse, LocateRequest, WireLimits, encode
from kvpool_client.core.wire.published import BEAT_LIMIT_NS, MARK_SHIFT
from kvpool_client.transport.shm import KnownLocations, MappedArena
from kvpool_server.alloc import arena as server_arena
from kvpool_server.alloc.generations import SlotGenerations
from kvpool_server.alloc.slab import SlabAllocator
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import DramTier
from kvpool_server.tiers.shared_index import SharedIndex, extra_bytes
from tests.support.clock import FakeClock
from tests.support.waiting import wait_until
from tests.wire.test_shm import drive, locate_answer, shm_get

KiB = 1024
CAPACITY, SLAB, BLOCK = 64 * KiB, 16 * KiB, 4 * KiB  # 16 slots of 4 KiB
NS = "model@fp16@L2@tp0of1"
LIMITS = WireLimits(max_keys=16, max_block_size=SLAB, max_payload=1 << 20)
OK, NOT_FOUND = ErrorCode.OK, ErrorCode.NOT_FOUND


def k(i: int) -> StoreKey:
    return (NS, b"key-%03d" % i)


def data_for(i: int) -> bytes:
    return random.Random(i).randbytes(BLOCK)


@dataclass
class Node:
    """A daemon's DRAM side with its published index, as the data plane and the drain see it."""

    arena: server_arena.SharedArena
    generations: SlotGenerations
    index: SharedIndex
    tier: DramTier
    counters: Counters

    @property
    def info(self) -> SharedArenaInfo:
        return SharedArenaInfo(
            str(self.arena.path),
            self.arena.capacity,
            self.generations.arena_id,
            self.arena.capacity,
            index_offset=self.index.offset,
            hit_marks_path=self.index.marks_path,
        )

    def put(self, i: int) -> BlockEntry:
        entry = self.tier.reserve(k(i), BLOCK)
        assert isinstance(entry, BlockEntry), entry
        self.tier.view(entry)[:] = data_for(i)
        self.tier.commit(entry)
        return entry

    def reader(self) -> MappedArena:
        return MappedArena(self.info, location_ttl_s=1.0)


def make_node(directory: Path, entries: int = 64, probe_limit: int = 16) -> Node:
    arena = server_arena.SharedArena(
        str(directory), "kvpool-t", CAPACITY, prefault=False, extra=extra_bytes(CAPACITY, entries)
    )
    generations = SlotGenerations(arena.extra, CAPACITY, arena_id=0xC0FFEE)
    index = SharedIndex(arena, entries, 0xC0FFEE, probe_limit)
    counters = Counters()
    tier = DramTier(arena, SlabAllocator(CAPACITY, SLAB), counters, generations=generations, published=index.table)
    return Node(arena, generations, index, tier, counters)


def close_node(node: Node) -> None:
    """Closing the arena fails if a view of it is still held: the table must let go of its memory."""
    node.index.close()
    node.generations.close()
    node.arena.close()
    assert not node.arena.path.exists() and not Path(node.index.marks_path).exists()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = make_node(tmp_path)
    yield made
    close_node(made)


def test_a_block_never_read_here_is_copied_without_asking_the_node(node: Node) -> None:
    node.put(1)
    node.put(2)
    reader = node.reader()
    sent, statuses, filled = shm_get(reader, [k(1), k(2)], [], verify=True)
    assert sent == [], f"the node was asked: {sent}"
    assert statuses == [OK, OK] and [bytes(v) for v in filled] == [data_for(1), data_for(2)]
    sent, statuses, _ = shm_get(reader, [k(1), k(3)], [locate_answer(node, 3, [k(1), k(3)])])
    assert len(sent) == 1 and statuses == [OK, NOT_FOUND], "a block not published is located by asking"


@pytest.mark.parametrize("removal", ["delete", "delete while pinned", "evict and reuse"])
def test_an_entry_of_a_removed_block_is_never_served(node: Node, removal: str) -> None:
    first = node.put(1)
    reader = node.reader()
    ((location, _),) = reader.known.lookup(NS, [k(1)[1]]) or [(None, 0)]
    assert location is not None and location.offset == first.offset
    held = None
    if removal == "delete":
        assert node.tier.delete(k(1))
    elif removal == "delete while pinned":
        held = node.tier.acquire(k(1))  # a TCP reader keeps the slot; the block is gone all the same
        assert node.tier.delete(k(1))
    else:
        for i in range(2, 2 + CAPACITY // BLOCK):
            node.put(i)
        assert not node.tier.contains(k(1))
    assert reader.published is not None and reader.published[0].find(*k(1)) is None, "withdrawn from the table"
    # A reader that found the entry just before the removal copies, then sees the slot changed.
    target = memoryview(bytearray(BLOCK))
    reader.copy_into(location, target)
    assert not reader.unchanged(location), f"the slot's generation must have moved ({removal})"
    frames = [locate_answer(node, 3, [k(1)]), encode(GetResponse(3, [int(NOT_FOUND)], [0], [0]))]
    sent, statuses, filled = shm_get(reader, [k(1)], frames)
    assert sent and statuses == [NOT_FOUND] and filled == [None]
    if held is not None:
        node.tier.release(held)


def test_a_slot_reused_for_another_block_serves_that_block_under_its_own_key_only(node: Node) -> None:
    node.put(1)
    reader = node.reader()
    assert node.tier.delete(k(1))
    reused = node.put(2)
    sent, statuses, filled = shm_get(reader, [k(2)], [])
    assert sent == [] and statuses == [OK] and bytes(filled[0]) == data_for(2)
    frames = [locate_answer(node, 3, [k(1)]), encode(GetResponse(3, [int(NOT_FOUND)], [0], [0]))]
    sent, statuses, _ = shm_get(reader, [k(1)], frames)
    assert sent and statuses == [NOT_FOUND], f"key 1 must not find block 2 at {reused.offset}"


def test_a_stored_block_whose_bytes_rotted_is_asked_for_when_the_node_verifies(node: Node) -> None:
    entry = node.put(1)
    reader = node.reader()
    reader.info = dataclasses.replace(node.info, verify_checksums=True)
    node.tier.view(entry)[:4] = b"\x00\x01\x02\x03"  # rot in memory: the slot and its generation stay
    sent, _, _ = shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
    assert sent, "the table's checksum did not match the copy: the node is asked (and checks)"


def test_reads_through_the_table_keep_blocks_in_the_eviction_order(node: Node) -> None:
    for i in range(16):  # full: block 0 is the least recent
        node.put(i)
    reader = node.reader()
    assert shm_get(reader, [k(0)], [])[0] == [], "read through the table"
    assert node.index.drain(node.tier, node.counters) == 1
    assert node.counters.get("shared_index_touches") == 1
    node.put(16)
    gone = [i for i in range(17) if not node.tier.contains(k(i))]
    assert gone == [1], f"the block read through the table was evicted before an older one: {gone}"
    assert node.index.drain(node.tier, node.counters) == 0, "nothing read since"


def test_without_a_drain_such_reads_are_invisible_to_eviction(node: Node) -> None:
    """The control for the test above: the marks, not the read, keep the block."""
    for i in range(16):
        node.put(i)
    assert shm_get(node.reader(), [k(0)], [])[0] == []
    node.put(16)
    assert not node.tier.contains(k(0))


def test_a_mark_of_an_entry_withdrawn_before_the_drain_touches_nothing(node: Node) -> None:
    node.put(1)
    assert shm_get(node.reader(), [k(1)], [])[0] == []
    assert node.tier.delete(k(1))
    assert node.index.drain(node.tier, node.counters) == 0


def test_a_retired_table_sends_the_client_to_the_nodes_next_arena(node: Node) -> None:
    node.put(1)
    reader = node.reader()
    node.index.table.retire()  # what a daemon's shutdown does before it removes the arena
    sent, statuses, _ = shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
    assert reader.stale, "the mapping must be dropped (the node info is read again)"
    assert len(sent) == 1 and statuses == [OK]


def test_a_block_left_out_of_a_full_window_is_located_by_asking(tmp_path: Path) -> None:
    small = make_node(tmp_path, entries=16, probe_limit=1)
    try:
        for i in range(16):
            small.put(i)
        skipped = small.counters.get("shared_index_skipped")
        assert 0 < skipped < 16 and small.index.table.published == 16 - skipped
        reader = small.reader()
        served = [i for i in range(16) if shm_get(reader, [k(i)], [locate_answer(small, 3, [k(i)])])[0] == []]
        assert len(served) == 16 - skipped, "exactly the published blocks are read without asking"
    finally:
        close_node(small)


def test_a_client_that_cannot_write_hit_marks_does_not_read_the_table(node: Node) -> None:
    """Its reads would be lost to the node's eviction order."""
    node.put(1)
    info = dataclasses.replace(node.info, hit_marks_path=str(Path(node.index.marks_path).with_name("gone")))
    reader = MappedArena(info, location_ttl_s=1.0)
    assert reader.published is None
    assert len(shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])[0]) == 1


def test_ttl_zero_asks_the_node_every_time_table_or_not(node: Node) -> None:
    node.put(1)
    reader = MappedArena(node.info, location_ttl_s=0.0)
    for _ in range(2):
        sent, statuses, _ = shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
        assert len(sent) == 1 and statuses == [OK]


def test_an_index_of_another_arena_is_not_read(node: Node) -> None:
    node.put(1)
    info = dataclasses.replace(node.info, index_offset=node.info.generations_offset)  # the generations, not the table
    assert MappedArena(info, location_ttl_s=1.0).published is None


def test_a_table_whose_heartbeat_stopped_is_not_read(node: Node) -> None:
    """A killed daemon cannot retire its table; its silence does: the node is asked, and its
    answer for another arena (a restarted daemon's) marks the mapping stale."""
    node.put(1)
    reader = node.reader()
    node.index.table.beat(time.monotonic_ns() - BEAT_LIMIT_NS)
    sent, statuses, _ = shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
    assert len(sent) == 1 and statuses == [OK] and not reader.stale, "asked; the same arena answered"
    payload = data_for(1)
    frames = [
        locate_answer(node, 3, [k(1)], arena_id=0xBEEF),
        encode(GetResponse(3, [int(OK)], [len(payload)], [xxhash.xxh3_64_intdigest(payload)])),
    ]
    request, reader = LocateRequest(3, NS, [k(1)[1]]), node.reader()  # one that knows no location yet
    _, (statuses, filled) = drive(exchange.get_shared(request, [None], LIMITS, True, reader), frames, [payload])
    assert reader.stale and statuses == [OK] and bytes(filled[0]) == payload
    node.index.table.beat(time.monotonic_ns())
    assert shm_get(node.reader(), [k(1)], [])[0] == [], "beating again: read without asking"


def test_a_block_read_ahead_is_published_once_a_client_read_it(node: Node) -> None:
    """Until then its reads must reach the daemon, whose read-ahead follows them."""
    entry = node.tier.reserve(k(1), BLOCK)
    assert isinstance(entry, BlockEntry)
    entry.read_ahead = True  # what the SSD read-ahead marks before it commits the block
    node.tier.view(entry)[:] = data_for(1)
    node.tier.commit(entry)
    assert len(shm_get(node.reader(), [k(1)], [locate_answer(node, 3, [k(1)])])[0]) == 1, "asked the node"
    held = node.tier.acquire(k(1))  # the client's read through the daemon (BlockStore clears the mark)
    assert held is not None
    held.read_ahead = False
    node.tier.publish_read([held])
    node.tier.release(held)
    sent, statuses, filled = shm_get(node.reader(), [k(1)], [])
    assert sent == [] and statuses == [OK] and bytes(filled[0]) == data_for(1)


def test_a_block_found_in_the_table_is_known_for_the_ttl_and_marked_once_a_ttl(node: Node) -> None:
    """As when the node is asked once a ttl: re-reads within it copy from the known location, unmarked."""
    node.put(1)
    reader, clock = node.reader(), FakeClock()
    reader.known = KnownLocations(1.0, clock=clock, published=reader._find)
    marked = []
    for _ in range(3):
        assert shm_get(reader, [k(1)], [])[0] == []
        marked.append(node.index.drain(node.tier, node.counters))
    assert marked == [1, 0, 0], "re-reads within the ttl leave no mark"
    clock.advance(1.5)
    tick = time.monotonic_ns() >> MARK_SHIFT
    wait_until(lambda: time.monotonic_ns() >> MARK_SHIFT, lambda now: now != tick, "the next mark tick", 1.0)
    assert shm_get(reader, [k(1)], [])[0] == [] and node.index.drain(node.tier, node.counters) == 1
