"""Both client SDKs against a real daemon: round trips, batching, concurrency, eviction, stats.

Nothing here needs a GPU: tensors are CPU tensors, and the device checks use the
``meta`` device, which every torch build has.
"""

from __future__ import annotations

import asyncio
import glob
import mmap
import os
import random
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from kvpool_client import (
    AsyncKVPoolClient,
    BlockKey,
    BlockKeyBuilder,
    ClientConfig,
    ErrorCode,
    KVPoolClient,
    Namespace,
    UsageError,
)
from tests.support.daemon import DaemonProcess, running_daemon

pytestmark = pytest.mark.integration

OK, NOT_FOUND = ErrorCode.OK, ErrorCode.NOT_FOUND
KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def node() -> Iterator[DaemonProcess]:
    """A daemon shared by the tests that need no special flags (each uses its own namespace)."""
    with running_daemon("--dram-capacity", "64MiB", "--slab-size", "1MiB") as daemon:
        yield daemon


@pytest.fixture
def ns() -> str:
    return f"dp-{uuid.uuid4().hex[:12]}@fp16@L2-H4-D64@tp0of1"


@pytest.fixture
def client(node: DaemonProcess) -> Iterator[KVPoolClient]:
    with KVPoolClient([node.address]) as c:
        yield c


def new_keys(ns: str, n: int) -> list[BlockKey]:
    return [BlockKey(ns, os.urandom(32)) for _ in range(n)]


def pattern(key: BlockKey, size: int) -> bytes:
    """Bytes determined by the key, so any reader can check any block."""
    rng = np.random.default_rng(int.from_bytes(key.hash[:8], "little"))
    return rng.integers(0, 256, size, dtype=np.uint8).tobytes()


def address_of(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


def counters(client: KVPoolClient, daemon: DaemonProcess) -> dict[str, int]:
    return dict(client.stats(daemon.address).counters)


def run_async(fn: Callable[[AsyncKVPoolClient], Any], daemon: DaemonProcess, **config: Any) -> Any:
    async def main() -> Any:
        async with AsyncKVPoolClient(config=ClientConfig(nodes=(daemon.address,), **config)) as c:
            return await fn(c)

    return asyncio.run(main())


def bytes_like_blocks() -> list[Any]:
    """One block of each buffer kind the SDK takes, of different sizes."""
    arr = np.arange(4096, dtype=np.float32).reshape(64, 64)
    return [
        b"b" * 4096,
        bytearray(os.urandom(12345)),
        memoryview(os.urandom(100 * KiB)),
        np.frombuffer(os.urandom(MiB), dtype=np.uint8),  # exactly one slab
        arr,
        arr.astype(np.float16),
    ]


def as_bytes(block: Any) -> bytes:
    return block.tobytes() if isinstance(block, np.ndarray) else bytes(block)


# -- round trips -----------------------------------------------------------------------------


def test_sync_round_trip_bytes_like(client: KVPoolClient, ns: str) -> None:
    blocks = bytes_like_blocks()
    keys = new_keys(ns, len(blocks))
    put = client.put(keys, blocks)
    assert put.statuses == (OK,) * len(keys) and put.stored == len(keys), put.statuses
    assert client.exists(keys) == [True] * len(keys)
    assert client.lookup(keys) == len(keys)
    got = client.get(keys)
    assert got.ok and got.hits == len(keys), got.statuses
    assert [bytes(b) for b in got.buffers] == [as_bytes(b) for b in blocks]
    assert client.delete(keys) == [True] * len(keys)
    assert client.exists(keys) == [False] * len(keys)
    assert client.get(keys).statuses == (NOT_FOUND,) * len(keys)
    assert client.delete(keys) == [False] * len(keys)


def test_async_round_trip_bytes_like(node: DaemonProcess, ns: str) -> None:
    blocks = bytes_like_blocks()
    keys = new_keys(ns, len(blocks))

    async def scenario(c: AsyncKVPoolClient) -> None:
        put = await c.put(keys, blocks)
        assert put.statuses == (OK,) * len(keys), put.statuses
        assert await c.exists(keys) == [True] * len(keys)
        assert await c.lookup(keys) == len(keys)
        got = await c.get(keys)
        assert [bytes(b) for b in got.buffers] == [as_bytes(b) for b in blocks], got.statuses
        assert await c.delete(keys) == [True] * len(keys)
        assert await c.exists(keys) == [False] * len(keys)
        assert (await c.get(keys)).statuses == (NOT_FOUND,) * len(keys)

    run_async(scenario, node)


DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def kv_tensors(dtype: torch.dtype, n: int) -> list[torch.Tensor]:
    """KV blocks shaped (k/v, heads, tokens, head_dim)."""
    gen = torch.Generator().manual_seed(1234)
    return [torch.randn(2, 4, 16, 64, generator=gen).to(dtype) for _ in range(n)]


def assert_filled_in_place(dst: Sequence[torch.Tensor], ptrs: list[int], src: Sequence[torch.Tensor], got: Any) -> None:
    assert got.statuses == (OK,) * len(src), got.statuses
    for i, (d, s) in enumerate(zip(dst, src, strict=True)):
        assert d.data_ptr() == ptrs[i], f"tensor {i} was reallocated"
        assert torch.equal(d, s), f"tensor {i} differs after the round trip"
        assert address_of(got.buffers[i]) == ptrs[i], f"result buffer {i} does not alias the caller's tensor"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sync_torch_zero_copy(client: KVPoolClient, ns: str, dtype: torch.dtype) -> None:
    src = kv_tensors(dtype, 4)
    keys = new_keys(ns, len(src))
    assert client.put(keys, src).stored == len(src)
    dst = [torch.empty_like(t) for t in src]
    ptrs = [t.data_ptr() for t in dst]
    assert_filled_in_place(dst, ptrs, src, client.get(keys, into=dst))
    # A slice of one big preallocated cache (as an engine's paged KV cache) is a fine target too.
    cache = torch.zeros(8, *src[0].shape, dtype=dtype)
    slots = [cache[5], cache[2], cache[7], cache[0]]
    ptrs = [s.data_ptr() for s in slots]
    assert_filled_in_place(slots, ptrs, src, client.get(keys, into=slots))
    assert not cache[1].any() and not cache[3].any(), "bytes landed outside the target slots"


def test_sync_numpy_zero_copy(client: KVPoolClient, ns: str) -> None:
    src = [np.random.default_rng(i).standard_normal((16, 256)).astype(np.float32) for i in range(3)]
    keys = new_keys(ns, len(src))
    assert client.put(keys, src).stored == 3
    dst = [np.empty_like(a) for a in src]
    ptrs = [a.ctypes.data for a in dst]
    got = client.get(keys, into=dst)
    assert got.ok, got.statuses
    for a, b, p, view in zip(dst, src, ptrs, got.buffers, strict=True):
        assert a.ctypes.data == p and address_of(view) == p
        np.testing.assert_array_equal(a, b)


def test_async_torch_zero_copy(node: DaemonProcess, ns: str) -> None:
    src = {dtype: kv_tensors(dtype, 3) for dtype in DTYPES}
    keys = {dtype: new_keys(ns, 3) for dtype in DTYPES}

    async def scenario(c: AsyncKVPoolClient) -> None:
        for dtype in DTYPES:
            assert (await c.put(keys[dtype], src[dtype])).stored == 3
        for dtype in DTYPES:
            dst = [torch.empty_like(t) for t in src[dtype]]
            ptrs = [t.data_ptr() for t in dst]
            assert_filled_in_place(dst, ptrs, src[dtype], await c.get(keys[dtype], into=dst))

    run_async(scenario, node)


# -- put-if-absent, size mismatch, misses, lookup --------------------------------------------


def test_put_if_absent(client: KVPoolClient, node: DaemonProcess, ns: str) -> None:
    keys = new_keys(ns, 2)
    first = [b"1" * 8192, b"2" * 8192]
    assert client.put(keys, first).statuses == (OK, OK)
    again = client.put(keys, [b"X" * 8192, b"Y" * 4096])
    assert again.statuses == (ErrorCode.ALREADY_EXISTS,) * 2, again.statuses
    assert again.ok and again.stored == 0, "ALREADY_EXISTS is a success of put-if-absent"
    assert [bytes(b) for b in client.get(keys).buffers] == first, "a second put replaced stored bytes"

    async def scenario(c: AsyncKVPoolClient) -> None:
        third = await c.put(keys, [b"Z" * 8192, b"Z" * 8192])
        assert third.statuses == (ErrorCode.ALREADY_EXISTS,) * 2, third.statuses
        assert [bytes(b) for b in (await c.get(keys)).buffers] == first

    run_async(scenario, node)


def test_put_duplicate_key_in_one_batch(client: KVPoolClient, ns: str) -> None:
    key = new_keys(ns, 1)[0]
    put = client.put([key, key], [b"a" * 4096, b"a" * 4096])
    assert put.ok and put.statuses[0] is OK, put.statuses
    assert bytes(client.get([key]).buffers[0]) == b"a" * 4096


def test_wrong_size_buffer_fails_only_that_key(client: KVPoolClient, node: DaemonProcess, ns: str) -> None:
    keys = new_keys(ns, 4)
    blocks = [pattern(k, 64 * KiB) for k in keys]
    assert client.put(keys, blocks).stored == 4
    into = [bytearray(64 * KiB), bytearray(32 * KiB), bytearray(64 * KiB), bytearray(64 * KiB + 1)]
    got = client.get(keys, into=into)
    assert got.statuses == (OK, ErrorCode.SIZE_MISMATCH, OK, ErrorCode.SIZE_MISMATCH), got.statuses
    assert bytes(into[0]) == blocks[0] and bytes(into[2]) == blocks[2]
    assert got.buffers[1] is None and got.buffers[3] is None
    assert not any(into[1]) and not any(into[3]), "a wrong-size buffer was partly overwritten"
    # The stream is still in step: the same client (its pooled connection) reads on.
    again = client.get(keys)
    assert [bytes(b) for b in again.buffers] == blocks, again.statuses
    assert "dropped" not in node.log(), node.log()

    async def scenario(c: AsyncKVPoolClient) -> None:
        got = await c.get(keys, into=[bytearray(64 * KiB), bytearray(10), bytearray(64 * KiB), bytearray(64 * KiB)])
        assert got.statuses == (OK, ErrorCode.SIZE_MISMATCH, OK, OK), got.statuses
        assert [bytes(b) for b in (await c.get(keys)).buffers] == blocks

    run_async(scenario, node)


def test_missing_keys(client: KVPoolClient, ns: str) -> None:
    keys = new_keys(ns, 5)
    stored = [0, 1, 3]
    assert client.put([keys[i] for i in stored], [pattern(keys[i], 4096) for i in stored]).stored == 3
    got = client.get(keys)
    assert got.statuses == (OK, OK, NOT_FOUND, OK, NOT_FOUND), got.statuses
    assert got.prefix_hits == 2 and got.hits == 3 and not got.ok
    assert got.failures() == [(2, NOT_FOUND), (4, NOT_FOUND)]
    assert got.buffers[2] is None and got.buffers[4] is None
    assert bytes(got.buffers[3]) == pattern(keys[3], 4096)
    assert client.exists(keys) == [True, True, False, True, False]
    assert client.lookup(keys) == 2
    assert client.lookup(keys[2:]) == 0


def test_lookup_counts_leading_blocks_only(client: KVPoolClient, node: DaemonProcess) -> None:
    namespace = Namespace(f"lookup-{uuid.uuid4().hex[:8]}", "bf16", "L2-KV2-H4-D64-T16")
    keys = BlockKeyBuilder(namespace, block_size=16).keys(list(range(10 * 16 + 5)))
    assert len(keys) == 10  # the trailing partial block has no key
    assert client.lookup(keys) == 0
    held = [0, 1, 2, 3, 4, 5, 7, 8, 9]  # block 6 missing: 7..9 are useless without it
    assert client.put([keys[i] for i in held], [pattern(keys[i], 8192) for i in held]).stored == len(held)
    assert client.lookup(keys) == 6
    assert client.exists(keys) == [i in held for i in range(10)]
    assert client.lookup(keys[7:]) == 3
    assert client.put([keys[6]], [pattern(keys[6], 8192)]).stored == 1
    assert client.lookup(keys) == 10
    assert client.delete([keys[0]]) == [True]
    assert client.lookup(keys) == 0
    assert run_async(lambda c: c.lookup(keys[1:]), node) == 9


# -- batches over the node's key limit -------------------------------------------------------


def test_batch_over_max_keys_is_split(daemon_factory: Callable[..., DaemonProcess], ns: str) -> None:
    daemon = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--max-keys-per-request", "8")
    keys = new_keys(ns, 30)
    blocks = [pattern(k, 4096) for k in keys]
    # location_ttl_s 0: a same-node get asks the node (LOCATE) rather than reading its shared index.
    with KVPoolClient(config=ClientConfig(nodes=(daemon.address,), location_ttl_s=0.0)) as c:
        assert c.server_info(daemon.address).limits.max_keys == 8
        before = counters(c, daemon)
        put = c.put(keys, blocks)
        assert put.statuses == (OK,) * 30, f"{put.statuses}\n{daemon.log()}"
        got = c.get(keys)
        assert [bytes(b) for b in got.buffers] == blocks, got.statuses
        assert c.exists(keys) == [True] * 30
        assert c.lookup(keys) == 30
        assert c.delete([keys[13]]) == [True]
        assert c.lookup(keys) == 13, "a hole past the first chunk must end the prefix"
        after = counters(c, daemon)
        # A get is a GET frame over tcp, a LOCATE frame over shm (this client is on the daemon's node).
        for ops, requests in ((["put"], 4), (["get", "locate"], 4), (["exists"], 12), (["delete"], 1)):
            seen = sum(after.get(f"requests_{op}", 0) - before.get(f"requests_{op}", 0) for op in ops)
            assert seen == requests, f"{ops}: {seen} frames for 30 keys at 8 per frame"
        assert "bad request" not in daemon.log(), daemon.log()

    async def scenario(c: AsyncKVPoolClient) -> None:
        got = await c.get(keys)
        assert got.statuses == tuple(NOT_FOUND if i == 13 else OK for i in range(30)), got.statuses
        assert await c.lookup(keys) == 13
        assert await c.delete(keys) == [i != 13 for i in range(30)]
        assert (await c.put(keys, blocks)).stored == 30

    run_async(scenario, daemon)


# -- checksums ---------------------------------------------------------------------------------


def corrupt_block(daemon: DaemonProcess, data: bytes) -> None:
    """Flip one byte of ``data``'s copy in the daemon's shared-memory arena."""
    (path,) = glob.glob(f"/dev/shm/kvpool-{daemon.process.pid}-*")
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as arena:
        at = arena.find(data)
        assert at >= 0, "block not found in the arena"
        arena[at + 100] ^= 0xFF


def test_verify_checksums_client(daemon_factory: Callable[..., DaemonProcess], ns: str) -> None:
    daemon = daemon_factory("--dram-capacity", "8MiB", "--slab-size", "1MiB")
    keys = new_keys(ns, 3)
    blocks = [os.urandom(64 * KiB) for _ in keys]
    config = ClientConfig(nodes=(daemon.address,), verify_checksums=True)
    with KVPoolClient(config=config) as c:
        assert c.put(keys, blocks).stored == 3
        got = c.get(keys)
        assert got.ok and [bytes(b) for b in got.buffers] == blocks, got.statuses
        corrupt_block(daemon, blocks[1])
        got = c.get(keys)
        assert got.statuses == (OK, ErrorCode.CHECKSUM_MISMATCH, OK), got.statuses
        assert got.buffers[1] is None and bytes(got.buffers[2]) == blocks[2]
    with KVPoolClient([daemon.address]) as unchecked:  # the default trusts the node
        assert unchecked.get(keys).statuses == (OK, OK, OK)

    async def scenario(c: AsyncKVPoolClient) -> None:
        got = await c.get(keys)
        assert got.statuses == (OK, ErrorCode.CHECKSUM_MISMATCH, OK), got.statuses

    run_async(scenario, daemon, verify_checksums=True)


def test_verify_checksum_on_get_daemon(daemon_factory: Callable[..., DaemonProcess], ns: str) -> None:
    daemon = daemon_factory("--dram-capacity", "8MiB", "--slab-size", "1MiB", "--verify-checksum-on-get")
    keys = new_keys(ns, 3)
    blocks = [os.urandom(64 * KiB) for _ in keys]
    with KVPoolClient([daemon.address]) as c:
        assert c.put(keys, blocks).stored == 3
        assert c.get(keys).ok
        corrupt_block(daemon, blocks[0])
        got = c.get(keys)
        assert got.statuses == (ErrorCode.CHECKSUM_MISMATCH, OK, OK), f"{got.statuses}\n{daemon.log()}"
        assert [bytes(b) for b in got.buffers[1:]] == blocks[1:]
        assert c.exists(keys) == [False, True, True], "a corrupt block stayed in the index"
        assert counters(c, daemon).get("dram_corrupt_blocks") == 1
        assert c.put(keys[:1], blocks[:1]).statuses == (OK,), "the corrupt block can be written again"
        assert bytes(c.get(keys[:1]).buffers[0]) == blocks[0]


# -- concurrency -------------------------------------------------------------------------------

WORKERS, ROUNDS, BLOCK = 6, 4, 32 * KiB


def test_threads_share_one_sync_client(client: KVPoolClient, ns: str) -> None:
    shared = new_keys(ns, 8)
    errors: list[BaseException] = []
    start = threading.Barrier(WORKERS)

    def worker(index: int) -> None:
        try:
            rng = random.Random(index)
            own = new_keys(ns, 8)
            start.wait()
            for _ in range(ROUNDS):
                keys = own + rng.sample(shared, 4)
                put = client.put(keys, [pattern(k, BLOCK) for k in keys])
                assert put.ok, put.statuses
                got = client.get(keys, into=[bytearray(BLOCK) for _ in keys])
                for k, status, view in zip(keys, got.statuses, got.buffers, strict=True):
                    assert status is OK or (k in shared and status is NOT_FOUND), status  # shared: maybe mid-write
                    if status is OK:
                        assert bytes(view) == pattern(k, BLOCK), f"wrong bytes for {k}"
                assert client.exists(own) == [True] * len(own)
            assert client.delete(own) == [True] * len(own)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    assert not errors, errors
    got = client.get(shared)
    stored = [i for i, s in enumerate(got.statuses) if s is OK]
    assert all(bytes(got.buffers[i]) == pattern(shared[i], BLOCK) for i in stored)


def test_tasks_share_one_async_client(node: DaemonProcess, ns: str) -> None:
    shared = new_keys(ns, 8)

    async def worker(c: AsyncKVPoolClient, index: int) -> None:
        rng = random.Random(index)
        own = new_keys(ns, 8)
        for _ in range(ROUNDS):
            keys = own + rng.sample(shared, 4)
            put = await c.put(keys, [pattern(k, BLOCK) for k in keys])
            assert put.ok, put.statuses
            targets = [torch.empty(BLOCK, dtype=torch.uint8) for _ in keys]
            got = await c.get(keys, into=targets)
            for k, status, target in zip(keys, got.statuses, targets, strict=True):
                assert status is OK or (k in shared and status is NOT_FOUND), status
                if status is OK:
                    assert target.numpy().tobytes() == pattern(k, BLOCK), f"wrong bytes for {k}"
            await asyncio.sleep(0)
        assert await c.delete(own) == [True] * len(own)

    async def scenario(c: AsyncKVPoolClient) -> None:
        await asyncio.wait_for(asyncio.gather(*(worker(c, i) for i in range(WORKERS))), 60)
        got = await c.get(shared)
        for i, status in enumerate(got.statuses):
            if status is OK:
                assert bytes(got.buffers[i]) == pattern(shared[i], BLOCK)

    run_async(scenario, node)


# -- eviction and stats ----------------------------------------------------------------------


def dram(client: KVPoolClient, daemon: DaemonProcess) -> Any:
    (tier,) = [t for t in client.stats(daemon.address).tiers if t.name == "dram"]
    return tier


def test_lru_eviction_at_tiny_capacity(daemon_factory: Callable[..., DaemonProcess], ns: str) -> None:
    daemon = daemon_factory("--dram-capacity", "4MiB", "--slab-size", "1MiB")  # 16 slots of 256 KiB
    keys = new_keys(ns, 21)
    blocks = [pattern(k, 256 * KiB) for k in keys]
    # Every get asks the node, so its recency moves at once (reads through a same-node client's shared
    # index reach it within half a second: tests/wire/test_shm_index_daemon.py).
    with KVPoolClient(config=ClientConfig(nodes=(daemon.address,), location_ttl_s=0.0)) as c:
        for i in range(16):  # one at a time: insertion order is the LRU order
            assert c.put([keys[i]], [blocks[i]]).statuses == (OK,)
        assert c.exists(keys[:16]) == [True] * 16, "16 blocks of 256 KiB must fit in 4 MiB"
        assert dram(c, daemon).evictions == 0
        touched = c.get([keys[2], keys[0], keys[3], keys[1]])  # now 4..15 are older than 0..3
        assert touched.ok, touched.statuses
        assert c.exists(keys[:16]) == [True] * 16  # exists does not refresh recency
        assert c.put(keys[16:20], blocks[16:20]).statuses == (OK,) * 4
        alive = c.exists(keys[:20])
        evicted = [i for i, present in enumerate(alive) if not present]
        assert evicted == [4, 5, 6, 7], f"evicted {evicted}, expected the 4 least recently used\n{daemon.log()}"
        assert dram(c, daemon).evictions == 4
        assert c.put(keys[20:], blocks[20:]).statuses == (OK,)
        assert c.exists([keys[8], keys[2]]) == [False, True], "next victim must be the oldest untouched block"
        survivors = [i for i in range(21) if i not in (4, 5, 6, 7, 8)]
        got = c.get([keys[i] for i in survivors])
        assert got.ok and [bytes(b) for b in got.buffers] == [blocks[i] for i in survivors], got.statuses
        tier = dram(c, daemon)
        assert tier.evictions == 5 and tier.blocks == 16 and tier.used_bytes == 4 * MiB, tier


def test_a_full_arena_evicts_a_chains_tail_before_its_head(
    daemon_factory: Callable[..., DaemonProcess], ns: str
) -> None:
    """A prompt's blocks arrive head first; the head must outlive the tail (DESIGN.md section 4)."""
    daemon = daemon_factory("--dram-capacity", "4MiB", "--slab-size", "1MiB")  # 16 slots of 256 KiB
    chain, extra = new_keys(ns, 16), new_keys(ns + "-other", 1)
    with KVPoolClient([daemon.address]) as c:
        assert c.put(chain, [pattern(k, 256 * KiB) for k in chain]).stored == 16
        assert c.get(chain).ok  # a reuse of the whole prefix, head to tail
        assert c.put(extra, [pattern(extra[0], 256 * KiB)]).stored == 1
        alive = c.exists(chain)
        assert alive == [True] * 15 + [False], f"expected only the tail evicted, saw {alive}"
        assert c.lookup(chain) == 15


def test_stats_counters_move(daemon_factory: Callable[..., DaemonProcess], ns: str) -> None:
    daemon = daemon_factory("--dram-capacity", "4MiB", "--slab-size", "1MiB")
    keys = new_keys(ns, 17)
    size = 256 * KiB
    with KVPoolClient([daemon.address]) as c:
        tier0, counters0 = dram(c, daemon), counters(c, daemon)
        assert c.put(keys[:3], [pattern(k, size) for k in keys[:3]]).stored == 3
        got = c.get(keys[:5])  # 3 hits, 2 misses
        assert got.statuses == (OK, OK, OK, NOT_FOUND, NOT_FOUND), got.statuses
        tier1, counters1 = dram(c, daemon), counters(c, daemon)
        assert (tier1.hits - tier0.hits, tier1.misses - tier0.misses) == (3, 2), tier1
        assert counters1.get("bytes_in", 0) - counters0.get("bytes_in", 0) == 3 * size, counters1
        sent = sum(counters1.get(n, 0) - counters0.get(n, 0) for n in ("bytes_out", "bytes_out_shm"))
        assert sent == 3 * size, counters1  # over tcp, or copied out of the arena (shm)
        assert counters1.get("dram_hits") == tier1.hits and counters1.get("dram_misses") == tier1.misses
        assert (tier1.blocks, tier1.used_bytes, tier1.capacity_bytes) == (3, 3 * size, 4 * MiB), tier1
        assert c.put(keys[3:], [pattern(k, size) for k in keys[3:]]).stored == 14  # 17 blocks in 16 slots
        tier2, counters2 = dram(c, daemon), counters(c, daemon)
        assert tier2.evictions - tier1.evictions == 1, tier2
        assert counters2.get("dram_evictions") == tier2.evictions
        assert counters2["bytes_in"] - counters1["bytes_in"] == 14 * size


# -- misuse is refused before any I/O --------------------------------------------------------


def _non_contiguous() -> list[tuple[str, Any]]:
    t = torch.arange(64 * 64, dtype=torch.float16).reshape(64, 64)
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    return [
        ("torch-transposed", t.t()),
        ("torch-strided", t[:, ::2]),
        ("numpy-strided", a[::2]),
        ("numpy-fortran", np.asfortranarray(a)),
        ("meta-device", torch.empty(64, device="meta")),
    ]


def _bad_destinations() -> list[tuple[str, Any]]:
    ro = np.zeros(4096, dtype=np.uint8)
    ro.setflags(write=False)
    return [
        ("bytes", bytes(4096)),
        ("readonly-numpy", ro),
        ("readonly-memoryview", memoryview(bytes(4096))),
        ("requires-grad", torch.zeros(1024, requires_grad=True)),
        ("torch-strided", torch.zeros(2048, dtype=torch.uint8)[::2]),
        ("meta-device", torch.empty(4096, dtype=torch.uint8, device="meta")),
    ]


def test_misuse_raises_before_any_io(client: KVPoolClient, node: DaemonProcess, ns: str) -> None:
    key = new_keys(ns, 1)[0]
    before = counters(client, node)
    for _, block in _non_contiguous():
        with pytest.raises(UsageError):
            client.put([key], [block])
        with pytest.raises(UsageError):
            run_async(lambda c, b=block: c.put([key], [b]), node)
    for _, dest in _bad_destinations():
        with pytest.raises(UsageError):
            client.get([key], into=[dest])
        with pytest.raises(UsageError):
            run_async(lambda c, d=dest: c.get([key], into=[d]), node)
    with pytest.raises(UsageError):
        client.put([key], [b""])  # empty block
    with pytest.raises(UsageError):
        client.put([key, key], [b"x"])  # counts differ
    with pytest.raises(UsageError):
        client.get([key], into=[])
    with pytest.raises(UsageError):
        client.get([key.hash])  # type: ignore[list-item]
    after = counters(client, node)
    for op in ("put", "get"):
        assert after.get(f"requests_{op}", 0) == before.get(f"requests_{op}", 0), f"a refused {op} reached the node"
    assert client.exists([key]) == [False]
