"""Re-replication: after the membership changes, copy blocks to owners that lack them.

Placement is computed, so when the active nodes change, some keys get new owners,
and a node that restarted comes back empty under its old id. Without repair a
block acknowledged on R nodes depends on exactly those nodes: after a join moves
its ownership and one of its holders restarts, no owner may hold it even though a
node that is up does.

Each daemon watches the membership. Once the set of active nodes (each node's
incarnation: its registration time, so a restart counts) or the replica count has
stayed unchanged for ``settle_s``, the daemon walks its own blocks, places each
over the active nodes, asks every owner other than itself which of its keys it
lacks (batched EXISTS) and copies those (batched puts, paced, one owner at a time).
Every holder does this for every block it holds, owner or not, so a block comes
back to its owners as long as one node that is up holds it. Two holders may both
copy the same block at the same time; puts are put-if-absent, so that costs bytes,
never correctness.

A node that is no longer an owner keeps its copy: it ages out by LRU like any
block, and it keeps answering the reads of clients whose membership is behind.

A membership that never stays unchanged for ``settle_s`` still gets a run once
``_SETTLE_CAP`` settle delays have passed since its first change not yet repaired.
A newer change cancels a run in progress that started after a quiet settle delay
(it starts again after the next one, or at the cap); a run the cap started is not
cancelled by changes, so a flapping membership still gets complete runs, and the
changes it missed get another run after it ends (settled, or capped again).
Shutdown cancels any run. A run that failed to copy some block (unreachable
owner, refused block, BUSY: another writer's put not yet committed) is retried
with back-off (from ``settle_s`` to ``retry_max_s``) until one succeeds. Refusals
alone (owner full, the namespace at its quota there, a block over its limit) stop
the retries after ``_REFUSED_RUNS`` runs of one topology: those copies would be
refused the same way on every walk of the blocks, so they wait for the next
change (counted in ``repair_refused``).

Reads during the transition: clients read from a key's current owners (plus
draining nodes ranked among them). From a change until the repair has copied a
block, a client may miss on every owner of that block: a miss (recompute), never
wrong bytes. The window is the settle delay plus the time the run takes to reach
the block (its blocks x owners existence checks, and the copies at ``bandwidth``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kvpool_client.core.auth import Credentials
from kvpool_client.core.membership.backoff import Backoff
from kvpool_client.core.membership.etcd import EtcdStore
from kvpool_client.core.membership.records import ClusterConfig
from kvpool_client.core.membership.view import Membership, MembershipView
from kvpool_client.core.routing import PLACEMENT_VERSION, Member, member_of
from kvpool_server.membership.copies import EXISTS_BATCH, BlockCopier, CopyTally, Pacer, chunks, plan_copies
from kvpool_server.stats import Counters
from kvpool_server.tiers.store import BlockStore

log = logging.getLogger("kvpool.membership.repair")

# A membership that never stays quiet for settle_s still gets a repair this many settle delays after its first
# change not yet repaired; that run is not cancelled by later changes.
_SETTLE_CAP = 10
_STOP_S = 2.0  # how long close() waits for a run to unwind (clients to close)
_REFUSED_RUNS = 3  # runs of one topology that failed only on refusals, before they wait for a change


@dataclass(frozen=True, slots=True)
class RepairSettings:
    """How the daemon repairs (see ``repair_*`` in :class:`~kvpool_server.config.ServerConfig`).

    Attributes:
        settle_s: the membership must stay unchanged this long before a run starts.
        bandwidth: most payload bytes per second a run sends; 0: no limit.
        replicas: copies to keep of each block; 0: the cluster config's ``replicas``.
        retry_max_s: longest wait before retrying a run that failed to copy some block.
    """

    settle_s: float = 2.0
    bandwidth: int = 128 << 20
    replicas: int = 0
    retry_max_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Topology:
    """What decides which nodes should hold which blocks; a repair runs when it changes.

    Attributes:
        members: the active nodes, by id.
        incarnations: each member's registration time: a restarted node is a new
            incarnation (it may have come back empty) even though its id is the same.
        replicas: owners per key.
    """

    members: tuple[Member, ...]
    incarnations: tuple[float, ...]
    replicas: int


def topology_of(snapshot: Membership, replicas: int = 0) -> Topology:
    """The topology of a membership snapshot (pure).

    Args:
        snapshot: the membership as the view last saw it.
        replicas: an override of the cluster config's replica count; 0: none.
    Returns:
        The active members and the replica count. A cluster that uses a placement
        version this daemon does not implement yields no members: copying blocks
        to owners computed another way would only waste space.
    """
    config = snapshot.config or ClusterConfig()
    if config.placement_version != PLACEMENT_VERSION:
        return Topology((), (), replicas or config.replicas)
    active = snapshot.active()
    return Topology(
        tuple(member_of(r) for r in active), tuple(r.registered_at for r in active), replicas or config.replicas
    )


@dataclass(slots=True)
class RepairProgress:
    """One run's counts so far (a cancelled run reports how far it got)."""

    blocks: int = 0  # blocks held here when the run began
    owners: int = 0  # other nodes asked
    checked: int = 0  # (block, owner) pairs checked
    copied: CopyTally = field(default_factory=CopyTally)
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, float]:
        tally = self.copied
        return {"blocks": self.blocks, "owners": self.owners, "checked": self.checked, "present": tally.present,
                "copies": tally.copies, "failed": tally.failed, "refused": tally.refused, "gone": tally.gone,
                "bytes": tally.bytes, "seconds": round(time.monotonic() - self.started, 3)}  # fmt: skip


async def repair_blocks(
    blocks: BlockStore,
    topology: Topology,
    self_id: str,
    credentials: Credentials,
    pacer: Pacer,
    counters: Counters,
    progress: RepairProgress,
) -> None:
    """Copy every block held here to each of its owners (other than this node) that lacks it.

    Keys are planned and checked a chunk at a time, so a node with millions of
    blocks never blocks the event loop on planning; counters move live.
    """
    keys = await asyncio.to_thread(blocks.readable_keys)  # O(blocks) under the tier locks: not on the loop
    progress.blocks = len(keys)
    members = {m.node_id: m for m in topology.members}
    async with contextlib.AsyncExitStack() as stack:
        copiers: dict[str, BlockCopier] = {}
        for part in chunks(keys, EXISTS_BATCH):
            for node_id, owned in plan_copies(part, topology.members, topology.replicas, self_id).items():
                if node_id not in copiers:
                    copiers[node_id] = await stack.enter_async_context(
                        BlockCopier(blocks, members[node_id], credentials, pacer)
                    )
                    progress.owners += 1
                progress.checked += len(owned)
                counters.add("repair_checked", len(owned))
                async for tally in copiers[node_id].copy(owned, skip_present=True):
                    progress.copied.add(tally)
                    counters.add("repair_copies", tally.copies)
                    counters.add("repair_failed", tally.failed)
            await asyncio.sleep(0)  # planning is CPU: let requests in between chunks


class RepairLoop:
    """Runs ``run(topology)`` after each change of topology, once it has settled.

    A change cancels a run in progress, unless the run started because the
    membership had not settled within ``_SETTLE_CAP`` settle delays: that one runs
    to its end (only :meth:`close` cancels it), so flapping cannot starve repair.

    Args:
        run: one repair; returns False to be retried later (some copy failed), True otherwise.
        settle_s: quiet time required before a run (a flapping node causes one run, not many).
        retry: delays before retrying a run that returned False or raised.
    """

    def __init__(self, run: Callable[[Topology], Awaitable[bool]], settle_s: float, retry: Backoff) -> None:
        self._run_once = run
        self._settle_s = settle_s
        self._retry = retry
        self._latest: Topology | None = None
        self._changed = asyncio.Event()
        self._retry_handle: asyncio.TimerHandle | None = None  # None: no retry pending
        self._task: asyncio.Task[None] | None = None
        self._parked = False  # the loop waits for a change (or a retry's wake-up)

    @property
    def idle(self) -> bool:
        """Whether nothing runs until :meth:`observe` sees a change: no settle delay, run or retry pending."""
        return self._parked and not self._changed.is_set() and self._retry_handle is None

    def observe(self, topology: Topology) -> None:
        """Take the latest topology; a change (re)starts the settle delay and cancels a run started after settling."""
        if topology != self._latest:
            self._latest = topology
            self._changed.set()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="kvpool-repair")

    async def close(self, timeout_s: float = _STOP_S) -> None:
        """Cancel the run in progress and stop (bounded wait)."""
        self._cancel_retry()
        self._parked = False
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=timeout_s)

    async def _loop(self) -> None:
        clock = asyncio.get_running_loop().time
        deadline: float | None = None  # the cap: kept across cancelled runs, so cancelling cannot starve repair
        while True:
            self._parked = True
            await self._changed.wait()
            self._parked = False
            if deadline is None:
                deadline = clock() + _SETTLE_CAP * self._settle_s
            capped = await self._settle(deadline)
            self._cancel_retry()
            assert self._latest is not None
            ok = await (self._guarded(self._latest) if capped else self._run_until_changed(self._latest))
            if ok is None:
                continue  # cancelled by a change: still unrepaired, the same cap applies
            deadline = None
            if ok:
                self._retry.reset()
            else:
                self._retry_handle = asyncio.get_running_loop().call_later(self._retry.next(), self._retry_now)

    def _retry_now(self) -> None:
        self._retry_handle = None
        self._changed.set()

    def _cancel_retry(self) -> None:
        if self._retry_handle is not None:
            self._retry_handle.cancel()
            self._retry_handle = None

    async def _settle(self, deadline: float) -> bool:
        """Return once no change came for ``settle_s`` or ``deadline`` passed; True: the deadline did."""
        clock = asyncio.get_running_loop().time
        while True:
            self._changed.clear()
            left = deadline - clock()
            try:
                async with asyncio.timeout(min(self._settle_s, max(0.0, left))):
                    await self._changed.wait()
            except TimeoutError:
                return left < self._settle_s

    async def _run_until_changed(self, topology: Topology) -> bool | None:
        """One run, cancelled by the next change. Returns its outcome; None if cancelled."""
        run = asyncio.create_task(self._guarded(topology), name="kvpool-repair-run")
        change = asyncio.create_task(self._changed.wait())
        try:
            await asyncio.wait([run, change], return_when=asyncio.FIRST_COMPLETED)
        finally:
            change.cancel()
            if not run.done():
                run.cancel()
                await asyncio.wait([run], timeout=_STOP_S)
        return run.result() if run.done() and not run.cancelled() else None

    async def _guarded(self, topology: Topology) -> bool:
        try:
            return await self._run_once(topology)
        except Exception:  # a bug must not end repairs for good: log it, retry later
            log.exception("repair failed unexpectedly")
            return False


class MembershipRepair:
    """The daemon's repair: a membership watch feeding a :class:`RepairLoop` of :func:`repair_blocks` runs.

    Args:
        blocks: this node's block store.
        store: a connected etcd store (not closed here).
        cluster: the cluster name.
        self_id: this node's id.
        counters: the daemon's counters (``repair_*``).
        credentials: presented to the nodes copied to.
        settings: timing, pacing and replica count.
    """

    def __init__(
        self,
        blocks: BlockStore,
        store: EtcdStore,
        cluster: str,
        self_id: str,
        counters: Counters,
        credentials: Credentials,
        settings: RepairSettings,
    ) -> None:
        self._blocks = blocks
        self._self_id = self_id
        self._counters = counters
        self._credentials = credentials
        self._settings = settings
        self._view = MembershipView(store, cluster)
        retry = Backoff(max(0.1, settings.settle_s), max(0.1, settings.settle_s, settings.retry_max_s))
        self._loop = RepairLoop(self._run, settings.settle_s, retry)
        self._unsubscribe: Callable[[], None] | None = None
        self._refused_runs: tuple[Topology, int] | None = None  # consecutive runs that failed only on refusals

    async def start(self) -> None:
        """Follow the membership; returns at once (etcd may be down: the view retries)."""
        replicas = self._settings.replicas
        self._unsubscribe = self._view.subscribe(lambda snapshot: self._loop.observe(topology_of(snapshot, replicas)))
        await self._loop.start()
        await self._view.start()

    @property
    def idle(self) -> bool:
        """Whether the repair waits for a membership change with no run, settle delay or retry pending."""
        return self._loop.idle

    async def close(self) -> None:
        """Cancel a run in progress, stop watching (bounded waits)."""
        await self._loop.close()
        if self._unsubscribe is not None:
            self._unsubscribe()
        await self._view.close()

    async def _run(self, topology: Topology) -> bool:
        self._counters.add("repair_runs")
        progress = RepairProgress()
        pacer = Pacer(self._settings.bandwidth)
        try:
            await repair_blocks(self._blocks, topology, self._self_id, self._credentials, pacer, self._counters,
                                progress)  # fmt: skip
        except asyncio.CancelledError:
            self._counters.add("repair_cancelled")
            log.info("repair cancelled (membership changed or shutdown)", extra=progress.summary())
            raise
        level = logging.WARNING if progress.copied.failed else logging.INFO
        log.log(level, "repair done", extra={"nodes": len(topology.members), "replicas": topology.replicas,
                                             **progress.summary()})  # fmt: skip
        return self._settled(topology, progress.copied)

    def _settled(self, topology: Topology, tally: CopyTally) -> bool:
        """Whether a run needs no retry: every copy made, or only refusals left for ``_REFUSED_RUNS`` runs."""
        if tally.failed == 0 or tally.failed > tally.refused:
            self._refused_runs = None
            return tally.failed == 0
        last = self._refused_runs
        runs = last[1] + 1 if last is not None and last[0] == topology else 1
        self._refused_runs = (topology, runs)
        if runs < _REFUSED_RUNS:
            return False
        self._counters.add("repair_refused", tally.refused)
        log.warning("repair leaves refused copies until the membership changes", extra={"refused": tally.refused})
        return True
