"""Placement with replicas and node states: write owners, read order, spares; balance and movement."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kvpool_client.core.errors import UsageError
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.membership.records import NodeState
from kvpool_client.core.routing import Member, RendezvousRouter, StaticRouter, place, place_key, rank

ACTIVE, DRAINING, JOINING = NodeState.ACTIVE, NodeState.DRAINING, NodeState.JOINING
KEYS = 20_000


def hashes(count: int, seed: int = 99) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(32) for _ in range(count)]


def node(node_id: str, state: NodeState = ACTIVE, weight: float = 1.0) -> Member:
    return Member(node_id, f"{node_id}.local:7000", weight, state)


def ids(members: tuple[Member, ...] | list[Member]) -> list[str]:
    return [m.node_id for m in members]


def test_all_active_write_owners_are_the_top_r_and_read_order_the_same() -> None:
    members = [node(n) for n in "abcde"]
    for h in hashes(500):
        placed = place_key(h, members, 2)
        assert ids(placed.write_owners) == ids(place(h, members, 2))
        assert placed.read_order == placed.write_owners
        assert ids(placed.spares) == ids(rank(h, members)[2:]), "spares: the other active nodes, in rank order"


def test_a_draining_node_keeps_its_read_rank_but_takes_no_writes() -> None:
    states = {"a": ACTIVE, "b": DRAINING, "c": ACTIVE, "d": ACTIVE}
    members = [node(n, s) for n, s in states.items()]
    seen_draining_in_reads = 0
    for h in hashes(2000):
        ranked = ids(rank(h, members))
        placed = place_key(h, members, 2)
        active_ranked = [n for n in ranked if states[n] == ACTIVE]
        assert ids(placed.write_owners) == active_ranked[:2]
        assert "b" not in ids(placed.write_owners) and "b" not in ids(placed.spares)
        # The read order is the ranking cut right after the second active node.
        cut = ranked.index(active_ranked[1]) + 1
        assert ids(placed.read_order) == ranked[:cut], (ranked, ids(placed.read_order))
        seen_draining_in_reads += "b" in ids(placed.read_order)
    # b is read first or second whenever it outranks the second active node: half the keys.
    assert abs(seen_draining_in_reads / 2000 - 0.5) <= 0.05, seen_draining_in_reads


def test_joining_nodes_are_never_placed() -> None:
    members = [node("a"), node("b"), node("j1", JOINING), node("j2", JOINING)]
    for h in hashes(1000):
        placed = place_key(h, members, 3)
        every = ids(placed.write_owners) + ids(placed.read_order) + ids(placed.spares)
        assert not {"j1", "j2"} & set(every), every
        assert sorted(ids(placed.write_owners)) == ["a", "b"], "R above the active count places every active node"


def test_no_active_node_places_no_writer_but_still_reads_from_draining_ones() -> None:
    members = [node("a", DRAINING), node("b", DRAINING), node("c", JOINING)]
    placed = place_key(b"k" * 32, members, 2)
    assert placed.write_owners == () and placed.spares == ()
    assert sorted(ids(placed.read_order)) == ["a", "b"]
    assert place_key(b"k" * 32, [], 2) == place_key(b"k" * 32, [node("j", JOINING)], 2)


def test_balance_of_replicas_within_ten_percent() -> None:
    members = [node(f"n{i}") for i in range(5)]
    counts: Counter[str] = Counter()
    for h in hashes(KEYS):
        counts.update(ids(place_key(h, members, 2).write_owners))
    mean = KEYS * 2 / 5
    assert all(abs(c / mean - 1) <= 0.10 for c in counts.values()), counts


def test_draining_a_node_moves_only_its_write_ownership() -> None:
    before_members = [node(n) for n in "abcde"]
    after_members = [node(n, DRAINING if n == "c" else ACTIVE) for n in "abcde"]
    moved = 0
    for h in hashes(KEYS):
        before = place_key(h, before_members, 2)
        after = place_key(h, after_members, 2)
        if "c" in ids(before.write_owners):
            moved += 1
            expected = (set(ids(before.write_owners)) - {"c"}) | {before.spares[0].node_id}
            assert set(ids(after.write_owners)) == expected, "c's share goes to the next active node"
            assert "c" in ids(after.read_order), "c still serves the blocks it holds"
        else:
            assert after.write_owners == before.write_owners, "keys c did not own do not move"
            assert after.read_order == before.read_order
    assert abs(moved / KEYS - 2 / 5) <= 0.03, moved


def test_a_stale_owners_spare_is_the_fresh_owner() -> None:
    """The spare a put falls back to after DRAINING is the owner a router that knows of the drain picks."""
    stale = [node(n) for n in "abcd"]
    fresh = [node(n, DRAINING if n == "b" else ACTIVE) for n in "abcd"]
    for h in hashes(2000):
        old = place_key(h, stale, 2)
        if "b" not in ids(old.write_owners):
            continue
        substitute = old.spares[0]
        new = place_key(h, fresh, 2)
        assert set(ids(new.write_owners)) == (set(ids(old.write_owners)) - {"b"}) | {substitute.node_id}


def test_adding_a_node_moves_about_r_over_n_of_replica_slots() -> None:
    before_members = [node(n) for n in "abcd"]
    after_members = [*before_members, node("new")]
    changed = 0
    for h in hashes(KEYS):
        before = set(ids(place_key(h, before_members, 2).write_owners))
        after = set(ids(place_key(h, after_members, 2).write_owners))
        assert len(before - after) <= 1 and after - before <= {"new"}, (before, after)
        changed += before != after
    assert abs(changed / KEYS - 2 / 5) <= 0.03, changed / KEYS


def test_router_methods_agree_with_the_pure_function() -> None:
    members = [node("a"), node("b", DRAINING), node("c"), node("d", JOINING)]
    router = RendezvousRouter(members, replicas=2)
    for h in hashes(300):
        key = BlockKey("ns", h)
        placed = place_key(h, members, 2)
        assert router.placement(key) == placed
        assert router.write_owners(key) == list(placed.write_owners)
        assert router.read_order(key) == list(placed.read_order)
    assert ids(router.members()) == ["a", "b", "c", "d"]


def test_router_validation() -> None:
    with pytest.raises(UsageError, match="duplicate"):
        RendezvousRouter([node("a"), node("a")])
    with pytest.raises(UsageError, match="replicas"):
        RendezvousRouter([node("a")], replicas=0)
    assert RendezvousRouter([], 2).placement(BlockKey("ns", b"k" * 32)).read_order == ()


def test_static_router_replicas_cover_distinct_addresses() -> None:
    router = StaticRouter(["h1:1", "h2:1", "h3:1"], replicas=2)
    for h in hashes(300):
        placed = router.placement(BlockKey("ns", h))
        assert len(set(ids(placed.write_owners))) == 2 and placed.read_order == placed.write_owners
        assert len(placed.spares) == 1
