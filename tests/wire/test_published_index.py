"""The published index's layout: the daemon's writer against a dict, read by the lock-free reader.

The properties under test: a reader finds every block published and not withdrawn,
never finds one that is not, and never returns an entry a writer is in the middle of
(a writer stopped between the two halves of its seqlock). No files: the table is a
bytearray, as the layout module is sans-IO; the shm tests map a real one.
"""

from __future__ import annotations

import random

import pytest
import xxhash
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvpool_client.core.wire import published as layout
from kvpool_client.core.wire.published import (
    ENTRY_WORDS,
    HEADER_WORDS,
    MarkWriter,
    PublishedEntry,
    PublishedReader,
    decode_header,
    key_digest,
    marks_bytes,
    table_bytes,
)
from kvpool_server.index.entry import StoreKey
from kvpool_server.index.published import HitMarks, PublishedIndex

ENTRIES, PROBES = 16, 4
KEYS: list[StoreKey] = [("model@fp16", b"h%02d" % i) for i in range(24)]
KEYS += [("other@ns", b"h%02d" % i) for i in range(8)]


def new_table(entries: int = ENTRIES, probes: int = PROBES) -> tuple[PublishedIndex, PublishedReader, memoryview]:
    memory = memoryview(bytearray(table_bytes(entries)))
    writer = PublishedIndex(memory, entries, arena_id=0xA1, probe_limit=probes)
    return writer, PublishedReader(memory), memory.cast("Q")


def fields_of(i: int) -> tuple[int, int, int, int]:
    """(offset, length, checksum, generation) the test publishes for block ``i``."""
    return 4096 * (i + 1), 1000 + i, 0xC0DE0000 + i, 7 * i


def found_fields(entry: PublishedEntry | None) -> tuple[int, int, int, int] | None:
    return None if entry is None else (entry.offset, entry.length, entry.checksum, entry.generation)


class TableMachine(RuleBasedStateMachine):
    """Publishes and withdraws (block i holds KEYS[i]) against a dict; readers see exactly the dict."""

    def __init__(self) -> None:
        super().__init__()
        self.writer, self.reader, self.words = new_table()
        self.model: dict[int, tuple[int, int, int, int]] = {}
        self.generation = 0  # publishes of a block get new fields, as a reused slot would

    @rule(i=st.integers(0, len(KEYS) - 1))
    def publish(self, i: int) -> None:
        self.generation += 1
        offset, length, checksum, _ = fields_of(i)
        fields = (offset, length, checksum, self.generation)
        if self.writer.publish(i, self.writer.digest(KEYS[i]), *fields):
            self.model[i] = fields
            event("publish: stored")
        else:
            self.model.pop(i, None)  # a block's old entry goes whatever happens
            event("publish: window full")

    @rule(i=st.integers(0, len(KEYS) - 1))
    def withdraw(self, i: int) -> None:
        self.writer.withdraw(i)
        self.model.pop(i, None)

    @rule(
        entry=st.integers(0, ENTRIES - 1),
        i=st.integers(0, len(KEYS) - 1),
        written=st.integers(0, 6),
        junk=st.integers(0, (1 << 64) - 1),
    )
    def writer_stopped_midway(self, entry: int, i: int, written: int, junk: int) -> None:
        """The writer made ``entry``'s seq odd and rewrote some of its fields for key ``i``, then stopped."""
        base = HEADER_WORDS + entry * ENTRY_WORDS
        saved = self.words[base : base + ENTRY_WORDS].tolist()
        low, high = key_digest(KEYS[i][0].encode(), KEYS[i][1])
        new = [low, high, junk, 1 + junk % 4096, junk, junk]
        self.words[base] = saved[0] + 1
        for word in range(written):
            self.words[base + 1 + word] = new[word]
        for j, key in enumerate(KEYS):
            found = self.reader.find(*key)
            assert found is None or found.slot != entry, f"entry {entry} read while its writer was mid-update"
            if found is not None:
                assert found_fields(found) == self.model.get(j), f"{key} found with fields it was not published with"
        for word, value in enumerate(saved[1:], start=1):  # the writer resumes: it puts the entry back
            self.words[base + word] = value
        self.words[base] = saved[0] + 2

    @invariant()
    def readers_see_exactly_the_model(self) -> None:
        for i, key in enumerate(KEYS):
            found = self.reader.find(*key)
            assert found_fields(found) == self.model.get(i), f"block {i}: found {found}, published {self.model.get(i)}"
            if found is not None:
                assert self.writer.block_at(found.slot) == i
        assert self.writer.published == len(self.model)

    @invariant()
    def every_seq_is_even(self) -> None:
        seqs = self.words[HEADER_WORDS::ENTRY_WORDS].tolist()
        assert all(seq % 2 == 0 for seq in seqs), seqs


TableMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestTable = TableMachine.TestCase


def test_a_full_window_is_skipped_and_a_withdrawal_makes_room() -> None:
    writer, reader, _ = new_table(entries=16, probes=2)
    homes: dict[int, list[int]] = {}
    for i in range(200):  # three keys sharing a home: the third finds no room in a window of two
        key = ("ns", b"%d" % i)
        homes.setdefault(key_digest(b"ns", key[1])[0] % 16, []).append(i)
    crowded = next(ids for ids in homes.values() if len(ids) >= 3)[:3]
    assert [writer.publish(i, writer.digest(("ns", b"%d" % i)), *fields_of(i)) for i in crowded] == [True, True, False]
    assert reader.find("ns", b"%d" % crowded[2]) is None
    writer.withdraw(crowded[0])
    assert reader.find("ns", b"%d" % crowded[0]) is None
    assert writer.publish(crowded[2], writer.digest(("ns", b"%d" % crowded[2])), *fields_of(crowded[2]))
    assert found_fields(reader.find("ns", b"%d" % crowded[2])) == fields_of(crowded[2])
    assert found_fields(reader.find("ns", b"%d" % crowded[1])) == fields_of(crowded[1])


def test_withdrawing_leaves_tombstones_only_where_a_probe_must_go_on() -> None:
    writer, reader, words = new_table(entries=16, probes=16)
    keys = [("ns", b"%d" % i) for i in range(6)]
    for i, key in enumerate(keys):
        assert writer.publish(i, writer.digest(key), *fields_of(i))
    digests = {i: key_digest(b"ns", key[1])[0] for i, key in enumerate(keys)}
    for i in range(6):
        writer.withdraw(i)
        for j in range(i + 1, 6):
            assert found_fields(reader.find(*keys[j])) == fields_of(j)
    live = words[HEADER_WORDS + 1 :: ENTRY_WORDS].tolist()
    assert live == [0] * 16, f"every entry is empty again once all are withdrawn: {live} ({digests})"


def test_the_header_says_which_arena_and_whether_it_is_served() -> None:
    writer, reader, _ = new_table()
    assert (reader.header.arena_id, reader.header.entries, reader.header.probe_limit) == (0xA1, ENTRIES, PROBES)
    assert reader.live
    writer.retire()
    assert not reader.live


@pytest.mark.parametrize("broken", ["magic", "size", "probes"])
def test_a_header_that_is_not_a_published_index_is_refused(broken: str) -> None:
    memory = bytearray(table_bytes(ENTRIES))
    PublishedIndex(memoryview(memory), ENTRIES, 1, PROBES)
    words = memoryview(memory).cast("Q")
    if broken == "magic":
        memory[:8] = b"KVPGEN01"
    elif broken == "size":
        words[2] = 12  # not a power of two
    else:
        words[3] = ENTRIES + 1
    with pytest.raises(ValueError):
        decode_header(memory)
    with pytest.raises(ValueError):
        PublishedReader(memoryview(memory))


def test_a_zero_digest_is_given_another_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Digest 0 marks an empty entry, so no key may have it."""
    monkeypatch.setattr(xxhash, "xxh3_128_intdigest", lambda data: 0)
    assert key_digest(b"ns", b"any") == (1, 0)
    writer, reader, _ = new_table()
    assert writer.publish(3, writer.digest(("ns", b"any")), *fields_of(3))
    assert found_fields(reader.find("ns", b"any")) == fields_of(3)


def test_the_digest_covers_the_namespace_length() -> None:
    """A length prefix keeps ("ab", "c...") and ("a", "bc...") apart."""
    assert key_digest(b"ab", b"c" * 32) != key_digest(b"a", b"bc" + b"c" * 31)
    assert layout.key_digest(b"ns", b"x") == key_digest(b"ns", b"x")


# -- hit marks ----------------------------------------------------------------------------


def marks_pair(entries: int) -> tuple[MarkWriter, HitMarks, memoryview]:
    memory = memoryview(bytearray(marks_bytes(entries)))
    return MarkWriter(memory, entries), HitMarks(memory, entries), memory.cast("Q")


def test_drain_returns_marked_entries_least_recent_first_and_only_once() -> None:
    writer, marks, _ = marks_pair(8192)  # two chunks of 4096
    order = [5000, 3, 4097, 77]
    for tick, entry in enumerate(order, start=100):
        writer.mark(entry, tick)
    assert marks.drain() == order
    assert marks.drain() == []
    writer.mark(3, 200)
    writer.mark(5000, 150)
    assert marks.drain() == [5000, 3]
    writer.mark(3, 200)  # the same tick again: no news
    assert marks.drain() == []


def test_a_mark_whose_dirty_word_was_lost_is_found_by_a_full_drain() -> None:
    writer, marks, words = marks_pair(1024)
    writer.mark(9, 300)
    words[0] = 0  # the drain's clearing store landed after this reader's dirty store
    assert marks.drain() == []
    assert marks.drain(full=True) == [9]


def test_marks_of_many_readers_in_random_order() -> None:
    writer, marks, _ = marks_pair(4096)
    rng = random.Random(5)
    ticks = {entry: rng.randrange(1, 1 << 40) for entry in rng.sample(range(4096), 300)}
    for entry, tick in ticks.items():
        writer.mark(entry, tick)
    assert marks.drain() == sorted(ticks, key=ticks.__getitem__)
