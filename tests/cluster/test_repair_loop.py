"""The repair loop's timing: debounce, cancel on change, the settle cap under flapping (its runs are
not cancelled by changes), retry after a failed run, clean close.

The runs are plain coroutines that record what they were given; settle delays are tens
of milliseconds, and every wait has a bound much longer than the delays it waits for.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from kvpool_client.core.membership.backoff import Backoff
from kvpool_client.core.routing import Member
from kvpool_server.membership.repair import RepairLoop, Topology

SETTLE_S = 0.05


def topo(*node_ids: str, replicas: int = 2) -> Topology:
    members = tuple(Member(n, f"127.0.0.1:{7000 + i}") for i, n in enumerate(node_ids))
    return Topology(members, tuple(1.0 for _ in node_ids), replicas)


class Runs:
    """A repair run that records each topology it was given, and how each run ended."""

    def __init__(self, outcome: bool = True, duration_s: float = 0.0) -> None:
        self.outcome = outcome
        self.duration_s = duration_s
        self.started: list[Topology] = []
        self.finished: list[Topology] = []
        self.cancelled: list[Topology] = []

    async def __call__(self, topology: Topology) -> bool:
        self.started.append(topology)
        try:
            await asyncio.sleep(self.duration_s)
        except asyncio.CancelledError:
            self.cancelled.append(topology)
            raise
        self.finished.append(topology)
        return self.outcome


def loop_with(runs: Callable[[Topology], Awaitable[bool]], retry_s: float = 10.0) -> RepairLoop:
    return RepairLoop(runs, SETTLE_S, Backoff(retry_s, retry_s, random.Random(1)))


async def until(condition: Callable[[], bool], limit_s: float = 2.0) -> None:
    async with asyncio.timeout(limit_s):
        while not condition():
            await asyncio.sleep(0.005)


def test_a_burst_of_changes_causes_one_run_with_the_last_topology() -> None:
    async def scenario() -> None:
        runs = Runs()
        loop = loop_with(runs)
        await loop.start()
        for n in range(5):  # a flapping node: changes closer together than the settle delay
            loop.observe(topo("a", "b") if n % 2 else topo("a", "b", "c"))
            await asyncio.sleep(SETTLE_S / 5)
        await until(lambda: len(runs.finished) == 1)
        await until(lambda: loop.idle)  # nothing more runs until a change
        await loop.close()
        assert runs.started == [topo("a", "b", "c")]

    asyncio.run(scenario())


def test_the_same_topology_again_is_not_a_change() -> None:
    async def scenario() -> None:
        runs = Runs()
        loop = loop_with(runs)
        await loop.start()
        loop.observe(topo("a", "b"))
        await until(lambda: len(runs.finished) == 1)
        await until(lambda: loop.idle)
        loop.observe(topo("a", "b"))  # a lease renewal re-put the same records
        assert loop.idle, "the same topology started a settle delay"
        await loop.close()
        assert len(runs.started) == 1

    asyncio.run(scenario())


def test_a_change_during_a_run_cancels_it_and_runs_again_after_settling() -> None:
    async def scenario() -> None:
        runs = Runs(duration_s=10.0)
        loop = loop_with(runs)
        await loop.start()
        loop.observe(topo("a", "b"))
        await until(lambda: len(runs.started) == 1)
        loop.observe(topo("a", "b", "c"))
        await until(lambda: len(runs.started) == 2)
        assert runs.cancelled == [topo("a", "b")]
        assert runs.started[1] == topo("a", "b", "c")
        await loop.close()
        assert runs.cancelled == [topo("a", "b"), topo("a", "b", "c")], "close cancels the run in progress"
        assert runs.finished == []

    asyncio.run(scenario())


def test_a_failed_run_is_retried_after_the_back_off_and_a_good_one_is_not() -> None:
    async def scenario() -> None:
        runs = Runs(outcome=False)
        loop = loop_with(runs, retry_s=0.1)
        await loop.start()
        loop.observe(topo("a", "b"))
        await until(lambda: len(runs.finished) == 2)  # the first failed: retried with the same topology
        runs.outcome = True
        await until(lambda: len(runs.finished) == 3)
        await until(lambda: loop.idle)  # no retry pending after a clean run: nothing runs until a change
        await loop.close()
        assert runs.finished == [topo("a", "b")] * 3

    asyncio.run(scenario())


def test_the_loop_is_idle_only_while_nothing_is_pending() -> None:
    async def scenario() -> None:
        runs = Runs(outcome=False, duration_s=SETTLE_S)
        loop = loop_with(runs, retry_s=10.0)
        assert not loop.idle, "not started"
        await loop.start()
        await until(lambda: loop.idle)
        loop.observe(topo("a", "b"))
        assert not loop.idle, "a change starts the settle delay"
        await until(lambda: len(runs.started) == 1)
        assert not loop.idle, "a run is in progress"
        await until(lambda: len(runs.finished) == 1)
        assert not loop.idle, "the run's outcome is being taken, or its retry is pending (it failed)"
        runs.outcome = True
        loop.observe(topo("a", "b", "c"))  # a change replaces the pending retry
        await until(lambda: len(runs.finished) == 2)
        await until(lambda: loop.idle)
        await loop.close()
        assert not loop.idle, "closed"
        assert runs.started == [topo("a", "b"), topo("a", "b", "c")]

    asyncio.run(scenario())


def test_a_run_that_raises_is_logged_and_retried() -> None:
    async def scenario() -> None:
        calls: list[Topology] = []

        async def broken(topology: Topology) -> bool:
            calls.append(topology)
            if len(calls) == 1:
                raise RuntimeError("a bug")
            return True

        loop = loop_with(broken, retry_s=0.05)
        await loop.start()
        loop.observe(topo("a"))
        await until(lambda: len(calls) == 2)
        await loop.close()

    asyncio.run(scenario())


def test_close_before_any_change_and_twice_is_clean() -> None:
    async def scenario() -> None:
        loop = loop_with(Runs())
        await loop.start()
        await loop.close()
        await loop.close()
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(scenario())


def loop_busy(runs: Runs) -> bool:
    """Whether a run has started and not ended."""
    return len(runs.started) > len(runs.finished) + len(runs.cancelled)


async def flap(loop: RepairLoop, every_s: float, for_s: float) -> Topology:
    """Change the topology every ``every_s`` for ``for_s`` (a node that keeps leaving and coming back); the last one."""
    last = topo("a", "b")
    for n in range(round(for_s / every_s)):
        last = topo("a", "b") if n % 2 else topo("a", "b", "c")
        loop.observe(last)
        await asyncio.sleep(every_s)
    return last


def test_a_membership_that_never_settles_still_gets_complete_runs() -> None:
    async def scenario() -> None:
        runs = Runs(duration_s=2 * SETTLE_S)
        loop = loop_with(runs)
        await loop.start()
        last = await flap(loop, SETTLE_S * 0.4, 40 * SETTLE_S)  # never quiet; the cap (10 delays) passes 3 times
        assert len(runs.finished) >= 2, f"started {len(runs.started)}, finished {len(runs.finished)}"
        await until(lambda: runs.finished[-1] == last and not loop_busy(runs))  # then one for the latest topology
        await loop.close()

    asyncio.run(scenario())


def test_runs_cancelled_by_change_after_change_reach_the_cap_and_finish() -> None:
    async def scenario() -> None:
        runs = Runs(duration_s=3 * SETTLE_S)
        loop = loop_with(runs)
        await loop.start()
        # Quiet for a settle delay between changes, but never for a whole run: each such run is cancelled.
        await flap(loop, SETTLE_S * 1.5, 30 * SETTLE_S)
        await loop.close()
        assert runs.cancelled, "the scenario needs runs that a change cancelled"
        assert runs.finished, "the cap counts from the first change not repaired, across cancelled runs"

    asyncio.run(scenario())


def test_close_cancels_a_run_the_cap_started() -> None:
    async def scenario() -> None:
        runs = Runs(duration_s=10.0)
        loop = loop_with(runs)
        await loop.start()
        await flap(loop, SETTLE_S * 0.4, 15 * SETTLE_S)  # the cap starts a run at 10 delays; changes keep coming
        assert loop_busy(runs) and len(runs.cancelled) == len(runs.started) - 1, "changes do not cancel it"
        await loop.close(timeout_s=1.0)
        assert len(runs.cancelled) == len(runs.started) and runs.finished == []
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(scenario())
