"""The compiled same-node reader against its pure-Python twin, on one table, arena and generations.

The property under test: for any sequence of publishes, withdrawals, slot frees (eviction,
reuse) and writers stopped mid-entry, ``ArenaReader.read`` finds what ``PublishedReader.find``
finds, copies exactly when the slot's generation holds before and after (as
``MappedArena.copy_held``), whatever the destination's alignment, and marks each kept read as
``MarkWriter.mark`` would. (The Python reader marks at the find, before its copy: a mark of a
read that then fails refreshes a slot the daemon freed already, which changes nothing.) No
files: the daemon's writer fills in-memory buffers.
"""

from __future__ import annotations

import itertools
import random
import threading

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from kvpool_client.core.channels.copy import PAGE, VECTOR_FROM, address, short_page_distance
from kvpool_client.core.wire import _arena_reader as compiled
from kvpool_client.core.wire.generations import GRANULE
from kvpool_client.core.wire.published import (
    ENTRY_WORDS,
    HEADER_WORDS,
    MarkWriter,
    PublishedReader,
    marks_bytes,
    table_bytes,
)
from kvpool_client.transport import shm
from kvpool_server.index.entry import StoreKey
from kvpool_server.index.published import PublishedIndex

ENTRIES, PROBES = 16, 4
SLOT_GRANULES = 2  # a slot spans two granules: blocks of up to 8 KiB, past the vector copy's 4 KiB
SLOTS = 6
KEYS: list[StoreKey] = [("model@fp16", b"h%02d" % i) for i in range(12)]
Read = tuple[int, int, int, int, int, bool] | None


def test_the_compiled_reader_is_what_the_client_uses() -> None:
    assert shm._arena_reader is compiled, "deploy/dev.sh builds it with the package (pip install -e)"


class Node:
    """A table, an arena and its generations as a daemon keeps them, and both readers of them."""

    def __init__(self, arena_bytes: int = SLOTS * SLOT_GRANULES * GRANULE, vector_near: bool = True) -> None:
        self.table = memoryview(bytearray(table_bytes(ENTRIES)))
        self.writer = PublishedIndex(self.table, ENTRIES, arena_id=0xA1, probe_limit=PROBES)
        self.arena = bytearray(arena_bytes)
        self.generations = memoryview(bytearray(8 * (arena_bytes // GRANULE))).cast("Q")
        self.reader = PublishedReader(self.table)
        self.python_marks = MarkWriter(memoryview(bytearray(marks_bytes(ENTRIES))), ENTRIES)
        self.compiled_marks = MarkWriter(memoryview(bytearray(marks_bytes(ENTRIES))), ENTRIES)
        self.vector_near = vector_near
        marks = self.compiled_marks
        self.compiled = compiled.ArenaReader(
            self.reader.words, self.generations, memoryview(self.arena), marks.words, ENTRIES, PROBES, GRANULE,
            marks.first, marks.shift, vector_near,
        )  # fmt: skip

    def python_read(self, key: StoreKey, target: memoryview, tick: int) -> Read:
        """What the pure-Python path does for one read: find, check, copy, check, mark."""
        found = self.reader.find(*key)
        if found is None:
            return None
        slot = found.offset // GRANULE
        copied = len(target) == found.length and self.generations[slot] == found.generation
        if copied:
            target[:] = self.arena[found.offset : found.offset + found.length]
            copied = self.generations[slot] == found.generation
        if copied:
            self.python_marks.mark(found.slot, tick)
        return found.slot, found.offset, found.length, found.checksum, found.generation, copied

    def compiled_read(self, key: StoreKey, target: memoryview | tuple[memoryview, ...], tick: int) -> Read:
        return self.compiled.read(*self.reader.digest(*key), target, tick)


def destination(length: int, source: int, distance: int) -> memoryview:
    """``length`` bytes ``distance`` bytes past ``source`` (an address) modulo a page: 1-63, a
    copy the vector loop takes where it is on, else memcpy (``copy.short_page_distance``)."""
    raw = bytearray(length + PAGE)
    start = (source + distance - address(memoryview(raw))) % PAGE
    return memoryview(raw)[start : start + length]


def spans(target: memoryview, cuts: list[int]) -> tuple[memoryview, ...]:
    """``target`` cut at ``cuts`` (clipped to its length) into consecutive spans, empty ones included."""
    points = [0, *sorted(min(c, len(target)) for c in cuts), len(target)]
    return tuple(target[a:b] for a, b in itertools.pairwise(points))


class ReaderMachine(RuleBasedStateMachine):
    node: Node

    def __init__(self) -> None:
        super().__init__()
        self.tick = 0

    @initialize(vector_near=st.booleans())
    def open_node(self, vector_near: bool) -> None:
        """Either copy route for blocks at a short page distance: the vector loop or memcpy."""
        self.node = Node(vector_near=vector_near)

    @rule(
        i=st.integers(0, len(KEYS) - 1),
        slot=st.integers(0, SLOTS - 1),
        length=st.one_of(st.integers(1, 8192), st.integers(VECTOR_FROM, 8192)),  # half of them for the vector loop
    )
    def publish(self, i: int, slot: int, length: int) -> None:
        node, offset = self.node, slot * SLOT_GRANULES * GRANULE
        node.arena[offset : offset + length] = random.Random(i * 7919 + length).randbytes(length)
        generation = node.generations[offset // GRANULE]
        node.writer.publish(i, node.writer.digest(KEYS[i]), offset, length, 0xC0DE + i, generation)

    @rule(i=st.integers(0, len(KEYS) - 1))
    def withdraw(self, i: int) -> None:
        self.node.writer.withdraw(i)

    @rule(slot=st.integers(0, SLOTS - 1))
    def free_slot(self, slot: int) -> None:
        """Evicted or deleted: the generation moves first, then another block's bytes may land."""
        node, offset = self.node, slot * SLOT_GRANULES * GRANULE
        node.generations[offset // GRANULE] += 1
        node.arena[offset : offset + 64] = b"\xee" * 64

    @rule(entry=st.integers(0, ENTRIES - 1), data=st.data())
    def writer_stopped_midway(self, entry: int, data: st.DataObject) -> None:
        """A writer made ``entry``'s seq odd and stopped: neither reader takes that entry."""
        words = self.node.table.cast("Q")
        base = HEADER_WORDS + entry * ENTRY_WORDS
        words[base] += 1
        try:
            self.read(data.draw(st.integers(0, len(KEYS) - 1)), 0, False, [])
        finally:
            words[base] += 1

    @rule(
        i=st.integers(0, len(KEYS) - 1),
        distance=st.sampled_from([0, 16, 64, 1, 2064]),
        short=st.booleans(),
        cuts=st.lists(st.integers(0, 8192), max_size=5),
    )
    def read(self, i: int, distance: int, short: bool, cuts: list[int]) -> None:
        """``cuts`` split the compiled read's destination into spans (a block whose layers lie apart):
        the spans, in order, must end up holding what one buffer holds."""
        node, self.tick = self.node, self.tick + 1
        found = node.reader.find(*KEYS[i])
        length = (found.length if found is not None else 4096) - short
        source = address(memoryview(node.arena)) + (found.offset if found is not None else 0)
        ours, theirs = destination(length, source, distance), destination(length, source, distance)
        expected = node.python_read(KEYS[i], theirs, self.tick)
        got = node.compiled_read(KEYS[i], spans(ours, cuts) if cuts else ours, self.tick)
        assert got == expected, f"key {i}: compiled read {got}, Python read {expected}"
        event("not published" if got is None else "copied" if got[5] else "not copied (generation or length)")
        if got is not None and got[5] and length >= VECTOR_FROM:
            vector = node.vector_near and short_page_distance(distance)
            event("a block copied by the vector loop" if vector else "a block copied by memcpy")
        if got is not None and got[5]:
            assert bytes(ours) == bytes(theirs), f"key {i}: the copies differ ({distance} bytes past the source)"
        assert node.compiled_marks.words.tobytes() == node.python_marks.words.tobytes(), "marks differ"


TestReaderMachine = settings(max_examples=60, stateful_step_count=40, deadline=None)(ReaderMachine).TestCase


@pytest.mark.parametrize("vector", [True, False], ids=["vector loop on", "memcpy only"])
@pytest.mark.parametrize("distance", [0, 1, 16, 63, 64, 2064])
@pytest.mark.parametrize("length", [VECTOR_FROM - 1, VECTOR_FROM, VECTOR_FROM + 77, 8192])
def test_every_copy_route_copies_every_byte(vector: bool, distance: int, length: int) -> None:
    """Each distance from the slot, modulo a page, on either route: the vector loop takes 1-63
    (the state machine above draws them too, but few of its reads copy a block of 4 KiB or more)."""
    node = Node(vector_near=vector)
    offset = SLOT_GRANULES * GRANULE
    block = random.Random(length + distance).randbytes(length)
    node.arena[offset : offset + length] = block
    node.writer.publish(0, node.writer.digest(KEYS[0]), offset, length, 1, node.generations[offset // GRANULE])
    target = destination(length, address(memoryview(node.arena)) + offset, distance)
    got = node.compiled_read(KEYS[0], target, 1)
    assert got is not None and got[5], got
    assert bytes(target) == block, f"{length} bytes {distance} past the slot differ (vector loop {vector})"


def test_a_slot_freed_during_the_copy_is_never_read_as_the_block() -> None:
    """The generation read after the copy: a block large enough that the copy lets the GIL go
    (and takes about a millisecond), freed and overwritten by another thread while it is copied.
    The reader must refuse every copy that overlapped the overwrite."""
    size = 8 << 20
    node = Node(size)
    original = random.Random(1).randbytes(size)
    junk = b"\xee" * size
    target = memoryview(bytearray(size))
    go, done, stop = threading.Event(), threading.Event(), threading.Event()

    def reuse_slot() -> None:  # as the daemon reuses a slot: the generation first, then the new bytes
        while go.wait() and not stop.is_set():
            go.clear()
            node.generations[0] += 1
            node.arena[:] = junk
            done.set()

    reuser = threading.Thread(target=reuse_slot)
    reuser.start()
    refused = 0
    try:
        for attempt in range(200):
            node.arena[:] = original
            node.writer.publish(0, node.writer.digest(KEYS[0]), 0, size, 0, node.generations[0])
            done.clear()
            go.set()  # the reuser waits for the GIL, which the copy lets go
            got = node.compiled_read(KEYS[0], target, attempt)
            assert done.wait(30), "the reusing thread did not run"
            assert got is not None
            if got[5]:
                assert bytes(target) == original, f"attempt {attempt}: a copy that overlapped a reuse was kept"
            else:
                refused += 1
            if refused >= 5:
                break
    finally:
        stop.set()
        go.set()
        reuser.join(30)
    assert refused, "no reuse overlapped a copy in 200 attempts: the test proved nothing"


def test_an_entry_outside_the_arena_is_an_error_not_a_read() -> None:
    node = Node()
    beyond = len(node.arena)
    for i, (offset, length) in enumerate([(beyond, 100), (GRANULE + 8, 100), (0, beyond + 1)]):
        node.writer.publish(i, node.writer.digest(KEYS[i]), offset, length, 0, 0)
        with pytest.raises(ValueError, match="not a slot of the arena"):
            node.compiled_read(KEYS[i], memoryview(bytearray(length)), 1)


def test_a_read_only_destination_is_refused() -> None:
    node = Node()
    node.writer.publish(0, node.writer.digest(KEYS[0]), 0, 100, 0, 0)
    with pytest.raises(BufferError):
        node.compiled_read(KEYS[0], memoryview(bytes(100)), 1)


def test_buffers_too_small_for_their_layout_are_refused() -> None:
    node = Node()
    marks = node.compiled_marks
    with pytest.raises(ValueError, match="table"):
        compiled.ArenaReader(
            node.reader.words[:8], node.generations, node.arena, marks.words, ENTRIES, PROBES, GRANULE, 1, 4, True
        )
    with pytest.raises(ValueError, match="power of two"):
        compiled.ArenaReader(
            node.reader.words, node.generations, node.arena, marks.words, 12, PROBES, GRANULE, 1, 4, True
        )


def test_a_released_reader_reads_nothing() -> None:
    node = Node()
    node.writer.publish(0, node.writer.digest(KEYS[0]), 0, 100, 0, 0)
    node.compiled.release()
    with pytest.raises(ValueError, match="holds no buffers"):
        node.compiled_read(KEYS[0], memoryview(bytearray(100)), 1)
    with pytest.raises(ValueError, match="holds no buffers"):
        compiled.ArenaReader.__new__(compiled.ArenaReader).read(1, 2, bytearray(1), 3)
