"""One-shot reads and writes of a cluster's state in etcd, for tools (kvpoolctl) and tests.

Long-lived readers use :class:`~kvpool_client.core.membership.view.MembershipView` instead.
The config is changed with compare-and-swap on its stored bytes, so two operators
changing different fields at once both win, and neither silently undoes the other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpool_client.core.membership.errors import EtcdError, RecordError
from kvpool_client.core.membership.records import ClusterConfig, NodeRecord, config_key, nodes_prefix

if TYPE_CHECKING:  # etcd's client comes with the etcd extra; these functions get a store made with it
    from kvpool_client.core.membership.etcd import EtcdStore

log = logging.getLogger("kvpool.membership.cluster")


@dataclass(frozen=True, slots=True)
class NodeListing:
    """The valid node records, the keys that held malformed ones (with why), and the revision read."""

    nodes: dict[str, NodeRecord]
    malformed: dict[str, str]
    revision: int


async def list_nodes(store: EtcdStore, cluster: str) -> NodeListing:
    """Read every node record of ``cluster``.

    Raises:
        EtcdUnavailable, EtcdError.
    """
    prefix = nodes_prefix(cluster)
    items, revision = await store.get_prefix(prefix)
    nodes: dict[str, NodeRecord] = {}
    malformed: dict[str, str] = {}
    for key, value in sorted(items.items()):
        try:
            record = NodeRecord.from_json(value, expected_id=key[len(prefix) :])
        except RecordError as exc:
            malformed[key] = str(exc)
            continue
        nodes[record.node_id] = record
    return NodeListing(nodes, malformed, revision)


async def read_config(store: EtcdStore, cluster: str) -> ClusterConfig | None:
    """The cluster config, or None if none was ever written.

    Raises:
        RecordError: the stored value is malformed.
        EtcdUnavailable, EtcdError.
    """
    entry = await store.get(config_key(cluster))
    return None if entry is None else ClusterConfig.from_json(entry.value)


async def ensure_config(store: EtcdStore, cluster: str, default: ClusterConfig) -> ClusterConfig:
    """Write ``default`` unless a config exists; return the config in force.

    Raises:
        RecordError: the stored value is malformed.
        EtcdUnavailable, EtcdError.
    """
    if await store.put_if_absent(config_key(cluster), default.to_json()):
        return default
    existing = await read_config(store, cluster)
    if existing is None:  # deleted between our two calls: try once more
        return await ensure_config(store, cluster, default)
    return existing


async def update_config(
    store: EtcdStore,
    cluster: str,
    change: Callable[[ClusterConfig | None], ClusterConfig],
    *,
    attempts: int = 5,
) -> ClusterConfig:
    """Read-modify-write the config: ``change(current)`` -> new, retried if someone wrote in between.

    Args:
        change: builds the new config from the current one (None if absent); may
            raise ValueError to refuse, which propagates.
        attempts: compare-and-swap tries before giving up.
    Raises:
        EtcdError: still contended after ``attempts`` tries.
        RecordError: the stored value is malformed (fix it with ``change`` on None: delete it first).
        EtcdUnavailable.
    """
    key = config_key(cluster)
    for _ in range(attempts):
        entry = await store.get(key)
        current = None if entry is None else ClusterConfig.from_json(entry.value)
        new = change(current)
        if await store.compare_and_swap(key, None if entry is None else entry.value, new.to_json()):
            log.info("cluster config written", extra={"cluster": cluster, "config": str(new)})
            return new
    raise EtcdError(f"cluster config of {cluster!r} kept changing; gave up after {attempts} tries")
