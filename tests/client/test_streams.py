"""A large get or put to one node goes out as several frames at once (``streams_per_node``),
with the answers each key would have had from one frame: both clients, a real daemon."""

from __future__ import annotations

import asyncio

import numpy as np

from kvpool_client import AsyncKVPoolClient, BlockKeyBuilder, ClientConfig, KVPoolClient, Namespace
from kvpool_client.core.errors import ErrorCode
from tests.support.daemon import DaemonProcess

MiB = 1 << 20
NS = Namespace("streams-model", "fp16", "L1-H1-D8-T4")
BLOCK = MiB  # the daemon fixture's slab size
COUNT = 12  # 12 MiB: two streams of 6 MiB


def blocks(seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, BLOCK, dtype=np.uint8).tobytes() for _ in range(COUNT)]


def frames(client: KVPoolClient, address: str) -> tuple[int, int]:
    counters = client.stats(address).counters
    return int(counters["requests_put"]), int(counters["requests_get"])


def test_a_large_batch_is_sent_as_two_frames_and_answered_per_key(daemon: DaemonProcess) -> None:
    keys = BlockKeyBuilder(NS, block_size=4).keys(list(range(4 * COUNT)))
    data = blocks(1)
    config = ClientConfig(nodes=(daemon.address,), transport="tcp")
    with KVPoolClient(config=config) as client:
        before = frames(client, daemon.address)
        assert all(s is ErrorCode.OK for s in client.put(keys, data).statuses)
        into = [np.zeros(BLOCK, dtype=np.uint8) for _ in range(COUNT)]
        into[9] = np.zeros(BLOCK // 2, dtype=np.uint8)  # a wrong size, in the second stream
        got = client.get(keys, into=into)
        after = frames(client, daemon.address)
    assert (after[0] - before[0], after[1] - before[1]) == (2, 2), (before, after)
    expected = [ErrorCode.OK] * COUNT
    expected[9] = ErrorCode.SIZE_MISMATCH
    assert list(got.statuses) == expected, got.statuses
    for i, buffer in enumerate(into):
        if i != 9:
            assert buffer.tobytes() == data[i], f"block {i} came back wrong"


def test_the_async_client_streams_alike_and_one_stream_is_one_frame(daemon: DaemonProcess) -> None:
    keys = BlockKeyBuilder(NS, block_size=4).keys(list(range(1000, 1000 + 4 * COUNT)))
    data = blocks(2)
    address = daemon.address

    async def run() -> list[ErrorCode]:
        config = ClientConfig(nodes=(address,), transport="tcp")
        async with AsyncKVPoolClient(config=config) as client:
            assert all(s is ErrorCode.OK for s in (await client.put(keys, data)).statuses)
            into = [bytearray(BLOCK) for _ in range(COUNT)]
            got = await client.get(keys, into=into)
            assert [bytes(b) for b in into] == data, "a block came back wrong"
            return list(got.statuses)

    with KVPoolClient(config=ClientConfig(nodes=(address,), transport="tcp", streams_per_node=1)) as sync:
        before = frames(sync, address)
        assert asyncio.run(run()) == [ErrorCode.OK] * COUNT
        middle = frames(sync, address)
        assert list(sync.get(keys, into=[bytearray(BLOCK) for _ in range(COUNT)]).statuses) == [ErrorCode.OK] * COUNT
        after = frames(sync, address)
    assert (middle[0] - before[0], middle[1] - before[1]) == (2, 2), (before, middle)
    assert after[1] - middle[1] == 1, (middle, after)  # streams_per_node=1: the whole batch in one frame
