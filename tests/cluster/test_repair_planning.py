"""Repair planning, without sockets: which keys go to which owner, what counts as a change, pacing.

The plan must send each block exactly where clients write and read it (the same
rendezvous placement as the client's router), never to this node, and only to
active nodes.
"""

from __future__ import annotations

import random
from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_client.core.keys import BlockKey
from kvpool_client.core.membership.records import ClusterConfig, NodeRecord, NodeState
from kvpool_client.core.membership.view import Membership
from kvpool_client.core.routing import Member, RendezvousRouter
from kvpool_server.membership.copies import Pacer, chunks, plan_copies
from kvpool_server.membership.repair import topology_of
from tests.support.clock import FakeClock

NS = "repair@u8"


def members(count: int) -> list[Member]:
    return [Member(f"node-{i}", f"127.0.0.1:{7000 + i}") for i in range(count)]


def store_keys(count: int, seed: int = 7) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    return [(NS, rng.randbytes(32)) for _ in range(count)]


# -- plan_copies ---------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 6),
    replicas=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    self_index=st.integers(0, 5),
)
def test_each_key_goes_to_exactly_its_owners_other_than_this_node(nodes: int, replicas: int, seed: int,
                                                                   self_index: int) -> None:  # fmt: skip
    cluster = members(nodes)
    self_id = f"node-{self_index}"  # may name a node outside the cluster (a joining or draining one)
    keys = store_keys(40, seed)
    plan = plan_copies(keys, cluster, replicas, exclude=self_id)
    router = RendezvousRouter(cluster, replicas)
    for key in keys:
        owners = {m.node_id for m in router.placement(BlockKey(*key)).write_owners}
        planned = {node for node, owned in plan.items() if key in owned}
        assert planned == owners - {self_id}
    assert all(owned for owned in plan.values()), "owners with nothing to receive are left out"
    assert self_id not in plan


def test_keys_keep_their_order_per_owner_and_appear_once() -> None:
    keys = store_keys(500)
    plan = plan_copies(keys, members(4), 2)
    position = {key: i for i, key in enumerate(keys)}
    for owned in plan.values():
        assert [position[k] for k in owned] == sorted(position[k] for k in owned)
        assert len(set(owned)) == len(owned)
    assert sum(len(owned) for owned in plan.values()) == 2 * len(keys)


def test_a_joining_node_is_sent_about_its_share_and_the_others_most_of_theirs_already_held() -> None:
    """Four nodes, R=2, then a fifth joins: it owns about 2/5 of the keys, and every other
    owner of a key kept most of them (rendezvous moves only what the new node takes)."""
    keys = store_keys(5000)
    before = plan_copies(keys, members(4), 2)
    after = plan_copies(keys, members(5), 2)
    share = len(after["node-4"]) / len(keys)
    assert 0.35 < share < 0.45, share
    for node, owned in before.items():
        assert set(after[node]) <= set(owned), "a key never moves to an existing node when one joins"


def test_fewer_nodes_than_replicas_places_on_all_of_them() -> None:
    keys = store_keys(10)
    plan = plan_copies(keys, members(2), 3, exclude="node-0")
    assert plan == {"node-1": keys}


def test_no_members_plans_nothing() -> None:
    assert plan_copies(store_keys(5), [], 2) == {}


def test_chunks_cover_everything_in_order() -> None:
    keys = store_keys(70)
    parts = list(chunks(keys, 32))
    assert [len(p) for p in parts] == [32, 32, 6]
    assert [k for p in parts for k in p] == keys


# -- topology: what counts as a change --------------------------------------------------------------


def record(node_id: str, state: NodeState = NodeState.ACTIVE, started: float = 1.0, weight: float = 1.0) -> NodeRecord:
    port = 7000 + int(node_id.rsplit("-", 1)[1])
    return NodeRecord(node_id, f"127.0.0.1:{port}", {"tcp": f"127.0.0.1:{port + 100}"}, state, 0, weight, "t", started)


def snapshot(*records: NodeRecord, config: ClusterConfig | None = None, revision: int = 1) -> Membership:
    return Membership(MappingProxyType({r.node_id: r for r in records}), config, revision)


def test_topology_has_the_active_nodes_by_id_with_their_data_address() -> None:
    topo = topology_of(snapshot(record("node-2"), record("node-0"), record("node-1", NodeState.DRAINING),
                                record("node-3", NodeState.JOINING)))  # fmt: skip
    assert [m.node_id for m in topo.members] == ["node-0", "node-2"]
    assert topo.members[0].data_address == "127.0.0.1:7100"
    assert topo.replicas == 1  # no cluster config: its defaults


def test_replicas_come_from_the_cluster_config_unless_overridden() -> None:
    config = ClusterConfig(replicas=3, write_quorum=2)
    assert topology_of(snapshot(record("node-0"), config=config)).replicas == 3
    assert topology_of(snapshot(record("node-0"), config=config), replicas=2).replicas == 2


def test_a_restart_under_the_same_id_is_a_change_and_a_re_registration_is_not() -> None:
    base = topology_of(snapshot(record("node-0"), record("node-1"), revision=5))
    assert topology_of(snapshot(record("node-0"), record("node-1"), revision=9)) == base  # lease renewed
    assert topology_of(snapshot(record("node-0"), record("node-1", started=2.0))) != base  # restarted: maybe empty


def test_joins_leaves_drains_weights_and_replicas_are_changes() -> None:
    base = topology_of(snapshot(record("node-0"), record("node-1")))
    changed = [
        snapshot(record("node-0"), record("node-1"), record("node-2")),
        snapshot(record("node-0")),
        snapshot(record("node-0"), record("node-1", NodeState.DRAINING)),
        snapshot(record("node-0"), record("node-1", weight=2.0)),
        snapshot(record("node-0"), record("node-1"), config=ClusterConfig(replicas=2)),
    ]
    assert all(topology_of(s) != base for s in changed)
    assert topology_of(snapshot(record("node-0"), record("node-1"), record("node-2", NodeState.JOINING))) == base


def test_an_unknown_placement_version_places_nothing() -> None:
    config = ClusterConfig(placement_version=99)
    assert topology_of(snapshot(record("node-0"), record("node-1"), config=config)).members == ()


# -- pacing -------------------------------------------------------------------------------------------


def test_pacer_spaces_batches_to_the_rate() -> None:
    clock = FakeClock(100.0)
    pacer = Pacer(1000, clock)
    assert pacer.delay(500) == 0.5  # 500 bytes at 1000 B/s: due at +0.5 s
    clock.now += 0.5
    assert pacer.delay(500) == 0.5
    clock.now += 2.0  # idle time earns at most burst_s (0.1 s) of credit
    assert pacer.delay(100) == 0.0
    assert round(pacer.delay(1000), 6) == 1.0  # the credit is spent: a full second's bytes wait a second


def test_pacer_without_a_limit_never_waits() -> None:
    pacer = Pacer(0, FakeClock(100.0))
    assert pacer.delay(1 << 40) == 0.0
