"""The SSD tier inside a real daemon: demotion, promotion, restarts, corruption, a full disk.

Daemons run with a 4 MiB DRAM tier (1 MiB slabs) and 256 KiB blocks, so 16 blocks
fill DRAM and every test pushes blocks through SSD. Segment files live in a
directory per test.
"""

from __future__ import annotations

import random
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_server.tiers.records import HEADER_SIZE

KiB, MiB = 1 << 10, 1 << 20
BLOCK = 256 * KiB
NS = "model@bf16@ssd-test@tp0of1"


def ssd_flags(directory: Path, *extra: str) -> tuple[str, ...]:
    return (
        "--dram-capacity",
        "4MiB",
        "--slab-size",
        "1MiB",
        "--no-prefault-arena",
        "--ssd-dir",
        str(directory),
        "--ssd-capacity",
        "64MiB",
        "--ssd-segment-size",
        "2MiB",
        *extra,
    )


def keys(n: int, start: int = 0) -> list[BlockKey]:
    return [BlockKey(NS, b"blk-%05d" % i, depth=i) for i in range(start, start + n)]


def payload(key: BlockKey) -> bytes:
    return random.Random(key.hash).randbytes(BLOCK)


def tier(pool: KVPoolClient, address: str, name: str) -> pb.TierStats:
    stats = pool.stats(address)
    found = [t for t in stats.tiers if t.name == name]
    assert found, f"no {name} tier in {stats}"
    return found[0]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def put_demoted(pool: KVPoolClient, address: str, batch: list[BlockKey]) -> None:
    """Put ``batch`` and wait until the demoter has copied it to SSD (share 1.0)."""
    before = tier(pool, address, "ssd").demotions
    pool.put(batch, [payload(k) for k in batch]).raise_for_errors()
    wait_for(lambda: tier(pool, address, "ssd").demotions >= before + len(batch), f"demotion of {len(batch)} blocks")


def assert_all_read_back(pool: KVPoolClient, batch: list[BlockKey]) -> None:
    result = pool.get(batch)
    wrong = [str(k) for k, buf in zip(batch, result.buffers, strict=True) if buf is None or bytes(buf) != payload(k)]
    assert not wrong, f"{len(wrong)} of {len(batch)} blocks missing or wrong: {wrong[:3]}; statuses {result.statuses}"


@pytest.fixture
def ssd_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="kvpool-ssd-"))
    yield directory / "segments"
    subprocess.run(["rm", "-rf", str(directory)], check=False)


def test_blocks_evicted_from_dram_come_back_from_ssd_identical(daemon_factory, ssd_dir: Path) -> None:
    node = daemon_factory(*ssd_flags(ssd_dir, "--ssd-demote-share", "1.0"))
    blocks = keys(48)  # 12 MiB through a 4 MiB DRAM tier
    with KVPoolClient([node.address]) as pool:
        for start in range(0, len(blocks), 4):
            put_demoted(pool, node.address, blocks[start : start + 4])
        for start in range(0, len(blocks), 8):  # batches small enough to promote into DRAM
            assert_all_read_back(pool, blocks[start : start + 8])
        ssd, dram = tier(pool, node.address, "ssd"), tier(pool, node.address, "dram")
        counters = pool.stats(node.address).counters
    from_ssd = ssd.hits + counters.get("ssd_read_ahead_hits", 0)  # read ahead into DRAM, then read: from SSD too
    assert dram.evictions >= 32 and from_ssd >= 32 and ssd.promotions >= 32, f"dram {dram}, ssd {ssd}"
    assert counters["dram_evictions_lost"] == 0, f"counters {dict(counters)}"
    assert ssd.corrupt_blocks == 0 and not ssd.failure, f"{ssd}"


def test_single_block_gets_of_blocks_on_ssd_alone_come_back_identical(daemon_factory, ssd_dir: Path) -> None:
    """A one-key GET the daemon reads in place still goes to its loop when the block is on SSD only."""
    node = daemon_factory(*ssd_flags(ssd_dir, "--ssd-demote-share", "1.0"))
    blocks = keys(24)  # 6 MiB through a 4 MiB DRAM tier: the first ones are on SSD alone
    with KVPoolClient(config=ClientConfig(nodes=(node.address,), transport="tcp")) as pool:  # GET, not LOCATE
        for start in range(0, len(blocks), 4):
            put_demoted(pool, node.address, blocks[start : start + 4])
        before = tier(pool, node.address, "ssd").hits
        for key in blocks:
            got = pool.get([key], [bytearray(BLOCK)])
            assert got.statuses == (ErrorCode.OK,) and bytes(got.buffers[0]) == payload(key), f"{key}: {got.statuses}"
        ssd = tier(pool, node.address, "ssd")
    assert ssd.hits - before >= 8, f"fewer than 8 of the gets read SSD: {ssd}"


@pytest.mark.parametrize("read_ahead", ["1MiB", "0"])
def test_a_prefix_reloaded_batch_by_batch_is_read_ahead_into_dram(
    daemon_factory, ssd_dir: Path, read_ahead: str
) -> None:
    node = daemon_factory(*ssd_flags(ssd_dir, "--ssd-demote-share", "1.0", "--ssd-read-ahead", read_ahead))
    blocks = keys(48)
    with KVPoolClient([node.address]) as pool:
        for start in range(0, len(blocks), 16):  # a prompt's blocks: committed, so demoted, tail first
            put_demoted(pool, node.address, blocks[start : start + 16])
        for start in range(0, 32, 2):  # blocks 0-31 left DRAM long ago: a reload of them, head first
            assert_all_read_back(pool, blocks[start : start + 2])
        counters = pool.stats(node.address).counters
    ahead, taken = counters.get("ssd_read_ahead", 0), counters.get("ssd_read_ahead_hits", 0)
    if read_ahead == "0":
        assert ahead == taken == 0, f"read ahead with read-ahead off: {dict(counters)}"
    else:  # per prompt, its first two batches make the stream (down the log); a window is 4 blocks
        assert taken >= 20 and ahead >= taken, f"{dict(counters)}"
    assert counters["dram_evictions_lost"] == 0, f"{dict(counters)}"


def test_lookup_exists_and_delete_see_both_tiers(daemon_factory, ssd_dir: Path) -> None:
    node = daemon_factory(*ssd_flags(ssd_dir, "--ssd-demote-share", "1.0"))
    blocks = keys(24)
    with KVPoolClient([node.address]) as pool:
        for start in range(0, len(blocks), 4):
            put_demoted(pool, node.address, blocks[start : start + 4])
        assert pool.lookup(blocks) == 24, "prefix lookup must count SSD-only blocks"
        assert pool.exists(blocks) == [True] * 24
        assert pool.delete(blocks[:2]) == [True, True]
        assert pool.exists(blocks[:3]) == [False, False, True]
        assert pool.get(blocks[:1]).statuses[0] == ErrorCode.NOT_FOUND


def test_clean_restart_starts_warm_and_deleted_blocks_stay_deleted(daemon_factory, ssd_dir: Path) -> None:
    flags = ssd_flags(ssd_dir)
    node = daemon_factory(*flags)
    blocks = keys(12)  # fits DRAM: only the shutdown flush writes them down
    with KVPoolClient([node.address]) as pool:
        pool.put(blocks, [payload(k) for k in blocks]).raise_for_errors()
        wait_for(lambda: tier(pool, node.address, "ssd").blocks >= 3, "the coldest share on SSD")
        assert pool.delete(blocks[:1]) == [True]  # on SSD already: leaves a tombstone
    assert node.stop() == 0, node.log()
    again = daemon_factory(*flags)
    with KVPoolClient([again.address]) as pool:
        assert tier(pool, again.address, "ssd").blocks == 11, again.log()
        assert pool.exists(blocks[:1]) == [False], "a deleted block came back after a restart"
        assert_all_read_back(pool, blocks[1:])


def test_a_flipped_byte_on_disk_is_a_miss_never_wrong_bytes(daemon_factory, ssd_dir: Path) -> None:
    flags = ssd_flags(ssd_dir)
    node = daemon_factory(*flags)
    blocks = keys(4)
    with KVPoolClient([node.address]) as pool:
        pool.put(blocks, [payload(k) for k in blocks]).raise_for_errors()
    assert node.stop() == 0, node.log()  # the flush writes all four down, in one segment
    segment = max(ssd_dir.glob("*.seg"))
    record = HEADER_SIZE + len(NS) + len(blocks[0].hash) + BLOCK
    data = bytearray(segment.read_bytes())
    assert len(data) == 4 * record, f"segment holds {len(data)} bytes, expected 4 records of {record}"
    first = bytes(data[HEADER_SIZE + len(NS) : HEADER_SIZE + len(NS) + len(blocks[0].hash)])
    victim = next(i for i, k in enumerate(blocks) if k.hash == first)
    data[record - 100] ^= 0xFF  # inside the first record's payload
    segment.write_bytes(bytes(data))
    again = daemon_factory(*flags)
    with KVPoolClient([again.address]) as pool:
        result = pool.get(blocks)
        ssd = tier(pool, again.address, "ssd")
    assert result.statuses[victim] == ErrorCode.NOT_FOUND, f"statuses {result.statuses}"
    assert ssd.corrupt_blocks == 1, f"{ssd}"
    for i, key in enumerate(blocks):
        if i != victim:
            assert result.buffers[i] is not None and bytes(result.buffers[i]) == payload(key), f"block {i}"


def test_sigkill_during_a_write_burst_loses_no_acknowledged_block(daemon_factory, ssd_dir: Path) -> None:
    """With write-through, a put is acknowledged once on SSD: SIGKILL mid-burst loses none of them."""
    flags = ssd_flags(ssd_dir, "--ssd-write-through")
    node = daemon_factory(*flags)
    acknowledged: list[BlockKey] = []
    blocks = keys(200)
    started = threading.Event()

    def kill_mid_burst() -> None:  # lands while a put is in flight
        started.wait(10)
        time.sleep(random.uniform(0.005, 0.03))
        node.process.send_signal(signal.SIGKILL)

    killer = threading.Thread(target=kill_mid_burst)
    killer.start()
    with KVPoolClient([node.address]) as pool:
        for start in range(0, len(blocks), 4):
            batch = blocks[start : start + 4]
            try:
                result = pool.put(batch, [payload(k) for k in batch])
            except Exception:  # the node is gone: this batch was never acknowledged
                break
            acknowledged += [k for k, status in zip(batch, result.statuses, strict=True) if status == ErrorCode.OK]
            if len(acknowledged) >= 40:
                started.set()
    started.set()
    killer.join()
    node.process.wait(10)
    assert 40 <= len(acknowledged) < len(blocks), f"{len(acknowledged)} blocks acknowledged: the kill missed the burst"
    again = daemon_factory(*flags)
    with KVPoolClient([again.address]) as pool:
        for start in range(0, len(acknowledged), 8):
            assert_all_read_back(pool, acknowledged[start : start + 8])
        readable = pool.get(blocks)  # blocks put but unacknowledged may or may not be there
        wrong = [
            str(k)
            for k, buf in zip(blocks, readable.buffers, strict=True)
            if buf is not None and bytes(buf) != payload(k)
        ]
        ssd = tier(pool, again.address, "ssd")
    assert not wrong, f"wrong bytes after the crash: {wrong}"
    assert ssd.corrupt_blocks == 0, f"{ssd}"


def mount_tmpfs(directory: Path, size: str) -> None:
    directory.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {done.stderr.strip()}")


def test_a_full_disk_stops_demotion_and_loses_nothing(daemon_factory, ssd_dir: Path) -> None:
    mount_tmpfs(ssd_dir, "3m")  # room for 11 records; the tier believes it has 64 MiB
    try:
        node = daemon_factory(*ssd_flags(ssd_dir, "--ssd-demote-share", "1.0"))
        first, more = keys(8), keys(24, start=8)
        with KVPoolClient([node.address]) as pool:
            for start in range(0, len(first), 4):
                put_demoted(pool, node.address, first[start : start + 4])
            for start in range(0, len(more), 4):
                pool.put(more[start : start + 4], [payload(k) for k in more[start : start + 4]]).raise_for_errors()
            wait_for(lambda: tier(pool, node.address, "ssd").failure != "", "the tier to report the full disk")
            ssd = tier(pool, node.address, "ssd")
            assert "ENOSPC" in ssd.failure and ssd.io_errors >= 1, f"{ssd}"
            assert_all_read_back(pool, first)  # demoted before the disk filled
            assert_all_read_back(pool, more[-8:])  # still in DRAM
        assert node.stop() == 0, node.log()
    finally:
        subprocess.run(["umount", "-l", str(ssd_dir)], check=False)
