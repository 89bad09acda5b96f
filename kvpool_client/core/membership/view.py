"""A live, read-only view of one cluster's members and config, fed by an etcd watch.

``MembershipView`` reads the whole ``/kvpool/<cluster>/`` prefix once, then watches
it from the next revision. When the watch fails (etcd unreachable, history
compacted, stream ended), it backs off, reads the prefix again and watches from
there; until then it keeps the last membership it saw, so clients keep placing keys
while etcd is down. Each change publishes a new immutable :class:`Membership`
snapshot: readers never see a half-applied update and never need a lock.

``ThreadedMembershipView`` runs one on its own event loop in a daemon thread, for
the blocking client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kvpool_client.core.membership.backoff import Backoff
from kvpool_client.core.membership.errors import RecordError
from kvpool_client.core.membership.etcd import (
    EtcdError,
    EtcdStore,
    EtcdUnavailable,
    PutEvent,
    WatchCompacted,
    WatchEvent,
)
from kvpool_client.core.membership.records import (
    ClusterConfig,
    NodeRecord,
    NodeState,
    cluster_prefix,
    config_key,
    nodes_prefix,
)

log = logging.getLogger("kvpool.membership.view")

Listener = Callable[["Membership"], None]
# A watch that ran this long was healthy: its failure starts the back-off afresh.
_STABLE_S = 1.0


@dataclass(frozen=True, slots=True)
class Membership:
    """One consistent snapshot: the valid node records, the config, and the etcd revision."""

    nodes: Mapping[str, NodeRecord]
    config: ClusterConfig | None
    revision: int

    def in_state(self, state: NodeState) -> list[NodeRecord]:
        """Nodes in ``state``, sorted by id."""
        return [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].state == state]

    def active(self) -> list[NodeRecord]:
        """The nodes that take new writes, sorted by id."""
        return self.in_state(NodeState.ACTIVE)


EMPTY = Membership(MappingProxyType({}), None, 0)


class MembershipView:
    """Watches one cluster's prefix and keeps the latest :class:`Membership`.

    Args:
        store: a connected store; the view does not close it.
        cluster: the cluster name.
        backoff: delays between resync attempts (default 0.1 s doubling to 2 s).
    """

    def __init__(self, store: EtcdStore, cluster: str, *, backoff: Backoff | None = None) -> None:
        self._store = store
        self.cluster = cluster
        self._prefix = cluster_prefix(cluster)
        self._nodes_prefix = nodes_prefix(cluster)
        self._config_key = config_key(cluster)
        self._backoff = backoff or Backoff(0.1, 2.0)
        self._nodes: dict[str, NodeRecord] = {}
        self._config: ClusterConfig | None = None
        self._revision = 0
        self._snapshot = EMPTY
        self._changed = asyncio.Event()
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None
        self.synced = False  # one full read done
        self.connected = False  # the last read succeeded and no watch has failed since
        self.resyncs = 0  # full reads done, for metrics

    async def start(self) -> None:
        """Start following etcd in the background; returns at once (see :meth:`wait_synced`)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kvpool-membership-{self.cluster}")

    async def close(self, timeout_s: float = 2.0) -> None:
        """Stop the watch (bounded wait). The last snapshot stays readable."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=timeout_s)
        self.connected = False

    async def __aenter__(self) -> MembershipView:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def snapshot(self) -> Membership:
        """The latest membership; safe to read from any thread."""
        return self._snapshot

    def nodes(self) -> Mapping[str, NodeRecord]:
        return self._snapshot.nodes

    def config(self) -> ClusterConfig | None:
        return self._snapshot.config

    @property
    def revision(self) -> int:
        return self._snapshot.revision

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(snapshot)`` after each change, on the view's loop. Returns an unsubscribe function.

        A listener must be quick and must not raise (exceptions are logged and dropped).
        """
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    async def wait_for(self, predicate: Callable[[Membership], bool], timeout_s: float) -> Membership:
        """Wait until ``predicate(snapshot)`` holds and return that snapshot.

        Raises:
            TimeoutError: it did not hold within ``timeout_s``.
        """
        async with asyncio.timeout(timeout_s):
            while not predicate(self._snapshot):
                await self._changed.wait()
        return self._snapshot

    async def wait_synced(self, timeout_s: float) -> bool:
        """True once the first full read is done; False if that takes longer than ``timeout_s``."""
        try:
            await self.wait_for(lambda _: self.synced, timeout_s)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            watch_started = float("inf")
            try:
                revision = await self._resync(recovered=failures > 0)
                failures = 0
                watch_started = loop.time()
                async with contextlib.aclosing(self._store.watch_prefix(self._prefix, revision + 1)) as events:
                    async for event in events:
                        self._apply(event)
            except WatchCompacted as exc:
                log.info("membership watch fell behind compaction; reading again", extra={"error": str(exc)})
            except EtcdUnavailable as exc:
                self._log_outage(exc, failures)
                failures += 1
            except EtcdError as exc:
                log.error("membership watch failed; reading again", extra={"error": str(exc)})
                failures += 1
            except Exception:  # a bug must not end the watch for good: log it and go on
                log.exception("membership view failed unexpectedly; reading again")
                failures += 1
            self.connected = False
            if loop.time() - watch_started >= _STABLE_S:
                self._backoff.reset()
            await asyncio.sleep(self._backoff.next())

    def _log_outage(self, exc: EtcdError, failures: int) -> None:
        if failures == 0:
            snap = self._snapshot
            log.warning(
                "etcd unreachable; keeping the last membership",
                extra={"error": str(exc), "nodes": len(snap.nodes), "revision": snap.revision},
            )
        else:
            log.debug("etcd still unreachable", extra={"error": str(exc), "failures": failures})

    async def _resync(self, *, recovered: bool) -> int:
        items, revision = await self._store.get_prefix(self._prefix)
        nodes: dict[str, NodeRecord] = {}
        config: ClusterConfig | None = None
        for key, value in items.items():
            if key == self._config_key:
                config = self._decode_config(value)
            elif key.startswith(self._nodes_prefix):
                record = self._decode_node(key, value)
                if record is not None:
                    nodes[record.node_id] = record
        if revision < self._revision:
            log.warning(
                "etcd revision went backwards (restored or replaced?)", extra={"was": self._revision, "now": revision}
            )
        self._nodes, self._config, self._revision = nodes, config, revision
        self.synced = self.connected = True
        self.resyncs += 1
        if recovered:
            log.info("etcd reachable again; membership re-read", extra={"nodes": len(nodes), "revision": revision})
        self._publish()
        return revision

    def _apply(self, event: WatchEvent) -> None:
        key = event.key
        if key == self._config_key:
            self._config = self._decode_config(event.value) if isinstance(event, PutEvent) else None
        elif key.startswith(self._nodes_prefix):
            node_id = key[len(self._nodes_prefix) :]
            record = self._decode_node(key, event.value) if isinstance(event, PutEvent) else None
            if record is None:
                self._nodes.pop(node_id, None)  # deleted, expired, or no longer a valid record
            else:
                self._nodes[node_id] = record
        self._revision = max(self._revision, event.mod_revision)
        self._publish()

    def _decode_node(self, key: str, value: bytes) -> NodeRecord | None:
        try:
            return NodeRecord.from_json(value, expected_id=key[len(self._nodes_prefix) :])
        except RecordError as exc:
            log.warning("skipping a malformed node record", extra={"key": key, "error": str(exc)})
            return None

    def _decode_config(self, value: bytes) -> ClusterConfig | None:
        try:
            return ClusterConfig.from_json(value)
        except RecordError as exc:
            log.error("ignoring a malformed cluster config", extra={"key": self._config_key, "error": str(exc)})
            return None

    def _publish(self) -> None:
        self._snapshot = Membership(MappingProxyType(dict(self._nodes)), self._config, self._revision)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for listener in list(self._listeners):
            try:
                listener(self._snapshot)
            except Exception:
                log.exception("membership listener failed")


class ThreadedMembershipView:
    """A :class:`MembershipView` on its own event loop in a daemon thread, for blocking code.

    Args:
        endpoints: etcd endpoints (see :class:`EtcdStore`).
        cluster: the cluster name.
        store_options: keyword arguments for :class:`EtcdStore`.
        backoff: delays between resync attempts.
    Raises:
        ValueError: malformed endpoints or cluster name.
    """

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        cluster: str,
        *,
        store_options: Mapping[str, Any] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self._store = EtcdStore(endpoints, **(store_options or {}))
        self.cluster = cluster
        cluster_prefix(cluster)  # validate now, in the caller's thread
        self._backoff = backoff
        self._view: MembershipView | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"kvpool-membership-{cluster}", daemon=True)

    def start(self, wait_synced_s: float | None = 5.0) -> bool:
        """Start the thread; with ``wait_synced_s``, wait that long for the first full read.

        Returns:
            True if the view is synced (always False when not waiting and not yet synced).
        """
        self._thread.start()
        self._ready.wait()
        if not wait_synced_s:
            return self.synced
        return bool(self._call(self._view_or_raise().wait_synced(wait_synced_s), wait_synced_s + 1))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the watch and the thread (bounded wait)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already stopped
                loop.call_soon_threadsafe(stop.set)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def __enter__(self) -> ThreadedMembershipView:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self) -> Membership:
        """The latest membership; safe from any thread."""
        return self._view.snapshot() if self._view is not None else EMPTY

    def nodes(self) -> Mapping[str, NodeRecord]:
        return self.snapshot().nodes

    def config(self) -> ClusterConfig | None:
        return self.snapshot().config

    @property
    def revision(self) -> int:
        return self.snapshot().revision

    @property
    def synced(self) -> bool:
        return self._view is not None and self._view.synced

    @property
    def connected(self) -> bool:
        return self._view is not None and self._view.connected

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Like :meth:`MembershipView.subscribe`; the listener runs on the view's thread."""
        return self._view_or_raise().subscribe(listener)

    def wait_for(self, predicate: Callable[[Membership], bool], timeout_s: float) -> Membership:
        """Block until ``predicate(snapshot)`` holds (evaluated on the view's thread).

        Raises:
            TimeoutError: it did not hold within ``timeout_s``.
        """
        result: Membership = self._call(self._view_or_raise().wait_for(predicate, timeout_s), timeout_s + 1)
        return result

    def _view_or_raise(self) -> MembershipView:
        if self._view is None:
            raise RuntimeError("ThreadedMembershipView is not started")
        return self._view

    def _call(self, coro: Any, timeout_s: float) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _main(self) -> None:
        try:
            import uvloop

            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        except ImportError:
            factory = asyncio.new_event_loop
        try:
            # Runner cancels and awaits leftover tasks (gRPC's stream pumps) before closing the loop.
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(self._amain(runner.get_loop()))
        except Exception:
            log.exception("membership thread failed")
        finally:
            self._ready.set()  # never leave start() waiting, even if setup failed

    async def _amain(self, loop: asyncio.AbstractEventLoop) -> None:
        self._stop = asyncio.Event()
        await self._store.connect()
        view = MembershipView(self._store, self.cluster, backoff=self._backoff)
        await view.start()
        self._view, self._loop = view, loop
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await view.close()
            await asyncio.wait_for(self._store.close(), timeout=2.0)
