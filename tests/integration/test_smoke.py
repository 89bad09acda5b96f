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
