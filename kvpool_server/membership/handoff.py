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
from dataclasses import asdict, dataclass

from kvpool_client.core.auth import Credentials
from kvpool_client.core.membership.cluster import list_nodes, read_config
from kvpool_client.core.membership.etcd import EtcdError, EtcdStore
from kvpool_client.core.membership.records import ClusterConfig, NodeState
from kvpool_client.core.routing import Member
from kvpool_server.membership.copies import BlockCopier, Pacer, plan_copies
from kvpool_server.stats import Counters
from kvpool_server.tiers.store import BlockStore

log = logging.getLogger("kvpool.membership.handoff")


@dataclass(frozen=True, slots=True)
class HandoffReport:
    blocks: int  # blocks this node held
    copies: int  # copies stored (or already present) on their new owners
    failed: int  # copies that could not be stored


@dataclass(slots=True)
class _Progress:
    """A hand-off's counts so far (one that failed part way reports how far it got)."""

    blocks: int = 0
    planned: int = 0
    copies: int = 0
    failed: int = 0

    def report(self) -> HandoffReport:
        return HandoffReport(self.blocks, self.copies, self.failed)


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
    readable here until the node leaves. Any other error is logged and ends it
    too: the copies not made count as failures. Either way ``handoff_finished``
    is counted: a drain waits for it.
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
    progress = _Progress()
    counters.add("handoff_started")
    try:
        await _copy_all(blocks, targets, config.replicas, credentials, counters, progress)
    except Exception:  # a bug or an I/O error must not leave the drain waiting for a hand-off that ended
        log.exception("hand-off failed", extra=asdict(progress))
    finally:
        unsent = progress.planned - progress.copies - progress.failed  # cut short: never tried
        if unsent:
            progress.failed += unsent
            counters.add("handoff_failures", unsent)
        counters.add("handoff_finished")
    return progress.report()


async def _copy_all(
    blocks: BlockStore,
    targets: list[Member],
    replicas: int,
    credentials: Credentials,
    counters: Counters,
    progress: _Progress,
) -> None:
    """Copy every readable block to its owners among ``targets``, one owner at a time; counts move live."""
    keys = await asyncio.to_thread(blocks.readable_keys)  # O(blocks) under the tier locks: not on the loop
    progress.blocks = len(keys)
    if not targets:
        log.warning("hand-off skipped: no other active node", extra={"blocks": len(keys)})
        return
    by_owner = plan_copies(keys, targets, replicas)
    progress.planned = sum(len(owned) for owned in by_owner.values())
    counters.add("handoff_planned", progress.planned)
    members = {m.node_id: m for m in targets}
    pacer = Pacer(0)  # a drain is a deadline: as fast as the owners take it
    for node_id, owned in by_owner.items():
        async with BlockCopier(blocks, members[node_id], credentials, pacer) as copier:
            async for tally in copier.copy(owned, skip_present=False):
                # OK or ALREADY_EXISTS only: a BUSY owner is still being written by someone who may abort.
                done = tally.copies + tally.present
                lost = tally.failed + tally.gone  # a block evicted since the hand-off began is not handed off
                progress.copies, progress.failed = progress.copies + done, progress.failed + lost
                counters.add("handoff_copies", done)
                counters.add("handoff_failures", lost)
    log.info("hand-off done", extra={"blocks": len(keys), "copies": progress.copies, "failed": progress.failed})
