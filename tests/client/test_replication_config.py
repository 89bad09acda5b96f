"""Client settings for clusters (etcd, replicas, quorum) and placement built from a membership snapshot."""

from __future__ import annotations

import subprocess
import sys
from types import MappingProxyType

import pytest

from kvpool_client.core.config import ClientConfig
from kvpool_client.core.errors import UsageError
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.membership.records import ClusterConfig, NodeRecord, NodeState
from kvpool_client.core.membership.view import Membership
from kvpool_client.core.routing import Member, StaticRouter, place_key
from kvpool_client.placement_source import StaticSource, member_of, placement_of, replication_settings


def record(node_id: str, state: NodeState = NodeState.ACTIVE, weight: float = 1.0) -> NodeRecord:
    return NodeRecord(
        node_id, f"10.0.0.{len(node_id)}:50051", {"tcp": f"10.0.0.{len(node_id)}:50052"}, state, weight=weight
    )


def membership(*records: NodeRecord, config: ClusterConfig | None = None, revision: int = 7) -> Membership:
    return Membership(MappingProxyType({r.node_id: r for r in records}), config, revision)


# -- ClientConfig -------------------------------------------------------------------------------


def test_nodes_or_etcd_is_required() -> None:
    with pytest.raises(UsageError, match="KVPOOL_ETCD_ENDPOINTS"):
        ClientConfig()
    assert ClientConfig(etcd_endpoints=("http://127.0.0.1:2379",)).uses_etcd
    assert not ClientConfig(nodes=("h:1",)).uses_etcd


def test_a_comma_separated_string_is_split() -> None:
    config = ClientConfig(nodes="a:1, b:2", etcd_endpoints="http://e1:2379,http://e2:2379")  # type: ignore[arg-type]
    assert config.nodes == ("a:1", "b:2")
    assert config.etcd_endpoints == ("http://e1:2379", "http://e2:2379")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"replicas": 0}, "replicas must be in 1..16"),
        ({"replicas": 17}, "replicas must be in 1..16"),
        ({"write_quorum": 0}, "write_quorum must be >= 1"),
        ({"replicas": 2, "write_quorum": 3}, "cannot exceed replicas"),
        ({"io_threads": 0}, "io_threads"),
        ({"cluster": "a/b"}, "invalid cluster name"),
    ],
)
def test_replication_settings_are_checked(kwargs: dict[str, int], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        ClientConfig(nodes=("h:1",), **kwargs)  # type: ignore[arg-type]


def test_from_env_reads_the_cluster_settings() -> None:
    env = {
        "KVPOOL_ETCD_ENDPOINTS": "http://127.0.0.1:2379, http://127.0.0.2:2379",
        "KVPOOL_CLUSTER": "prod",
        "KVPOOL_REPLICAS": "3",
        "KVPOOL_WRITE_QUORUM": "2",
        "KVPOOL_REQUEST_TIMEOUT_S": "1.5",
    }
    config = ClientConfig.from_env(env)
    assert config.etcd_endpoints == ("http://127.0.0.1:2379", "http://127.0.0.2:2379")
    assert (config.cluster, config.replicas, config.write_quorum, config.request_timeout_s) == ("prod", 3, 2, 1.5)
    assert config.nodes == ()
    assert ClientConfig.from_env({"KVPOOL_NODES": "a:1"}, replicas=2).replicas == 2
    with pytest.raises(UsageError, match=r"^KVPOOL_REPLICAS='two': not an integer$"):
        ClientConfig.from_env({"KVPOOL_NODES": "a:1", "KVPOOL_REPLICAS": "two"})


# -- replication settings and placement ----------------------------------------------------------


def test_replication_settings_prefer_the_client_then_the_cluster_then_one() -> None:
    static = ClientConfig(nodes=("h:1",))
    cluster = ClusterConfig(replicas=3, write_quorum=2)
    assert replication_settings(static, None) == (1, 1)
    assert replication_settings(static, cluster) == (3, 2)
    assert replication_settings(ClientConfig(nodes=("h:1",), replicas=2), cluster) == (2, 2)
    assert replication_settings(ClientConfig(nodes=("h:1",), replicas=1), cluster) == (1, 1), "quorum <= replicas"
    assert replication_settings(ClientConfig(nodes=("h:1",), write_quorum=1), cluster) == (3, 1)


def test_member_of_a_record_carries_its_data_endpoint_and_state() -> None:
    member = member_of(record("n1", NodeState.DRAINING, weight=2.0))
    assert member == Member("n1", "10.0.0.2:50051", 2.0, NodeState.DRAINING, "10.0.0.2:50052")
    bare = NodeRecord("n2", "h:1")
    assert member_of(bare).data_address == "" and member_of(bare).state is NodeState.JOINING


def test_placement_of_a_membership_places_by_node_id_over_active_nodes() -> None:
    records = [record("a"), record("bb", NodeState.DRAINING), record("ccc"), record("dddd", NodeState.JOINING)]
    snap = membership(*records, config=ClusterConfig(replicas=2, write_quorum=2))
    placement = placement_of(snap, ClientConfig(etcd_endpoints=("e:1",)))
    assert (placement.write_quorum, placement.revision) == (2, 7)
    members = [member_of(r) for r in records]
    for i in range(200):
        key = BlockKey("ns", bytes([i]) * 32)
        assert placement.router.placement(key) == place_key(key.hash, members, 2)


def test_an_unknown_placement_version_places_nothing() -> None:
    snap = membership(record("a"), config=ClusterConfig(placement_version=2))
    placed = placement_of(snap, ClientConfig(etcd_endpoints=("e:1",))).router.placement(BlockKey("ns", b"k" * 32))
    assert placed.write_owners == () and placed.read_order == ()


def test_static_source_uses_the_configured_replicas() -> None:
    source = StaticSource(ClientConfig(nodes=("a:1", "b:1", "c:1"), replicas=2, write_quorum=2))
    placement = source.current()
    assert placement.write_quorum == 2 and isinstance(placement.router, StaticRouter)
    assert len(placement.router.placement(BlockKey("ns", b"k" * 32)).write_owners) == 2
    assert source.current() is placement


def test_a_static_client_does_not_import_the_etcd_library() -> None:
    code = (
        "import sys, kvpool_client, kvpool_client.placement_source; "
        "kvpool_client.KVPoolClient(['127.0.0.1:1']).close(); "
        "assert 'etcd3aio' not in sys.modules, 'etcd3aio imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_more_replicas_than_nodes_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="kvpool.client.placement"):
        StaticSource(ClientConfig(nodes=("127.0.0.1:1", "127.0.0.1:2"), replicas=3))
        StaticSource(ClientConfig(nodes=("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"), replicas=3))
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["replicas is 3 but only 2 node(s) can take writes: each block gets 2 copies"], messages
