"""Where a client's placement comes from: a static node list, or the cluster's membership in etcd.

Every operation of a client reads one :class:`Placement` (a router plus the write
quorum) and uses it throughout, so a membership change never splits a batch
between two views of the cluster. A membership-fed source rebuilds the placement
on every change the view publishes and swaps it in with one assignment; during an
etcd outage the view keeps the last membership it saw, and so does the placement.

The etcd client library is imported only when a membership source is built.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kvpool_client.core.config import ClientConfig
from kvpool_client.core.errors import UsageError
from kvpool_client.core.membership.records import ClusterConfig, NodeState, check_name
from kvpool_client.core.routing import PLACEMENT_VERSION, Member, RendezvousRouter, Router, StaticRouter, member_of

if TYPE_CHECKING:
    from kvpool_client.core.membership.etcd import EtcdStore
    from kvpool_client.core.membership.view import Membership, MembershipView, ThreadedMembershipView

log = logging.getLogger("kvpool.client.placement")


@dataclass(frozen=True, slots=True)
class Placement:
    """What one operation places keys with.

    Attributes:
        router: key -> write owners and read order.
        write_quorum: owners that must store a key (before clamping to the owners placed).
        revision: the etcd revision this was built from (0: static).
    """

    router: Router
    write_quorum: int
    revision: int = 0


class PlacementSource(Protocol):
    """Hands out the current placement; cheap enough to call once per operation."""

    def current(self) -> Placement: ...


def member_at(placement: Placement, address: str) -> Member:
    """The member whose control address or node id is ``address``, else a static member for it."""
    for member in placement.router.members():
        if address in (member.address, member.node_id):
            return member
    return Member(address, address)


def replication_settings(config: ClientConfig, cluster: ClusterConfig | None) -> tuple[int, int]:
    """``(replicas, write_quorum)``: the client's settings, else the cluster's, else 1 and 1.

    The quorum never exceeds the replicas.
    """
    replicas = config.replicas or (cluster.replicas if cluster is not None else 1)
    quorum = config.write_quorum or (cluster.write_quorum if cluster is not None else 1)
    return replicas, max(1, min(quorum, replicas))


def placement_of(membership: Membership, config: ClientConfig) -> Placement:
    """The placement for one membership snapshot (pure).

    A cluster config asking for a placement version this client does not implement
    yields a placement with no members: every key then fails UNAVAILABLE, which is
    better than writing blocks where other clients will never look.
    """
    cluster = membership.config
    replicas, quorum = replication_settings(config, cluster)
    members = [member_of(r) for r in membership.nodes.values()]
    if cluster is not None and cluster.placement_version != PLACEMENT_VERSION:
        log.error(
            "cluster uses a placement version this client does not implement; placing nothing",
            extra={"cluster_version": cluster.placement_version, "client_version": PLACEMENT_VERSION},
        )
        members = []
    return Placement(RendezvousRouter(members, replicas), quorum, membership.revision)


def warn_if_short(replicas: int, nodes: int) -> bool:
    """Say so when ``replicas`` copies cannot be placed on ``nodes`` nodes; True if it did."""
    if 0 < nodes < replicas:
        log.warning(
            "replicas is %d but only %d node(s) can take writes: each block gets %d cop%s",
            replicas,
            nodes,
            nodes,
            "y" if nodes == 1 else "ies",
        )
        return True
    return False


class StaticSource:
    """A fixed placement: a static node list, or a router the caller supplied."""

    def __init__(self, config: ClientConfig, router: Router | None = None) -> None:
        replicas, quorum = replication_settings(config, None)
        self._placement = Placement(router or StaticRouter(config.nodes, replicas), quorum)
        if router is None:
            warn_if_short(replicas, len(set(config.nodes)))

    def current(self) -> Placement:
        return self._placement


class _Follower:
    """Rebuilds the placement whenever the view publishes a membership (any thread)."""

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._placement = Placement(RendezvousRouter([]), 1)
        self._source: Callable[[], Membership] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._short = False  # the last placement had fewer writable nodes than replicas

    def current(self) -> Placement:
        return self._placement

    def follow(self, view: MembershipView | ThreadedMembershipView) -> None:
        self._source = view.snapshot
        self._unsubscribe = view.subscribe(self._update)
        self._update(view.snapshot())  # a change published before subscribing is not lost

    def unfollow(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _update(self, _: Membership) -> None:
        # Read the latest snapshot under the lock, not the one handed in: of two racing
        # updates (the caller's first one and the view's), the last to assign is newest.
        assert self._source is not None
        with self._lock:
            self._placement = placement_of(self._source(), self._config)
            router = self._placement.router
            writable = sum(m.state == NodeState.ACTIVE for m in router.members())
            replicas = getattr(router, "replicas", 1)
            # Once per spell of too few nodes, not on every membership change during it.
            self._short = warn_if_short(replicas, writable) if not self._short else 0 < writable < replicas


class ThreadedMembershipSource(_Follower):
    """Placement following etcd through a :class:`ThreadedMembershipView`, for the blocking client.

    The constructor starts the view and waits up to ``connect_timeout_s`` for the
    first full read; if etcd does not answer by then it logs a warning and keeps
    trying in the background (keys fail UNAVAILABLE until a membership arrives).

    Args:
        config: endpoints, cluster, replication settings.
        store_options: keyword arguments for the view's EtcdStore.
    """

    def __init__(self, config: ClientConfig, store_options: dict[str, Any] | None = None) -> None:
        from kvpool_client.core.membership.view import ThreadedMembershipView

        super().__init__(config)
        try:
            options = {"tls": config.etcd_tls, **(store_options or {})}
            self._view = ThreadedMembershipView(config.etcd_endpoints, config.cluster, store_options=options)
        except ValueError as exc:  # malformed endpoints or cluster name
            raise UsageError(str(exc)) from None
        if not self._view.start(wait_synced_s=config.connect_timeout_s):
            _warn_unsynced(config)
        self.follow(self._view)

    def close(self) -> None:
        self.unfollow()
        self._view.close()


class AsyncMembershipSource(_Follower):
    """Placement following etcd through a :class:`MembershipView` on the caller's loop.

    Call :meth:`start` on the loop that uses it; :meth:`close` on the same loop.
    """

    def __init__(self, config: ClientConfig, store_options: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        self._store_options = {"tls": config.etcd_tls, **(store_options or {})}
        self._store: EtcdStore | None = None
        self._view: MembershipView | None = None

    async def start(self) -> None:
        """Connect, start watching, and wait up to ``connect_timeout_s`` for the first read."""
        from kvpool_client.core.membership.etcd import EtcdStore
        from kvpool_client.core.membership.view import MembershipView

        config = self._config
        try:
            check_name("cluster name", config.cluster)
            store = EtcdStore(config.etcd_endpoints, **self._store_options)
        except ValueError as exc:  # malformed endpoints or cluster name
            raise UsageError(str(exc)) from None
        self._store = await store.connect()
        self._view = MembershipView(self._store, config.cluster)
        await self._view.start()
        if not await self._view.wait_synced(config.connect_timeout_s):
            _warn_unsynced(config)
        self.follow(self._view)

    async def close(self) -> None:
        self.unfollow()
        if self._view is not None:
            await self._view.close()
        if self._store is not None:
            await self._store.close()


def _warn_unsynced(config: ClientConfig) -> None:
    log.warning(
        "etcd did not answer in time; no nodes to place keys on until it does",
        extra={"etcd": ",".join(config.etcd_endpoints), "cluster": config.cluster},
    )
