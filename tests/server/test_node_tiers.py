"""NodeTiers: a node's arena, shared index, DRAM and SSD tiers opened in order from the config's
sections, undone when a step fails, and closed so a restart finds its blocks on SSD.

Real files in a temporary directory: a 256 KiB arena of 64 KiB slabs, 128 KiB SSD segments.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from kvpool_server.config import KiB, ServerConfig, validate_config
from kvpool_server.index import StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.node import NodeTiers

BLOCK = 4 * KiB
KEY: StoreKey = ("m@fp16@tp0", b"block-0")


def config(tmp_path: Path, **settings: object) -> ServerConfig:
    """A checked config over a 256 KiB arena in ``tmp_path/shm``."""
    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    base = {
        "dram_capacity": 256 * KiB,
        "slab_size": 64 * KiB,
        "prefault_arena": False,
        "shm_dir": str(shm),
        "ssd_capacity": 512 * KiB,
        "ssd_segment_size": 128 * KiB,
    }
    checked = ServerConfig.of(**{**base, **settings})
    validate_config(checked)
    return checked


def shm_files(tmp_path: Path) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "shm").iterdir())


def open_tiers(cfg: ServerConfig) -> NodeTiers:
    return asyncio.run(NodeTiers.open(cfg.dram, cfg.ssd, Counters()))


def close(tiers: NodeTiers, flush_s: float = 0.0) -> None:
    asyncio.run(tiers.close_tiers(flush_s))
    tiers.close_arena()


def put(tiers: NodeTiers, key: StoreKey, payload: bytes) -> None:
    entry = tiers.store.dram.reserve(key, len(payload))
    assert not isinstance(entry, int), f"reserve {key} gave {entry!r}"
    tiers.store.dram.view(entry)[:] = payload
    tiers.store.dram.commit(entry)


def test_dram_only_maps_the_arena_and_the_marks_file_and_removes_both_at_close(tmp_path: Path) -> None:
    tiers = open_tiers(config(tmp_path))
    pid = os.getpid()
    assert shm_files(tmp_path) == [f"kvpool-{pid}", f"kvpool-marks-{pid}"], shm_files(tmp_path)
    assert tiers.store.ssd is None and tiers.demoter is None, tiers
    assert tiers.shared_index is not None and tiers.arena.capacity == 256 * KiB, tiers
    put(tiers, KEY, b"x" * BLOCK)
    assert tiers.store.contains(KEY)
    close(tiers)
    assert shm_files(tmp_path) == [], shm_files(tmp_path)


def test_no_shared_index_with_zero_entries(tmp_path: Path) -> None:
    tiers = open_tiers(config(tmp_path, shared_index_entries=0))
    assert tiers.shared_index is None, tiers
    assert shm_files(tmp_path) == [f"kvpool-{os.getpid()}"], shm_files(tmp_path)
    close(tiers)


def test_a_dead_daemons_arena_is_removed_first(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    stale = tmp_path / "shm" / "kvpool-4000000-1"  # no process holds its lock
    stale.write_bytes(b"\0" * 4096)
    tiers = open_tiers(cfg)
    assert not stale.exists(), shm_files(tmp_path)
    close(tiers)


def test_blocks_flushed_to_ssd_at_close_are_there_after_a_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path, ssd_dir=str(tmp_path / "ssd"))
    tiers = open_tiers(cfg)
    assert tiers.store.ssd is not None and tiers.demoter is not None, tiers
    put(tiers, KEY, b"y" * BLOCK)
    close(tiers, flush_s=10.0)
    reopened = open_tiers(cfg)
    try:
        assert reopened.store.ssd is not None and reopened.store.ssd.contains(KEY), "the flushed block is gone"
        assert not reopened.store.dram.contains(KEY), "a fresh arena holds nothing"
    finally:
        close(reopened)


def test_a_failed_ssd_open_undoes_the_arena(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "ssd"
    not_a_directory.write_text("a file where the SSD directory should be")
    cfg = config(tmp_path, ssd_dir=str(not_a_directory))
    with pytest.raises(
        FileExistsError, match=re.escape(str(not_a_directory))
    ):  # raised by the SSD tier, after the arena
        open_tiers(cfg)
    assert shm_files(tmp_path) == [], f"left behind: {shm_files(tmp_path)}"
