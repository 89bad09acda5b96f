"""Membership against a real etcd: registration, leases, the watch-fed view, outages, compaction.

Each test runs a fresh single-member etcd on loopback (tests.support.etcd) and drives
the asyncio code with uvloop inside a plain test function. TTLs are 1-2 s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvloop

from kvpool_client.core.membership.cluster import ensure_config, list_nodes, read_config, update_config
from kvpool_client.core.membership.etcd import EtcdStore, EtcdUnavailable, LeaseLost, WatchCompacted
from kvpool_client.core.membership.records import ClusterConfig, NodeRecord, NodeState, config_key, node_key
from kvpool_client.core.membership.view import Membership, MembershipView, ThreadedMembershipView
from kvpool_server.membership.registration import InvalidTransition, NodeRegistration, SessionState
from tests.support.etcd import LocalEtcd, local_etcd, requires_etcd

pytestmark = [pytest.mark.integration, requires_etcd]

CLUSTER = "test"
# Short timeouts so outages are noticed, and recovered from, quickly.
STORE_OPTIONS: dict[str, Any] = {"request_timeout_s": 1.0, "reconnect_backoff_max_s": 0.5}


def run(coro: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coro)


@pytest.fixture
def etcd() -> Iterator[LocalEtcd]:
    with local_etcd() as server:
        yield server


def store_for(server: LocalEtcd) -> EtcdStore:
    return EtcdStore(server.endpoints, **STORE_OPTIONS)


def record(node_id: str = "node-1", state: NodeState = NodeState.JOINING) -> NodeRecord:
    return NodeRecord(
        node_id=node_id,
        address="127.0.0.1:50051",
        data_endpoints={"tcp": "127.0.0.1:50052"},
        state=state,
        capacity_bytes=1 << 30,
        weight=1.0,
        version="0.1.0",
        registered_at=1700000000.0,
    )


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout_s: float, step_s: float = 0.05) -> float:
    """Poll ``check`` until it is true; returns the seconds it took. Fails the test on timeout."""
    start = time.monotonic()
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"condition not met within {timeout_s} s")
        await asyncio.sleep(step_s)


def has_node(node_id: str, state: NodeState | None = None) -> Callable[[Membership], bool]:
    return lambda m: node_id in m.nodes and (state is None or m.nodes[node_id].state == state)


def test_registration_writes_the_record_under_a_lease(etcd: LocalEtcd) -> None:
    async def scenario() -> None:
        async with store_for(etcd) as store:
            reg = NodeRegistration(store, CLUSTER, record(), ttl_s=2)
            await reg.start()
            assert await reg.wait_registered(3)
            entry = await store.get(node_key(CLUSTER, "node-1"))
            assert entry is not None and entry.lease == reg.lease_id
            assert json.loads(entry.value) == {
                "schema": 1,
                "node_id": "node-1",
                "address": "127.0.0.1:50051",
                "data_endpoints": {"tcp": "127.0.0.1:50052"},
                "state": "joining",
                "capacity_bytes": 1 << 30,
                "weight": 1.0,
                "version": "0.1.0",
                "registered_at": 1700000000.0,
            }
            assert reg.connected
            await reg.close(revoke=True)
            assert await store.get(node_key(CLUSTER, "node-1")) is None  # revoked: gone at once
            assert reg.session == SessionState.CLOSED

    run(scenario())


def test_keepalive_keeps_the_record_beyond_the_ttl(etcd: LocalEtcd) -> None:
    async def scenario() -> None:
        async with store_for(etcd) as store:
            reg = NodeRegistration(store, CLUSTER, record(), ttl_s=1)
            await reg.start()
            assert await reg.wait_registered(3)
            lease = reg.lease_id
            await asyncio.sleep(3.0)  # three TTLs
            entry = await store.get(node_key(CLUSTER, "node-1"))
            assert entry is not None and entry.lease == lease
            assert reg.registrations == 1 and reg.leases_lost == 0
            await reg.close()

    run(scenario())


def test_record_vanishes_within_ttl_when_keepalives_stop(etcd: LocalEtcd) -> None:
    async def scenario() -> None:
        async with store_for(etcd) as store, store_for(etcd) as view_store:
            view = MembershipView(view_store, CLUSTER)
            await view.start()
            reg = NodeRegistration(store, CLUSTER, record(), ttl_s=2)
            await reg.start()
            await view.wait_for(has_node("node-1"), 3)
            await reg.close(revoke=False)  # as if the daemon hung: the lease is left to expire
            stopped = time.monotonic()
            await view.wait_for(lambda m: not m.nodes, 2 + 1)
            assert time.monotonic() - stopped <= 2 + 1
            await view.close()

    run(scenario())


_VICTIM = """
import asyncio, sys, uvloop
from kvpool_client.core.membership.etcd import EtcdStore
from kvpool_client.core.membership.records import NodeRecord
from kvpool_server.membership.registration import NodeRegistration

async def main():
    store = await EtcdStore(sys.argv[1]).connect()
    reg = NodeRegistration(store, "test", NodeRecord("victim", "127.0.0.1:1"), ttl_s=2)
    await reg.start()
    await asyncio.Event().wait()

uvloop.run(main())
"""


def test_killed_process_record_vanishes_within_ttl_plus_1s(etcd: LocalEtcd) -> None:
    victim = subprocess.Popen([sys.executable, "-c", _VICTIM, etcd.endpoint])
    try:

        async def scenario() -> None:
            async with store_for(etcd) as store:
                view = MembershipView(store, CLUSTER)
                await view.start()
                await view.wait_for(has_node("victim"), 15)
                victim.kill()
                victim.wait(5)
                killed = time.monotonic()
                await view.wait_for(lambda m: not m.nodes, 2 + 1)
                assert time.monotonic() - killed <= 2 + 1
                await view.close()

        run(scenario())
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(5)


def test_revoked_lease_is_detected_and_the_node_registers_again(etcd: LocalEtcd) -> None:
    async def scenario() -> None:
        async with store_for(etcd) as store, store_for(etcd) as admin:
            reg = NodeRegistration(store, CLUSTER, record(), ttl_s=1)
            await reg.start()
            assert await reg.wait_registered(3)
            first = reg.lease_id
            assert first is not None
            assert await admin.revoke(first)
            assert await admin.get(node_key(CLUSTER, "node-1")) is None
            await eventually(lambda: reg.registrations == 2, 2)
            entry = await admin.get(node_key(CLUSTER, "node-1"))
            assert entry is not None and entry.lease == reg.lease_id != first
            assert reg.leases_lost == 1 and reg.connected
            with pytest.raises(LeaseLost):
                await admin.keepalive_once(first)
            await reg.close()

    run(scenario())


def test_a_stall_past_the_ttl_loses_the_lease_and_registers_again(etcd: LocalEtcd) -> None:
    seen: list[bool] = []
    with ThreadedMembershipView(etcd.endpoints, CLUSTER, store_options=STORE_OPTIONS) as observer:
        observer.subscribe(lambda m: seen.append("node-1" in m.nodes))

        async def scenario() -> None:
            async with store_for(etcd) as store:
                reg = NodeRegistration(store, CLUSTER, record(), ttl_s=1)
                await reg.start()
                assert await reg.wait_registered(3)
                first = reg.lease_id
                time.sleep(2.5)  # the whole event loop stalls: no keepalives; etcd expires the lease
                await eventually(lambda: reg.registrations == 2, 3)
                assert reg.lease_id != first and reg.leases_lost == 1
                await reg.close()

        run(scenario())
    vanished = seen.index(False, seen.index(True))
    assert True in seen[vanished:], seen  # it vanished during the stall, then came back


def test_view_sees_state_changes_through_the_watch(etcd: LocalEtcd) -> None:
    async def scenario() -> None:
        async with store_for(etcd) as store, store_for(etcd) as view_store:
            view = MembershipView(view_store, CLUSTER)
            await view.start()
            assert await view.wait_synced(3)
            reg = NodeRegistration(store, CLUSTER, record(), ttl_s=2)
            await reg.start()
            await view.wait_for(has_node("node-1", NodeState.JOINING), 3)
            for state in (NodeState.ACTIVE, NodeState.DRAINING, NodeState.ACTIVE):
                assert await reg.set_state(state)
                snap = await view.wait_for(has_node("node-1", state), 2)
                assert [n.node_id for n in snap.active()] == (["node-1"] if state == NodeState.ACTIVE else [])
            with pytest.raises(InvalidTransition):
                await reg.set_state(NodeState.JOINING)
            assert view.resyncs == 1  # all of it came through one watch
            await reg.close()
            await view.wait_for(lambda m: not m.nodes, 2)
            await view.close()

    run(scenario())


def test_etcd_restart_view_keeps_membership_and_everything_recovers(etcd: LocalEtcd) -> None:
    async def scenario() -> None:
        async with store_for(etcd) as store, store_for(etcd) as view_store:
            view = MembershipView(view_store, CLUSTER)
            await view.start()
            reg = NodeRegistration(store, CLUSTER, record(state=NodeState.ACTIVE), ttl_s=2)
            await reg.start()
            before = await view.wait_for(has_node("node-1"), 3)

            etcd.stop()
            await eventually(lambda: not view.connected and reg.session == SessionState.RETRYING, 5)
            await asyncio.sleep(3.0)  # longer than the TTL
            assert view.snapshot() == before  # the last membership is kept through the outage
            assert await reg.set_state(NodeState.DRAINING, wait_s=0.2) is False  # queued, not lost

            etcd.start()
            await eventually(lambda: reg.connected, 5)
            await view.wait_for(has_node("node-1", NodeState.DRAINING), 5)
            await eventually(lambda: view.connected, 5)
            # etcd restores leases with a fresh TTL, so the old lease normally survives; a
            # starved test process may miss that window and register again, which is fine.
            entry = await store.get(node_key(CLUSTER, "node-1"))
            assert entry is not None and entry.lease == reg.lease_id, (entry, reg.registrations)

            # The watch is live again: a new change arrives.
            assert await reg.set_state(NodeState.ACTIVE)
            await view.wait_for(has_node("node-1", NodeState.ACTIVE), 2)
            await reg.close()
            await view.close()

    run(scenario())


def test_registration_started_while_etcd_is_down_registers_when_it_returns(etcd: LocalEtcd) -> None:
    etcd.stop()

    async def scenario() -> None:
        async with store_for(etcd) as store:
            with pytest.raises(EtcdUnavailable):
                await store.ping()
            reg = NodeRegistration(store, CLUSTER, record(), ttl_s=1)
            await reg.start()  # never raises
            assert not await reg.wait_registered(1.0)
            assert reg.session == SessionState.RETRYING and not reg.connected
            etcd.start()
            assert await reg.wait_registered(5)
            assert await store.get(node_key(CLUSTER, "node-1")) is not None
            await reg.close()

    run(scenario())


class _CompactedBeforeWatchView(MembershipView):
    """After its first read, and before its watch starts, the cluster changes and is compacted."""

    def __init__(self, *args: Any, before_watch: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._before_watch: Callable[[], Awaitable[None]] | None = before_watch

    async def _resync(self, *, recovered: bool) -> int:
        revision = await super()._resync(recovered=recovered)
        hook, self._before_watch = self._before_watch, None
        if hook is not None:
            await hook()
        return revision


def test_watch_behind_compaction_rereads_and_converges(etcd: LocalEtcd) -> None:
    async def scenario() -> None:
        async with store_for(etcd) as admin, store_for(etcd) as view_store:
            await admin.put(node_key(CLUSTER, "a"), record("a").to_json())

            async def change_and_compact() -> None:
                await admin.delete(node_key(CLUSTER, "a"))
                revision = await admin.put(node_key(CLUSTER, "b"), record("b").to_json())
                await admin.compact(revision)

            view = _CompactedBeforeWatchView(view_store, CLUSTER, before_watch=change_and_compact)
            await view.start()
            snap = await view.wait_for(lambda m: set(m.nodes) == {"b"}, 3)
            assert view.resyncs == 2 and snap.revision >= 3
            with pytest.raises(WatchCompacted):
                async for _ in admin.watch_prefix("/kvpool/", 1):
                    pass
            await view.close()

    run(scenario())


def test_malformed_records_are_skipped_with_a_log(etcd: LocalEtcd, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kvpool.membership")

    async def scenario() -> None:
        async with store_for(etcd) as admin, store_for(etcd) as view_store:
            await admin.put(node_key(CLUSTER, "good"), record("good").to_json())
            await admin.put(node_key(CLUSTER, "garbage"), b"{not json")
            await admin.put(node_key(CLUSTER, "liar"), record("someone-else").to_json())
            await admin.put(config_key(CLUSTER), b'{"schema": 1, "replicas": 0}')
            view = MembershipView(view_store, CLUSTER)
            await view.start()
            assert await view.wait_synced(3)
            assert set(view.nodes()) == {"good"} and view.config() is None
            logged = " ".join(str(r.__dict__.get("key")) for r in caplog.records)
            assert node_key(CLUSTER, "garbage") in logged and node_key(CLUSTER, "liar") in logged

            # Through the watch: a bad value replaces a good one, and a new good node arrives.
            await admin.put(node_key(CLUSTER, "good"), b"[]")
            await admin.put(node_key(CLUSTER, "late"), record("late").to_json())
            await view.wait_for(lambda m: set(m.nodes) == {"late"}, 2)
            listing = await list_nodes(admin, CLUSTER)
            assert set(listing.nodes) == {"late"}
            assert set(listing.malformed) == {node_key(CLUSTER, n) for n in ("good", "garbage", "liar")}
            await view.close()

    run(scenario())


def test_cluster_config_compare_and_swap_reaches_the_view(etcd: LocalEtcd) -> None:
    async def scenario() -> None:
        async with store_for(etcd) as admin, store_for(etcd) as view_store:
            view = MembershipView(view_store, CLUSTER)
            await view.start()
            assert await read_config(admin, CLUSTER) is None
            first = ClusterConfig(block_size=16, replicas=2, write_quorum=1, placement_version=1)
            assert await ensure_config(admin, CLUSTER, first) == first
            assert await ensure_config(admin, CLUSTER, ClusterConfig()) == first  # existing one wins
            await view.wait_for(lambda m: m.config == first, 2)

            async def bump(field: str) -> ClusterConfig:
                def change(current: ClusterConfig | None) -> ClusterConfig:
                    assert current is not None
                    values = {
                        "block_size": current.block_size,
                        "replicas": current.replicas,
                        "write_quorum": current.write_quorum,
                        "placement_version": current.placement_version,
                    }
                    values[field] += 1
                    return ClusterConfig(**values)

                return await update_config(admin, CLUSTER, change, attempts=10)

            # Two concurrent writers of different fields: both changes land.
            await asyncio.gather(bump("replicas"), bump("placement_version"))
            final = ClusterConfig(block_size=16, replicas=3, write_quorum=1, placement_version=2)
            assert await read_config(admin, CLUSTER) == final
            await view.wait_for(lambda m: m.config == final, 2)
            with pytest.raises(ValueError):
                await update_config(admin, CLUSTER, lambda c: ClusterConfig(replicas=1, write_quorum=2))
            await view.close()

    run(scenario())


def test_threaded_view_serves_blocking_callers(etcd: LocalEtcd) -> None:
    with ThreadedMembershipView(etcd.endpoints, CLUSTER, store_options=STORE_OPTIONS) as view:
        assert view.synced and view.nodes() == {}

        async def register() -> None:
            async with store_for(etcd) as store:
                await store.put(node_key(CLUSTER, "n1"), record("n1", NodeState.ACTIVE).to_json())

        run(register())
        snap = view.wait_for(has_node("n1", NodeState.ACTIVE), 3)
        assert view.snapshot() is snap or view.revision >= snap.revision
        with pytest.raises(TimeoutError):
            view.wait_for(has_node("nobody"), 0.2)
    assert not view._thread.is_alive()
