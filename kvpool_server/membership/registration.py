"""The daemon's entry in etcd: a node record attached to a lease, kept alive in the background.

``NodeRegistration`` owns one background task with three duties:

- register: grant a lease of ``ttl_s`` and put the node record under it;
- keep alive: renew the lease every ``ttl_s / 3`` and check that the record is still
  there (an operator may have deleted it); publish a changed record (``set_state``)
  at once;
- recover: a lease found gone (the daemon stalled past its TTL, or someone revoked
  it) means the record is gone too: register again with a new lease. An unreachable
  etcd is retried with back-off; etcd restores leases when it restarts.

Nothing here raises into the daemon's serving path: etcd failures only change
:attr:`NodeRegistration.session` (for metrics and health) and are logged on change.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging

from kvpool_client.core.membership.backoff import Backoff
from kvpool_client.core.membership.etcd import EtcdError, EtcdStore, EtcdUnavailable, LeaseLost
from kvpool_client.core.membership.records import STATE_TRANSITIONS, NodeRecord, NodeState, node_key

log = logging.getLogger("kvpool.membership.registration")


class SessionState(enum.StrEnum):
    """Where the registration stands with etcd."""

    STARTING = "starting"  # not registered yet
    REGISTERED = "registered"  # the record is in etcd under a live lease
    RETRYING = "retrying"  # etcd unreachable or failing; the last lease may still be alive
    CONFLICT = "conflict"  # another live process holds this node id's key
    CLOSED = "closed"


class InvalidTransition(ValueError):
    """``set_state`` was asked for a move the node life cycle does not allow."""


class NodeRegistration:
    """Registers one node under ``/kvpool/<cluster>/nodes/<node-id>`` and keeps it there.

    Args:
        store: a connected store; the registration does not close it.
        cluster: the cluster name.
        record: the node record to publish (its ``state`` is the initial state).
        ttl_s: lease TTL in seconds (>= 1); the key vanishes this long after the daemon dies.
        backoff: delays between retries while etcd fails; capped at ttl_s / 3.
    Raises:
        ValueError: ttl_s < 1 or an invalid cluster name.
    """

    def __init__(
        self,
        store: EtcdStore,
        cluster: str,
        record: NodeRecord,
        *,
        ttl_s: int = 10,
        backoff: Backoff | None = None,
    ) -> None:
        if ttl_s < 1:
            raise ValueError("ttl_s must be >= 1")
        self._store = store
        self.key = node_key(cluster, record.node_id)
        self.ttl_s = ttl_s
        self._interval_s = ttl_s / 3
        self._backoff = backoff or Backoff(0.1, max(0.1, min(5.0, self._interval_s)))
        self._record = record
        self._version = 0  # bumped by each local change of the record
        self._published = -1  # the version now in etcd
        self._published_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.lease_id: int | None = None
        self.session = SessionState.STARTING
        self.registrations = 0  # leases granted and records put, for metrics
        self.leases_lost = 0

    @property
    def record(self) -> NodeRecord:
        """The record as this node wants it published."""
        return self._record

    @property
    def connected(self) -> bool:
        """True while the record is in etcd under a lease this node keeps alive."""
        return self.session == SessionState.REGISTERED

    async def start(self) -> None:
        """Start the background task; returns at once, whether or not etcd is reachable."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kvpool-registration-{self._record.node_id}")

    async def wait_registered(self, timeout_s: float) -> bool:
        """True once the current record is published; False after ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._published != self._version:
                    await self._published_event.wait()
        except TimeoutError:
            return False
        return True

    async def set_state(self, state: NodeState | str, *, wait_s: float | None = None) -> bool:
        """Move to ``state`` (joining->active, active<->draining, joining->draining) and publish it.

        Args:
            state: the new state; the current one is a no-op.
            wait_s: how long to wait for etcd to have it; default the store's request timeout.
        Returns:
            True if etcd has the new record; False if not yet (it is published when etcd returns).
        Raises:
            InvalidTransition: the move is not allowed.
        """
        new = NodeState(state)
        old = self._record.state
        if new != old:
            if (old, new) not in STATE_TRANSITIONS:
                raise InvalidTransition(f"node {self._record.node_id}: cannot go from {old} to {new}")
            self._record = self._record.with_state(new)
            self._version += 1
            self._wake.set()
            log.info("node state change", extra={"node_id": self._record.node_id, "from": str(old), "to": str(new)})
        return await self.wait_registered(self._store.request_timeout_s if wait_s is None else wait_s)

    async def close(self, *, revoke: bool = True, timeout_s: float = 2.0) -> None:
        """Stop keeping the lease alive; with ``revoke``, delete the record now (bounded wait).

        Without ``revoke`` the record stays until the lease expires, as after a crash.
        """
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=timeout_s)
        lease, self.lease_id = self.lease_id, None
        self.session = SessionState.CLOSED
        if revoke and lease is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._store.revoke(lease)
                log.info("deregistered", extra={"node_id": self._record.node_id})
            except (EtcdError, TimeoutError) as exc:
                log.warning("could not revoke the lease; the record expires with it", extra={"error": str(exc)})

    async def _run(self) -> None:
        while True:
            try:
                if self.lease_id is None:
                    await self._register()
                await self._tick()
            except LeaseLost:
                self._on_lease_lost()
            except EtcdError as exc:
                self._on_failure(exc)
                await asyncio.sleep(self._backoff.next())
            except Exception:  # a bug must not end the registration for good: log it and go on
                log.exception("registration failed unexpectedly; retrying")
                self._set_session(SessionState.RETRYING)
                await asyncio.sleep(self._backoff.next())

    async def _register(self) -> None:
        lease = await self._store.grant_lease(self.ttl_s)
        self.lease_id = lease
        await self._publish(lease)
        self.registrations += 1
        self._set_session(SessionState.REGISTERED)
        log.info(
            "registered",
            extra={
                "node_id": self._record.node_id,
                "lease": f"{lease:x}",
                "ttl_s": self.ttl_s,
                "times": self.registrations,
            },
        )

    async def _tick(self) -> None:
        """Wait for the next renewal (or a record change), then renew, check and publish."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._interval_s):
                await self._wake.wait()
        self._wake.clear()
        lease = self.lease_id
        assert lease is not None
        await self._store.keepalive_once(lease)
        if self._published != self._version:
            await self._publish(lease)
            owned = True
        else:
            owned = await self._check_record(lease)
        self._backoff.reset()
        self._set_session(SessionState.REGISTERED if owned else SessionState.CONFLICT)

    async def _check_record(self, lease: int) -> bool:
        """Put the record back if it vanished; False if another lease holds the key."""
        entry = await self._store.get(self.key)
        if entry is None:
            log.warning("node record vanished while the lease lives; writing it again", extra={"key": self.key})
            await self._publish(lease)
        elif entry.lease != lease:
            if self.session != SessionState.CONFLICT:
                log.error(
                    "another process registered this node id; not overwriting it",
                    extra={"key": self.key, "their_lease": f"{entry.lease:x}", "our_lease": f"{lease:x}"},
                )
            return False
        return True

    async def _publish(self, lease: int) -> None:
        version = self._version
        await self._store.put(self.key, self._record.to_json(), lease=lease)
        self._published = version
        changed, self._published_event = self._published_event, asyncio.Event()
        changed.set()

    def _on_lease_lost(self) -> None:
        self.leases_lost += 1
        log.warning(
            "lease lost (stall past the TTL, or revoked); registering again",
            extra={"node_id": self._record.node_id, "lease": f"{self.lease_id or 0:x}"},
        )
        self.lease_id = None
        self._published = -1
        self._set_session(SessionState.RETRYING)

    def _on_failure(self, exc: EtcdError) -> None:
        if self.session != SessionState.RETRYING:
            level = logging.WARNING if isinstance(exc, EtcdUnavailable) else logging.ERROR
            log.log(level, "etcd failing; retrying in the background", extra={"error": str(exc)})
        self._set_session(SessionState.RETRYING)
        self._wake.set()  # after the back-off, renew at once rather than a full interval later

    def _set_session(self, state: SessionState) -> None:
        if state != self.session:
            log.debug("registration session", extra={"from": str(self.session), "to": str(state)})
            self.session = state
