"""Slot generations and the shm read path, without a daemon: a real arena, tier and mapping in a temp folder.

The property under test: a reader that copied a block out of the arena and then
sees the slot's generation unchanged got that block's bytes; any free of the slot
in between (eviction, delete, reuse by another block) changes the generation.
"""

from __future__ import annotations

import dataclasses
import platform
import random
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import xxhash

from kvpool_client import exchange
from kvpool_client.core.control import SharedArenaInfo
from kvpool_client.core.errors import ErrorCode, ProtocolError
from kvpool_client.core.wire import (
    HEADER_SIZE,
    GetRequest,
    GetResponse,
    LocateRequest,
    LocateResponse,
    Op,
    WireLimits,
    encode,
)
from kvpool_client.core.wire.codec import answer_meta_size
from kvpool_client.core.wire.generations import GRANULE, HEADER_BYTES, decode_header
from kvpool_client.exchange import Receive, ReceiveInto, ReceiveUpTo, Send
from kvpool_client.transport.shm import (
    KnownLocations,
    MappedArena,
    SharedArenaUnavailable,
    SlotLocation,
    open_shared_arena,
)
from kvpool_server.alloc import arena as server_arena
from kvpool_server.alloc.generations import SlotGenerations
from kvpool_server.alloc.slab import ALIGNMENT, SlabAllocator
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import DramTier
from tests.support.clock import FakeClock

KiB = 1024
CAPACITY, SLAB = 64 * KiB, 16 * KiB
NS = "model@fp16@L2@tp0of1"
LIMITS = WireLimits(max_keys=16, max_block_size=SLAB, max_payload=1 << 20)
OK, NOT_FOUND = ErrorCode.OK, ErrorCode.NOT_FOUND


def k(i: int) -> StoreKey:
    return (NS, b"key-%03d" % i)


def data_for(i: int, length: int = 4 * KiB) -> bytes:
    return random.Random(i).randbytes(length)


@dataclass
class Node:
    """A daemon's DRAM side (arena with its generations, tier) as the LOCATE handler sees it."""

    arena: server_arena.SharedArena
    generations: SlotGenerations
    tier: DramTier

    @property
    def info(self) -> SharedArenaInfo:
        return SharedArenaInfo(
            str(self.arena.path), self.arena.capacity, self.generations.arena_id, self.arena.capacity
        )

    def put(self, key: StoreKey, data: bytes) -> BlockEntry:
        entry = self.tier.reserve(key, len(data))
        assert isinstance(entry, BlockEntry), entry
        self.tier.view(entry)[:] = data
        self.tier.commit(entry)
        return entry

    def locate(self, key: StoreKey) -> SlotLocation:
        """What the LOCATE handler answers: the location and generation read while the block is held."""
        entry = self.tier.acquire(key)
        assert entry is not None, key
        try:
            return SlotLocation(entry.offset, entry.length, self.tier.generation(entry))
        finally:
            self.tier.release(entry)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    extra = SlotGenerations.region_bytes(CAPACITY)
    arena = server_arena.SharedArena(str(tmp_path), "kvpool-t", CAPACITY, prefault=False, extra=extra)
    generations = SlotGenerations(arena.extra, CAPACITY, arena_id=0xC0FFEE)
    tier = DramTier(arena, SlabAllocator(CAPACITY, SLAB), Counters(), generations=generations)
    yield Node(arena, generations, tier)
    generations.close()
    arena.close()


def test_generations_live_in_the_arena_file_after_the_blocks(node: Node) -> None:
    raw = node.arena.path.read_bytes()
    header = decode_header(raw[CAPACITY : CAPACITY + HEADER_BYTES])
    assert (header.arena_id, header.granule, header.count) == (0xC0FFEE, GRANULE, CAPACITY // GRANULE)
    assert len(raw) == CAPACITY + HEADER_BYTES + 8 * header.count
    assert ALIGNMENT % GRANULE == 0, "every slot must start on a generation granule"


def test_every_free_bumps_the_slot_generation_once(node: Node) -> None:
    first = node.put(k(1), data_for(1))
    assert node.tier.generation(first) == 0
    assert node.tier.delete(k(1))
    assert node.generations.get(first.offset) == 1
    again = node.put(k(2), data_for(2))
    assert again.offset == first.offset and node.tier.generation(again) == 1, "reuse keeps the bumped generation"
    aborted = node.tier.reserve(k(3), 4 * KiB)
    assert isinstance(aborted, BlockEntry)
    node.tier.abort(aborted)
    assert node.generations.get(aborted.offset) == 1


def test_a_reused_slot_is_detected_after_the_copy(node: Node) -> None:
    reader = MappedArena(node.info)
    node.put(k(1), data_for(1))
    where = node.locate(k(1))
    target = memoryview(bytearray(where.length))
    reader.copy_into(where, target)
    assert bytes(target) == data_for(1) and reader.unchanged(where)
    # Evict (by filling the arena past capacity) and reuse the slot for another block.
    for i in range(2, 2 + CAPACITY // (4 * KiB)):
        node.put(k(i), data_for(i))
    assert not node.tier.contains(k(1))
    reused = next(i for i in range(2, 40) if node.tier.contains(k(i)) and node.locate(k(i)).offset == where.offset)
    reader.copy_into(where, target)
    assert bytes(target) == data_for(reused), "the copy now holds the new block's bytes ..."
    assert not reader.unchanged(where), "... and the generation says so"


def test_a_pinned_block_deleted_changes_generation_at_once(node: Node) -> None:
    """A location learned before must not outlive the key, even while a TCP reader keeps the slot."""
    node.put(k(1), data_for(1))
    where = node.locate(k(1))
    held = node.tier.acquire(k(1))
    assert held is not None and node.tier.delete(k(1))
    reader = MappedArena(node.info)
    assert not reader.unchanged(where), "deleted, though still pinned"
    gone = node.generations.get(where.offset)
    node.tier.release(held)
    assert node.generations.get(where.offset) != gone, "the free bumps it again, before any reuse"


def test_reader_rejects_locations_outside_the_arena(node: Node) -> None:
    reader = MappedArena(node.info)
    with pytest.raises(ProtocolError):
        reader.copy_into(SlotLocation(CAPACITY - 4 * KiB, 8 * KiB, 0), memoryview(bytearray(8 * KiB)))
    with pytest.raises(ProtocolError):
        reader.unchanged(SlotLocation(100, 1, 0))


# -- negotiation --------------------------------------------------------------------


def test_negotiation_follows_the_transport_setting(node: Node, tmp_path: Path) -> None:
    assert open_shared_arena(node.info, "tcp") is None
    assert isinstance(open_shared_arena(node.info, "auto"), MappedArena)
    assert isinstance(open_shared_arena(node.info, "shm"), MappedArena)
    assert open_shared_arena(None, "auto") is None
    with pytest.raises(SharedArenaUnavailable):
        open_shared_arena(None, "shm")


def test_a_cpu_that_reorders_loads_never_maps_the_arena(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """The generation check after a copy relies on x86-64 keeping loads in order."""
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert open_shared_arena(node.info, "auto") is None
    with pytest.raises(SharedArenaUnavailable, match="aarch64"):
        open_shared_arena(node.info, "shm")


@pytest.mark.parametrize("broken", ["missing file", "other arena id", "too small", "no generations there"])
def test_an_arena_that_is_not_the_nodes_falls_back_to_tcp(node: Node, tmp_path: Path, broken: str) -> None:
    path, offset, arena_id, capacity, *_ = dataclasses.astuple(node.info)
    if broken == "missing file":
        path = str(tmp_path / "gone")
    elif broken == "other arena id":  # e.g. another host's file at the same path
        arena_id += 1
    elif broken == "too small":
        capacity *= 2
    else:
        offset -= GRANULE
    info = SharedArenaInfo(path, offset, arena_id, capacity)
    assert open_shared_arena(info, "auto") is None
    with pytest.raises(SharedArenaUnavailable):
        open_shared_arena(info, "shm")


# -- the get exchange over shm, step by step -----------------------------------------


def drive(gen: Generator, frames: list[bytes], payloads: list[bytes]) -> tuple[list[Send], object]:
    """Play the node: answer each receive from ``frames``, fill each ReceiveInto from ``payloads``."""
    sent: list[Send] = []
    pending, reply = b"", None
    frames, payloads = list(frames), list(payloads)
    while True:
        try:
            step = gen.send(reply)
        except StopIteration as done:
            return sent, done.value
        reply = None
        if isinstance(step, Send):
            sent.append(step)
            pending = frames.pop(0)
        elif isinstance(step, (ReceiveUpTo, Receive)):
            reply, pending = bytearray(pending[: step.nbytes]), pending[step.nbytes :]
        else:
            assert isinstance(step, ReceiveInto)
            if not step.targets:
                continue
            payload, pos = payloads.pop(0), 0
            for target in step.targets:
                target[:] = payload[pos : pos + len(target)]
                pos += len(target)


def locate_answer(node: Node, rid: int, keys: list[StoreKey], arena_id: int | None = None) -> bytes:
    """The LOCATE response the node would send for ``keys`` now."""
    rows = []
    for key in keys:
        entry = node.tier.acquire(key)
        if entry is None:
            rows.append((int(NOT_FOUND), 0, 0, 0, 0))
            continue
        rows.append((int(OK), entry.offset, entry.length, entry.checksum, node.tier.generation(entry)))
        node.tier.release(entry)
    columns = [list(c) for c in zip(*rows, strict=True)]
    return encode(LocateResponse(rid, node.generations.arena_id if arena_id is None else arena_id, *columns))


def test_shm_get_copies_located_blocks_and_reads_only_the_rest_over_the_wire(node: Node) -> None:
    for i in (1, 2):
        node.put(k(i), data_for(i))
    keys = [k(1), k(9), k(2)]
    request = LocateRequest(5, NS, [key[1] for key in keys])
    targets = [memoryview(bytearray(4 * KiB)), None, None]
    gen = exchange.get_shared(request, targets, LIMITS, True, MappedArena(node.info))
    sent, (statuses, filled) = drive(gen, [locate_answer(node, 5, keys)], [])
    assert [s.buffers for s in sent] == [[encode(request)]], "one LOCATE, no GET"
    assert statuses == [OK, NOT_FOUND, OK]
    assert filled[0] is targets[0] and bytes(filled[0]) == data_for(1)
    assert filled[1] is None and bytes(filled[2]) == data_for(2)


def test_a_slot_reused_between_locate_and_copy_is_read_again_with_get(node: Node) -> None:
    node.put(k(1), data_for(1))
    node.put(k(2), data_for(2))
    keys = [k(1), k(2)]
    located = locate_answer(node, 6, keys)
    node.tier.delete(k(1))  # after LOCATE, before the copy: the slot is freed and reused
    node.put(k(3), data_for(3))
    get_frame = encode(GetResponse(6, [int(NOT_FOUND)], [0], [0]))
    gen = exchange.get_shared(
        LocateRequest(6, NS, [key[1] for key in keys]), [None, None], LIMITS, False, MappedArena(node.info)
    )
    sent, (statuses, filled) = drive(gen, [located, get_frame], [])
    assert sent[1].buffers == [encode(GetRequest(6, NS, [k(1)[1]]))], "only the reused block goes over the wire"
    assert statuses == [NOT_FOUND, OK] and filled[0] is None, "never the bytes of block 3"
    assert bytes(filled[1]) == data_for(2)


def test_an_answer_for_another_arena_marks_the_mapping_stale_and_gets_everything(node: Node) -> None:
    node.put(k(1), data_for(1))
    reader = MappedArena(node.info)
    located = locate_answer(node, 8, [k(1)], arena_id=12345)
    payload = data_for(1)
    get_frame = encode(GetResponse(8, [int(OK)], [len(payload)], [xxhash.xxh3_64_intdigest(payload)]))
    gen = exchange.get_shared(LocateRequest(8, NS, [k(1)[1]]), [None], LIMITS, True, reader)
    _, (statuses, filled) = drive(gen, [located, get_frame], [payload])
    assert reader.stale and statuses == [OK] and bytes(filled[0]) == payload


def test_shm_get_reports_size_mismatch_without_copying(node: Node) -> None:
    node.put(k(1), data_for(1))
    target = bytearray(b"\xee" * (2 * KiB))
    gen = exchange.get_shared(
        LocateRequest(9, NS, [k(1)[1]]), [memoryview(target)], LIMITS, False, MappedArena(node.info)
    )
    _, (statuses, filled) = drive(gen, [locate_answer(node, 9, [k(1)])], [])
    assert statuses == [ErrorCode.SIZE_MISMATCH] and filled == [None] and target == b"\xee" * (2 * KiB)


def test_meta_size_expected_by_the_client_matches_the_encoder() -> None:
    frame = encode(LocateResponse(1, 2, [OK] * 3, [0] * 3, [1] * 3, [0] * 3, [0] * 3))
    assert len(frame) == HEADER_SIZE + answer_meta_size(Op.LOCATE, 3)


def test_transport_setting_comes_from_config_or_environment() -> None:
    from kvpool_client import ClientConfig
    from kvpool_client.core.errors import UsageError

    assert ClientConfig(nodes=("a:1",)).transport == "auto"
    assert ClientConfig.from_env({"KVPOOL_NODES": "a:1", "KVPOOL_TRANSPORT": " SHM "}).transport == "shm"
    with pytest.raises(UsageError, match="transport"):
        ClientConfig(nodes=("a:1",), transport="rdma")


# -- locations reused without asking the node ------------------------------------------


def knowing_reader(node: Node, ttl_s: float = 1.0) -> tuple[MappedArena, FakeClock]:
    reader, clock = MappedArena(node.info), FakeClock()
    reader.known = KnownLocations(ttl_s, clock=clock)
    return reader, clock


def shm_get(
    reader: MappedArena,
    keys: list[StoreKey],
    frames: list[bytes],
    targets: list[memoryview | None] | None = None,
    verify: bool = False,
) -> tuple[list[Send], list[int], list]:
    """A get of ``keys`` out of the arena (copied from known locations with no I/O, else located and
    copied; ``verify``: the client checks checksums): what it sent, and its result."""
    request = LocateRequest(3, NS, [key[1] for key in keys])
    gen = exchange.get_shared(request, targets or [None] * len(keys), LIMITS, verify, reader)
    sent, (statuses, filled) = drive(gen, frames, [])
    return sent, statuses, filled


def test_a_block_read_before_is_copied_again_without_asking_the_node(node: Node) -> None:
    node.put(k(1), data_for(1))
    node.put(k(2), data_for(2))
    reader, _ = knowing_reader(node)
    keys = [k(1), k(2)]
    sent, statuses, _ = shm_get(reader, keys, [locate_answer(node, 3, keys)])
    assert len(sent) == 1 and statuses == [OK, OK]
    sent, statuses, filled = shm_get(reader, keys, [])
    assert sent == [], f"the node was asked again: {sent}"
    assert statuses == [OK, OK] and [bytes(v) for v in filled] == [data_for(1), data_for(2)]
    sent, _, _ = shm_get(reader, [k(1), k(3)], [locate_answer(node, 3, [k(1), k(3)])])
    assert len(sent) == 1, "a batch with a block not read before asks the node"


@pytest.mark.parametrize("removal", ["delete", "delete while pinned", "evict and reuse"])
def test_a_known_location_of_a_removed_block_is_never_used(node: Node, removal: str) -> None:
    node.put(k(1), data_for(1))
    reader, _ = knowing_reader(node)
    shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
    if removal == "delete":
        node.tier.delete(k(1))
    elif removal == "delete while pinned":
        held = node.tier.acquire(k(1))  # a TCP reader keeps the slot; the block is gone all the same
        node.tier.delete(k(1))
    else:
        for i in range(2, 2 + CAPACITY // (4 * KiB)):
            node.put(k(i), data_for(i))
        assert not node.tier.contains(k(1))
    sent, statuses, filled = shm_get(
        reader, [k(1)], [locate_answer(node, 3, [k(1)]), encode(GetResponse(3, [int(NOT_FOUND)], [0], [0]))]
    )
    assert sent and sent[0].buffers == [encode(LocateRequest(3, NS, [k(1)[1]]))], "the node must be asked"
    assert statuses == [NOT_FOUND] and filled == [None]
    if removal == "delete while pinned":
        node.tier.release(held)


def test_a_known_location_expires_after_its_ttl(node: Node) -> None:
    node.put(k(1), data_for(1))
    reader, clock = knowing_reader(node, ttl_s=0.5)
    shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
    clock.now += 0.4
    assert shm_get(reader, [k(1)], [])[0] == []
    clock.now += 0.2
    sent, statuses, _ = shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
    assert len(sent) == 1 and statuses == [OK], "past its ttl the node is asked (and sees the read)"
    assert shm_get(reader, [k(1)], [])[0] == [], "the new answer is known again"


def test_ttl_zero_asks_the_node_every_time(node: Node) -> None:
    node.put(k(1), data_for(1))
    reader, _ = knowing_reader(node, ttl_s=0.0)
    for _ in range(2):
        sent, statuses, _ = shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
        assert len(sent) == 1 and statuses == [OK]


def test_known_locations_are_bounded() -> None:
    known = KnownLocations(1.0, capacity=4, clock=FakeClock())
    for i in range(10):
        known.remember(NS, b"%d" % i, SlotLocation(i * GRANULE, 1, 0), 0)
    assert known.lookup(NS, [b"9"]) is not None
    assert sum(known.lookup(NS, [b"%d" % i]) is not None for i in range(10)) <= 4


def test_a_known_block_is_checked_against_its_checksum_when_the_node_verifies(node: Node) -> None:
    entry = node.put(k(1), data_for(1))
    readers = []
    for verifies in (False, True):
        reader, _ = knowing_reader(node)
        reader.info = dataclasses.replace(node.info, verify_checksums=verifies)
        shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
        readers.append(reader)
    node.tier.view(entry)[:4] = b"\x00\x01\x02\x03"  # rot in memory: the slot and its generation stay
    trusting, verifying = readers
    assert shm_get(trusting, [k(1)], [])[0] == [], "neither side verifies: the copy is taken as is"
    sent, _, _ = shm_get(verifying, [k(1)], [locate_answer(node, 3, [k(1)])])
    assert sent, "a node that verifies what it serves is asked (and checks) once a known block's bytes do not match"


def test_a_known_block_gone_before_the_copy_costs_no_copy(node: Node) -> None:
    node.put(k(1), data_for(1))
    reader, _ = knowing_reader(node)
    shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])])
    node.tier.delete(k(1))
    target = bytearray(b"\xee" * (4 * KiB))
    sent, statuses, _ = shm_get(reader, [k(1)], [locate_answer(node, 3, [k(1)])], [memoryview(target)])
    assert statuses == [NOT_FOUND] and len(sent) == 1, "asked the node"
    assert target == b"\xee" * (4 * KiB), "the stale location was copied from"
