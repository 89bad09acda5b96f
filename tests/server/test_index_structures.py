"""The compact index's building blocks against plain Python models: key table, intrusive lists, segment runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvpool_server.index.keys import KeyTable
from kvpool_server.index.lists import LinkedLists
from kvpool_server.index.runs import SegmentRecords

NAMESPACES = ["a", "b", "model@fp16"]
# short hashes collide in the table's home slots often, which is what the probing must survive
hashes = st.binary(min_size=0, max_size=3)
keys = st.tuples(st.sampled_from(NAMESPACES), hashes)


class KeyTableMachine(RuleBasedStateMachine):
    """Insert, unmap and release in any order: lookups always agree with a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.table = KeyTable()
        self.mapped: dict[tuple[str, bytes], int] = {}
        self.unmapped: dict[int, tuple[str, bytes]] = {}  # ids unmapped, not yet released

    @rule(key=keys)
    def insert(self, key: tuple[str, bytes]) -> None:
        if key in self.mapped:
            with pytest.raises(KeyError):
                self.table.insert(key)
            return
        ident = self.table.insert(key)
        assert ident not in self.mapped.values() and ident not in self.unmapped, f"id {ident} handed out twice"
        self.mapped[key] = ident

    @precondition(lambda self: self.mapped)
    @rule(data=st.data())
    def unmap(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.mapped)))
        ident = self.mapped.pop(key)
        self.table.unmap(ident)
        self.unmapped[ident] = key
        assert self.table.key_of(ident) == key, "an unmapped id still names its key until released"

    @precondition(lambda self: self.unmapped)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ident = data.draw(st.sampled_from(sorted(self.unmapped)))
        del self.unmapped[ident]
        self.table.release(ident)

    @rule(key=keys)
    def find(self, key: tuple[str, bytes]) -> None:
        assert self.table.find(key) == self.mapped.get(key, -1), f"find({key}) disagrees with {self.mapped}"

    @invariant()
    def agrees(self) -> None:
        assert len(self.table) == len(self.mapped)
        assert sorted(self.table.mapped_ids()) == sorted(self.mapped.values())
        for key, ident in self.mapped.items():
            assert self.table.find(key) == ident and self.table.key_of(ident) == key, (key, ident)


TestKeyTable = KeyTableMachine.TestCase
TestKeyTable.settings = settings(max_examples=60, stateful_step_count=80, deadline=None)


@given(st.lists(st.binary(min_size=1, max_size=8), unique=True, max_size=3000))
@settings(max_examples=20, deadline=None)
def test_key_table_grows_through_bulk_rebuilds_and_finds_every_key(block_hashes: list[bytes]) -> None:
    table = KeyTable()
    ids = {h: table.insert(("ns", h)) for h in block_hashes}
    for h, ident in ids.items():
        assert table.find(("ns", h)) == ident, f"{h!r} lost in a resize"
    assert table.find(("other", block_hashes[0] if block_hashes else b"")) == -1


def test_key_table_sized_up_front_finds_keys_that_wrap_around_its_end() -> None:
    table = KeyTable(expected=100_000)
    ids = [table.insert(("ns", i.to_bytes(4, "little"))) for i in range(100_000)]
    assert [table.find(("ns", i.to_bytes(4, "little"))) for i in range(100_000)] == ids
    assert table.nbytes() < 100_000 * 100, f"{table.nbytes() / 100_000:.0f} bytes a key"


class ListsMachine(RuleBasedStateMachine):
    """Intrusive lists agree with Python lists under append, move and remove."""

    def __init__(self) -> None:
        super().__init__()
        self.lists = LinkedLists()
        self.model: dict[int, list[int]] = {}

    @rule(lst=st.integers(0, 3), node=st.integers(0, 200))
    def append(self, lst: int, node: int) -> None:
        for members in self.model.values():
            if node in members:
                members.remove(node)
        self.model.setdefault(lst, []).append(node)
        self.lists.append(lst, node)

    @rule(node=st.integers(0, 200))
    def move_to_tail(self, node: int) -> None:
        owner = next((lst for lst, members in self.model.items() if node in members), -1)
        if owner >= 0:
            self.model[owner].remove(node)
            self.model[owner].append(node)
        assert self.lists.move_to_tail(node) == (owner >= 0), f"node {node} was in {owner}"

    @rule(node=st.integers(0, 200))
    def remove(self, node: int) -> None:
        owner = next((lst for lst, members in self.model.items() if node in members), -1)
        if owner >= 0:
            self.model[owner].remove(node)
        assert self.lists.remove(node) == owner, f"node {node} was in {owner}"

    @invariant()
    def agrees(self) -> None:
        for lst in range(4):
            expected = self.model.get(lst, [])
            assert list(self.lists.nodes(lst)) == expected and self.lists.size(lst) == len(expected), (
                f"list {lst}: {list(self.lists.nodes(lst))}, expected {expected}"
            )


TestLinkedLists = ListsMachine.TestCase
TestLinkedLists.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


def test_segment_records_walk_live_neighbours_and_refuse_going_back() -> None:
    run = SegmentRecords()
    for offset, block in ((0, 7), (100, 8), (250, 9)):
        run.append(offset, block)
    assert run.at(100) == (1, 8) and run.at(50) == (-1, -1)
    assert run.before(250) == (1, 8) and run.before(0) == (-1, -1)
    run.kill(100)
    assert run.at(100) == (1, -1) and run.live() == [7, 9]
    assert run.entry(2) == (250, 9) and run.entry(3) == (-1, -1)
    with pytest.raises(ValueError, match="not past"):
        run.append(250, 10)
