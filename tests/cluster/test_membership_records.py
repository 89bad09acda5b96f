"""Membership records, key layout, back-off and endpoint parsing: no etcd needed."""

from __future__ import annotations

import json
import random

import pytest

from kvpool_client.core.membership.backoff import Backoff
from kvpool_client.core.membership.errors import RecordError
from kvpool_client.core.membership.records import (
    ClusterConfig,
    NodeRecord,
    NodeState,
    config_key,
    node_key,
    nodes_prefix,
)

RECORD = NodeRecord(
    node_id="node-1",
    address="10.0.0.5:50051",
    data_endpoints={"tcp": "10.0.0.5:50052", "ucx": "10.0.0.5:50053"},
    state=NodeState.ACTIVE,
    capacity_bytes=64 << 30,
    weight=2,
    version="0.1.0",
    registered_at=1700000000.5,
)


def test_key_layout() -> None:
    assert node_key("prod", "node-1") == "/kvpool/prod/nodes/node-1"
    assert nodes_prefix("prod") == "/kvpool/prod/nodes/"
    assert config_key("prod") == "/kvpool/prod/config"


@pytest.mark.parametrize("name", ["", "a/b", "-x", "a b", "x" * 129, "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        node_key("prod", name)
    with pytest.raises(ValueError):
        config_key(name)


def test_node_record_round_trip_and_exact_json() -> None:
    data = RECORD.to_json()
    assert json.loads(data) == {
        "schema": 1,
        "node_id": "node-1",
        "address": "10.0.0.5:50051",
        "data_endpoints": {"tcp": "10.0.0.5:50052", "ucx": "10.0.0.5:50053"},
        "state": "active",
        "capacity_bytes": 64 << 30,
        "weight": 2.0,
        "version": "0.1.0",
        "registered_at": 1700000000.5,
    }
    assert NodeRecord.from_json(data, expected_id="node-1") == RECORD
    assert hash(RECORD) == hash(NodeRecord.from_json(data))


def test_node_record_is_read_only() -> None:
    with pytest.raises(TypeError):
        RECORD.data_endpoints["tcp"] = "elsewhere"  # type: ignore[index]
    assert RECORD.with_state("draining").state is NodeState.DRAINING
    assert RECORD.state is NodeState.ACTIVE


def test_unknown_fields_are_ignored() -> None:
    obj = json.loads(RECORD.to_json())
    obj["zone"] = "us-east-1a"
    assert NodeRecord.from_json(json.dumps(obj).encode()) == RECORD


def _mutated(**changes: object) -> bytes:
    obj = json.loads(RECORD.to_json())
    for name, value in changes.items():
        if value is KeyError:
            del obj[name]
        else:
            obj[name] = value
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"schema": 1, "weight": NaN}',
        b"\xff\xfe",
        _mutated(schema=2),
        _mutated(schema=KeyError),
        _mutated(address=KeyError),
        _mutated(state="gone"),
        _mutated(capacity_bytes="1GiB"),
        _mutated(capacity_bytes=-1),
        _mutated(capacity_bytes=True),
        _mutated(weight=0),
        _mutated(address="no-port"),
        _mutated(address="::1:5"),
        _mutated(data_endpoints={"TCP!": "x:1"}),
        _mutated(data_endpoints=["tcp"]),
        _mutated(node_id="a/b"),
    ],
)
def test_malformed_node_records_raise_record_error(data: bytes) -> None:
    with pytest.raises(RecordError):
        NodeRecord.from_json(data)


def test_node_id_must_match_the_key() -> None:
    with pytest.raises(RecordError, match="node_id"):
        NodeRecord.from_json(RECORD.to_json(), expected_id="node-2")


def test_cluster_config_round_trip_and_validation() -> None:
    config = ClusterConfig(block_size=16, replicas=3, write_quorum=2, placement_version=1)
    assert json.loads(config.to_json()) == {
        "schema": 1, "block_size": 16, "replicas": 3, "write_quorum": 2, "placement_version": 1,
    }  # fmt: skip
    assert ClusterConfig.from_json(config.to_json()) == config
    for bad in (
        {"replicas": 0},
        {"replicas": 17},
        {"replicas": 2, "write_quorum": 3},
        {"write_quorum": 0},
        {"block_size": 0},
        {"placement_version": 0},
        {"replicas": 2.0},
    ):
        with pytest.raises(ValueError):
            ClusterConfig(**bad)
    with pytest.raises(RecordError):
        ClusterConfig.from_json(
            b'{"schema": 1, "block_size": 16, "replicas": 1, "write_quorum": 2, "placement_version": 1}'
        )
    with pytest.raises(RecordError):
        ClusterConfig.from_json(b'{"schema": 1}')


def test_backoff_doubles_with_jitter_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(0.1, 0.8, rng=random.Random(7))
    delays = [backoff.next() for _ in range(6)]
    bounds = [0.1, 0.2, 0.4, 0.8, 0.8, 0.8]
    assert all(b / 2 <= d <= b for d, b in zip(delays, bounds, strict=True))
    backoff.reset()
    assert 0.05 <= backoff.next() <= 0.1
    with pytest.raises(ValueError):
        Backoff(0, 1)


def test_channel_target() -> None:
    from kvpool_client.core.membership.etcd import channel_target

    assert channel_target(["127.0.0.1:2379", "http://10.0.0.2:2379/"]) == "ipv4:127.0.0.1:2379,10.0.0.2:2379"
    assert channel_target("localhost:2379") == "ipv4:127.0.0.1:2379"
    assert channel_target("etcd.kvpool.svc:2379") == "dns:///etcd.kvpool.svc:2379"
    assert channel_target(["[::1]:2379"]) == "ipv6:[::1]:2379"
    assert channel_target("https://etcd.kvpool.svc:2379") == "dns:///etcd.kvpool.svc:2379"
    for bad in ([], "", "https://x", "x", ["a:1", "b:2"], ["127.0.0.1:1", "[::1]:2"]):
        with pytest.raises(ValueError):
            channel_target(bad)


def test_tls_follows_the_endpoint_scheme_or_the_files() -> None:
    from kvpool_client.core.auth import TlsFiles
    from kvpool_client.core.membership.etcd import EtcdStore, uses_tls

    assert uses_tls("https://a:1,https://b:1") and not uses_tls(["a:1", "http://b:1"])
    with pytest.raises(ValueError, match="mix"):
        uses_tls(["https://10.0.0.1:2379", "10.0.0.2:2379"])
    assert EtcdStore("https://127.0.0.1:2379").secure
    assert EtcdStore("127.0.0.1:2379", tls=TlsFiles("ca.pem")).secure
    assert not EtcdStore("http://127.0.0.1:2379").secure
