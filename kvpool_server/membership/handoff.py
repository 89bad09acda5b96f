"""Hand-off on drain: copy this node's blocks to the nodes that own them next.

A draining node leaves the placement, so its keys now map to other nodes. Copying
the blocks there before the node leaves keeps the pool's hit rate instead of
letting those prefixes be recomputed. DRAM blocks are sent straight from the arena
(pinned for the copy), SSD blocks after a read, with the regular client, in
batches, one owner at a time.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from kvpool_client.aio import AsyncKVPoolClient
from kvpool_client.auth import Credentials
from kvpool_client.config import ClientConfig
from kvpool_client.errors import KVPoolError
from kvpool_client.keys import BlockKey
from kvpool_client.membership.cluster import list_nodes, read_config
from kvpool_client.membership.etcd import EtcdError, EtcdStore
from kvpool_client.membership.records import ClusterConfig, NodeState
from kvpool_client.routing import Member, place
from kvpool_server.index import StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.store import BlockStore

log = logging.getLogger("kvpool.membership.handoff")

_BATCH = 32


@dataclass(frozen=True, slots=True)
class HandoffReport:
    blocks: int  # blocks this node held
    copies: int  # copies stored (or already present) on their new owners
    failed: int  # copies that could not be stored


async def hand_off(
    blocks: BlockStore,
    store: EtcdStore,
    cluster: str,
    self_id: str,
    counters: Counters,
    credentials: Credentials = Credentials(),
) -> HandoffReport:
    """Copy every readable block to its owners among the other active nodes.

    ``credentials`` (the cluster's token, TLS) are presented to the new owners.

    An unreadable membership is logged and ends the hand-off: the blocks stay
    readable here until the node leaves.
    """
    try:
        listing = await list_nodes(store, cluster)
        config = await read_config(store, cluster) or ClusterConfig()
    except EtcdError as exc:
        log.error("hand-off aborted: cannot read the membership", extra={"error": str(exc)})
        counters.add("handoff_finished")
        return HandoffReport(0, 0, 0)
    targets = [
        Member(r.node_id, r.address, r.weight)
        for r in listing.nodes.values()
        if r.state is NodeState.ACTIVE and r.node_id != self_id
    ]
    keys = blocks.readable_keys()
    counters.add("handoff_started")
    if not targets:
        counters.add("handoff_finished")
        log.warning("hand-off skipped: no other active node", extra={"blocks": len(keys)})
        return HandoffReport(len(keys), 0, 0)
    by_owner: dict[str, list[StoreKey]] = defaultdict(list)
    for key in keys:
        for owner in place(key[1], targets, config.replicas):
            by_owner[owner.address].append(key)
    counters.add("handoff_planned", sum(len(owned) for owned in by_owner.values()))
    copies = failed = 0
    for address, owned in by_owner.items():
        stored, lost = await _copy_to(blocks, address, owned, credentials, counters)
        copies, failed = copies + stored, failed + lost
    counters.add("handoff_finished")
    log.info("hand-off done", extra={"blocks": len(keys), "copies": copies, "failed": failed})
    return HandoffReport(len(keys), copies, failed)


async def _copy_to(
    blocks: BlockStore, address: str, keys: list[StoreKey], credentials: Credentials, counters: Counters
) -> tuple[int, int]:
    """Put ``keys`` to the node at ``address``; returns (stored, failed), counted live per batch."""
    stored = failed = 0
    config = ClientConfig(nodes=(address,), auth_token=credentials.token, tls=credentials.tls)
    async with AsyncKVPoolClient(config=config) as client:
        for start in range(0, len(keys), _BATCH):
            batch = keys[start : start + _BATCH]
            held = await blocks.acquire(batch, touch=False)
            present = [(key, block) for key, block in zip(batch, held) if block is not None]
            gone = len(batch) - len(present)  # evicted or deleted since the hand-off began
            failed += gone
            counters.add("handoff_failures", gone)
            if not present:
                continue
            try:
                result = await client.put([BlockKey(*key) for key, _ in present], [b.view for _, b in present])
                ok = len(present) - len(result.failures())
            except KVPoolError as exc:
                log.warning("hand-off batch failed", extra={"target": address, "error": str(exc)})
                ok = 0
            finally:
                blocks.release(held)
            stored, failed = stored + ok, failed + len(present) - ok
            counters.add("handoff_copies", ok)
            counters.add("handoff_failures", len(present) - ok)
    return stored, failed
