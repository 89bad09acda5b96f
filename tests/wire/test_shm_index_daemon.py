"""Same-node gets through a live daemon's published index: no LOCATE, never a wrong byte.

A client on the daemon's node finds blocks in the table the daemon publishes in its
arena file and copies them without a request; the daemon's counters show it. Races
run a writer that evicts, reuses slots and deletes while readers loop over blocks
that may vanish under them, comparing every byte; a restarted daemon (clean stop or
kill -9) must be read from its new arena, never the old one.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable

import pytest

from kvpool_client import BlockKey, ClientConfig, ErrorCode, KVPoolClient
from kvpool_client.core.wire.published import BEAT_LIMIT_NS
from kvpool_client.transport import shm
from tests.client.test_transports import connect, new_keys, pattern
from tests.support.daemon import DaemonProcess, start_daemon
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

OK, NOT_FOUND = ErrorCode.OK, ErrorCode.NOT_FOUND
KiB = 1 << 10
SMALL = ("--dram-capacity", "4MiB", "--slab-size", "1MiB")  # 64 slots of 64 KiB, 16 of 256 KiB
RACED_READS = 4000  # single gets that found their block, and that missed it, each


def counter(client: KVPoolClient, daemon: DaemonProcess, name: str) -> int:
    return int(client.stats(daemon.address).counters[name])


def test_gets_of_blocks_never_read_here_send_no_request(daemon_factory: Callable[..., DaemonProcess]) -> None:
    daemon = daemon_factory(*SMALL)
    keys = new_keys(32)
    with connect(daemon, "tcp") as writer, connect(daemon, "shm") as reader:
        assert writer.put(keys, [pattern(k, 64 * KiB) for k in keys]).stored == 32
        before = {op: counter(writer, daemon, f"requests_{op}") for op in ("locate", "get")}
        for key in keys:  # cold: this client never learned a location
            got = reader.get([key], [bytearray(64 * KiB)])
            assert got.statuses == (OK,) and bytes(got.buffers[0]) == pattern(key, 64 * KiB)
        after = {op: counter(writer, daemon, f"requests_{op}") for op in ("locate", "get")}
        assert after == before, f"gets through the shared index asked the daemon: {before} -> {after}"
        assert reader.get(new_keys(1)).statuses == (NOT_FOUND,), "a miss is still asked for"
        assert counter(writer, daemon, "requests_locate") == before["locate"] + 1


def test_the_setting_zero_turns_the_index_off(daemon_factory: Callable[..., DaemonProcess]) -> None:
    daemon = daemon_factory(*SMALL, "--shared-index-entries", "0")
    keys = new_keys(4)
    with connect(daemon, "shm") as client:
        assert client.put(keys, [pattern(k, 64 * KiB) for k in keys]).stored == 4
        before = counter(client, daemon, "requests_locate")
        for key in keys:
            assert client.get([key]).statuses == (OK,)
        assert counter(client, daemon, "requests_locate") == before + 4


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_reads_through_the_index_keep_a_block_from_eviction(
    daemon_factory: Callable[..., DaemonProcess], transport: str
) -> None:
    """Over ``tcp`` the daemon sends the published block itself, and marks the read as a
    same-node reader does (``kvpool_server/data/published_gets.py``)."""
    if transport == "tcp":
        pytest.importorskip("kvpool_client.core.wire._arena_reader", reason="the compiled reader was not built here")
    daemon = daemon_factory(*SMALL)
    keys = new_keys(17)
    with connect(daemon, "tcp") as writer, connect(daemon, transport) as reader:
        for key in keys[:16]:  # one by one: keys[0] is the least recent, and the arena is full
            assert writer.put([key], [pattern(key, 256 * KiB)]).stored == 1
        hits = counter(writer, daemon, "dram_hits")
        assert reader.get(keys[:1], [bytearray(256 * KiB)]).statuses == (OK,)
        if transport == "shm":
            assert counter(writer, daemon, "dram_hits") == hits, "the read was served without the daemon"
        else:
            assert counter(writer, daemon, "shared_index_sends") == 1, "the daemon's Python path answered"
        wait_until(
            lambda: counter(writer, daemon, "shared_index_touches"),
            lambda n: n >= 1,
            "the daemon to drain the read's hit mark",
        )
        assert writer.put(keys[16:], [pattern(keys[16], 256 * KiB)]).stored == 1
        alive = writer.exists(keys)
        assert alive[0] and not alive[1] and all(alive[2:]), f"expected only keys[1] evicted: {alive}"


@pytest.mark.parametrize(("reads", "batch"), [("compiled", 1), ("compiled", 2), ("python", 1), ("python", 2)])
def test_readers_racing_eviction_reuse_and_delete_never_get_a_wrong_byte(
    daemon_factory: Callable[..., DaemonProcess], reads: str, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer keeps the tiny arena evicting (so slots are reused at once) and deletes blocks, while
    readers fetch, ``batch`` at a time and mostly through the published index, the oldest blocks:
    the ones the next put evicts. (With the generation check after the copy switched off, this read
    wrong bytes dozens of times in 15 s.) Both readers of the index race: the compiled one
    (``ArenaReader``) and the pure-Python one it falls back to where it is not built."""
    if reads == "python":
        monkeypatch.setattr(shm, "_arena_reader", None)
    else:
        assert shm._arena_reader is not None, "deploy/dev.sh builds the compiled reader with the package"
    daemon = daemon_factory(*SMALL)
    written: list[BlockKey] = []
    stop = threading.Event()
    seen = {"ok": 0, "missing": 0}
    wrong: list[str] = []

    def writer() -> None:
        with connect(daemon, "tcp") as c:
            while not stop.is_set():
                keys = new_keys(2)
                c.put(keys, [pattern(k, 64 * KiB) for k in keys])
                if random.random() < 0.2:
                    c.delete(written[-40:-39])  # deletes race the readers too
                written.extend(keys)

    def reader(lag: int) -> None:
        with connect(daemon, "shm") as c:
            targets = [bytearray(64 * KiB) for _ in range(batch)]
            while not stop.is_set():
                if len(written) < 70:
                    time.sleep(0.001)
                    continue
                start = len(written) - 64 + lag  # the least recent block still held, or the next one
                keys = written[start : start + batch]
                got = c.get(keys, targets)
                for key, status, target in zip(keys, got.statuses, targets, strict=True):
                    if status is OK and bytes(target) != pattern(key, 64 * KiB):
                        wrong.append(key.hash.hex())
                    seen["ok" if status is OK else "missing"] += 1

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(lag,)) for lag in (0, 1)]
    with connect(daemon, "tcp") as observer:
        locates = counter(observer, daemon, "requests_locate")
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: dict(seen), lambda now: min(now.values()) >= RACED_READS, "reads of both outcomes", 100)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        asked = counter(observer, daemon, "requests_locate") - locates
    assert not wrong, f"{len(wrong)} gets returned bytes of another block"
    reads = seen["ok"] + seen["missing"]
    assert asked < reads - RACED_READS // 2, f"{asked} of {reads} gets asked the daemon: the index served too few"


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["clean stop", "kill -9"])
def test_a_restarted_daemon_is_read_from_its_new_arena(
    daemon_factory: Callable[..., DaemonProcess], stop_signal: signal.Signals
) -> None:
    """The same keys hold other bytes after the restart: a read of the old arena would show.

    A clean stop retires the old table at once (locations the client learned stay good for
    their ttl, as without the table). A killed daemon's table is trusted until its heartbeat
    is :data:`BEAT_LIMIT_NS` old (its blocks are still the right bytes of their keys, as for
    known locations): reads after that must not see it.
    """
    old = daemon_factory(*SMALL)
    keys = new_keys(8)
    before, after = [pattern(k, 64 * KiB) for k in keys], [pattern(k, 64 * KiB)[::-1] for k in keys]
    ttl_s = ClientConfig(nodes=("-:0",)).location_ttl_s
    trusted_s = max(ttl_s, BEAT_LIMIT_NS / 1e9) if stop_signal == signal.SIGKILL else ttl_s
    with connect(old, "shm", request_timeout_s=2.0) as reader:
        assert reader.put(keys, before).stored == 8
        assert [bytes(reader.get([k]).buffers[0]) for k in keys] == before
        old.stop(stop_signal)
        stopped = time.monotonic()
        new = start_daemon(*SMALL, "--grpc-port", str(old.grpc_port), "--data-port", str(old.data_port))
        try:
            with connect(new, "tcp") as writer:
                assert writer.put(keys, after).stored == 8
            late: list[str] = []

            def read_all() -> list[str]:
                seen = []
                for key, old_bytes, new_bytes in zip(keys, before, after, strict=True):
                    started = time.monotonic()
                    got = reader.get([key], [bytearray(64 * KiB)])
                    data = bytes(got.buffers[0]) if got.statuses == (OK,) else None
                    seen.append("new" if data == new_bytes else "old" if data == old_bytes else got.statuses[0].name)
                    if seen[-1] == "old" and started - stopped >= trusted_s:
                        late.append(f"{key.hash.hex()[:8]} at +{started - stopped:.2f} s")
                return seen

            wait_until(read_all, lambda now: now == ["new"] * 8, "every key read from the new daemon", 20)
            assert not late, f"read from the stopped daemon's arena: {late}"
            assert reader.transport(new.address) == "shm"
        finally:
            new.stop()
            new.remove_files()
