"""Hand-off on drain: copy this node's blocks to the nodes that own them next.

A draining node leaves the placement, so its keys now map to other nodes. Copying
the blocks there before the node leaves keeps the pool's hit rate instead of
letting those prefixes be recomputed. The copies go through
:mod:`~kvpool_server.membership.copies`, one owner at a time, with plain puts
(put-if-absent: a block the owner has is not stored twice).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from kvpool_client.auth import Credentials
from kvpool_client.membership.cluster import list_nodes, read_config
from kvpool_client.membership.etcd import EtcdError, EtcdStore
from kvpool_client.membership.records import ClusterConfig, NodeState
from kvpool_client.routing import Member
from kvpool_server.membership.copies import BlockCopier, Pacer, plan_copies
from kvpool_server.stats import Counters
from kvpool_server.tiers.store import BlockStore

log = logging.getLogger("kvpool.membership.handoff")


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
    keys = await asyncio.to_thread(blocks.readable_keys)  # O(blocks) under the tier locks: not on the loop
    counters.add("handoff_started")
    if not targets:
        counters.add("handoff_finished")
        log.warning("hand-off skipped: no other active node", extra={"blocks": len(keys)})
        return HandoffReport(len(keys), 0, 0)
    by_owner = plan_copies(keys, targets, config.replicas)
    counters.add("handoff_planned", sum(len(owned) for owned in by_owner.values()))
    members = {m.node_id: m for m in targets}
    pacer = Pacer(0)  # a drain is a deadline: as fast as the owners take it
    copies = failed = 0
    for node_id, owned in by_owner.items():
        async with BlockCopier(blocks, members[node_id], credentials, pacer) as copier:
            async for tally in copier.copy(owned, skip_present=False):
                # OK or ALREADY_EXISTS only: a BUSY owner is still being written by someone who may abort.
                done = tally.copies + tally.present
                lost = tally.failed + tally.gone  # a block evicted since the hand-off began is not handed off
                copies, failed = copies + done, failed + lost
                counters.add("handoff_copies", done)
                counters.add("handoff_failures", lost)
    counters.add("handoff_finished")
    log.info("hand-off done", extra={"blocks": len(keys), "copies": copies, "failed": failed})
    return HandoffReport(len(keys), copies, failed)
