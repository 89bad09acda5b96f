"""The node's place in the cluster: its state and, with etcd, its registration.

The state (joining, active, draining) decides what the data plane accepts: a
draining node refuses writes with ``DRAINING`` and keeps serving reads. Without
etcd the node runs standalone: the state still applies, nothing is published.
"""

from __future__ import annotations

import logging

from kvpool_client.core.auth import TlsFiles
from kvpool_client.core.membership.cluster import ensure_config
from kvpool_client.core.membership.etcd import EtcdError, EtcdStore
from kvpool_client.core.membership.records import STATE_TRANSITIONS, ClusterConfig, NodeRecord, NodeState
from kvpool_server.membership.registration import InvalidTransition, NodeRegistration

log = logging.getLogger("kvpool.membership")

# How long start and shutdown wait for etcd before going on without it.
_ETCD_WAIT_S = 2.0


class NodePresence:
    """Owns the node's state; registers it in etcd when endpoints are given.

    Args:
        etcd_endpoints: comma-separated etcd URLs; empty: standalone.
        cluster: the cluster name (etcd prefix ``/kvpool/<cluster>/``).
        lease_ttl_s: TTL of the node's lease.
        etcd_tls: TLS to etcd (None: plaintext, or system roots for https:// endpoints).
    """

    def __init__(self, etcd_endpoints: str, cluster: str, lease_ttl_s: int, etcd_tls: TlsFiles | None = None) -> None:
        self.cluster = cluster
        self.state = NodeState.JOINING
        self.store = EtcdStore(etcd_endpoints, tls=etcd_tls) if etcd_endpoints else None
        self._ttl_s = lease_ttl_s
        self._registration: NodeRegistration | None = None

    @property
    def accepting_writes(self) -> bool:
        return self.state is NodeState.ACTIVE

    @property
    def session(self) -> str:
        """``standalone`` or the registration's session state (for stats)."""
        return "standalone" if self._registration is None else str(self._registration.session)

    async def start(self, record: NodeRecord) -> None:
        """Register as joining; etcd being down delays the registration, never the start."""
        if self.store is None:
            return
        await self.store.connect()
        self._registration = NodeRegistration(self.store, self.cluster, record, ttl_s=self._ttl_s)
        await self._registration.start()
        try:
            await ensure_config(self.store, self.cluster, ClusterConfig())
        except EtcdError as exc:
            log.warning("cluster config not checked: etcd unavailable", extra={"error": str(exc)})
        if not await self._registration.wait_registered(_ETCD_WAIT_S):
            log.warning("etcd unreachable: serving unregistered until it returns")

    async def set_state(self, state: NodeState | str) -> None:
        """Move to ``state`` and publish it (best effort: published when etcd returns).

        Raises:
            InvalidTransition: the node life cycle does not allow the move.
        """
        new = NodeState(state)
        if new != self.state and (self.state, new) not in STATE_TRANSITIONS:
            raise InvalidTransition(f"cannot go from {self.state} to {new}")
        self.state = new
        if self._registration is not None:
            await self._registration.set_state(new, wait_s=_ETCD_WAIT_S)

    async def close(self) -> None:
        """Leave the cluster: revoke the lease so clients stop placing keys here at once."""
        if self._registration is not None:
            await self._registration.close(revoke=True, timeout_s=_ETCD_WAIT_S)
        if self.store is not None:
            await self.store.close()
