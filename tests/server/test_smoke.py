"""A real daemon process, both clients, one round trip each."""

from __future__ import annotations

import asyncio

from kvpool_client import AsyncKVPoolClient, BlockKey, BlockKeyBuilder, KVPoolClient, Namespace
from tests.support.daemon import DaemonProcess

NS = Namespace("smoke-model", "fp16", "L1-H1-D8-T4")


def test_sync_and_async_clients_round_trip(daemon: DaemonProcess) -> None:
    keys = BlockKeyBuilder(NS, block_size=4).keys(list(range(32)))
    blocks = [bytes([i]) * 4096 for i in range(len(keys))]
    with KVPoolClient([daemon.address]) as client:
        assert client.put(keys, blocks).stored == len(keys)
        got = client.get(keys)
        assert [bytes(b) for b in got.buffers] == blocks, got.statuses

    async def read_back() -> list[bytes]:
        async with AsyncKVPoolClient([daemon.address]) as client:
            result = await client.get(keys)
            return [bytes(b) for b in result.buffers]

    assert asyncio.run(read_back()) == blocks


def test_both_clients_list_namespaces(daemon: DaemonProcess) -> None:
    key = BlockKey("listed-ns", b"k")
    with KVPoolClient([daemon.address]) as client:
        client.put([key], [b"z" * 100]).raise_for_errors()
        rows = [(r.namespace, r.tier, r.blocks, r.bytes) for r in client.namespaces(daemon.address)]

    async def listed() -> list[tuple[str, str, int, int]]:
        async with AsyncKVPoolClient([daemon.address]) as aclient:
            return [(r.namespace, r.tier, r.blocks, r.bytes) for r in await aclient.namespaces(daemon.address)]

    assert ("listed-ns", "dram", 1, 100) in rows
    assert asyncio.run(listed()) == rows


def test_both_clients_count_what_they_did(daemon: DaemonProcess) -> None:
    keys = [BlockKey("counted", b"k%d" % i) for i in range(3)]
    with KVPoolClient([daemon.address]) as client:
        client.put(keys, [b"c" * 1000] * 3).raise_for_errors()
        client.get([*keys, BlockKey("counted", b"absent")])
        assert client.lookup(keys) == 3
        stats = client.counters()
    assert (stats.puts, stats.blocks_stored, stats.blocks_not_stored) == (1, 3, 0)
    assert (stats.gets, stats.get_hits, stats.get_misses, stats.bytes_received) == (1, 3, 1, 3000)
    assert (stats.lookups, stats.lookup_keys, stats.lookup_hits) == (1, 3, 3)
    assert not stats.node_errors

    async def counted_dead() -> dict[str, dict[str, int]]:
        async with AsyncKVPoolClient(["127.0.0.1:9"]) as dead:  # nothing listens there
            await dead.lookup(keys)
            return {node: dict(codes) for node, codes in dead.counters().node_errors.items()}

    assert asyncio.run(counted_dead()) == {"127.0.0.1:9": {"UNAVAILABLE": 1}}
