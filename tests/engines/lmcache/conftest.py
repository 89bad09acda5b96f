"""Fixtures of the LMCache suite: engines built by LMCache's real StorageManager, closed at the end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench.lmcache.engine import ModelShape, StorageEngine
from tests.engines.lmcache.doc import plugin_config

CHUNK = 16
SHAPE = ModelShape("Qwen/Qwen2.5-0.5B", layers=2, kv_heads=2, head_size=8, chunk_size=CHUNK)  # 2 KiB chunks

EngineFactory = Callable[..., StorageEngine]


@pytest.fixture(autouse=True)
def _no_pool_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings the config lacks would come from KVPOOL_*: keep the tests' own."""
    for name in ("KVPOOL_NODES", "KVPOOL_ETCD_ENDPOINTS", "KVPOOL_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def engines() -> Iterator[EngineFactory]:
    """``engines(model=..., worker_id=..., world_size=..., config=..., **plugin settings)``: an
    LMCache engine from docs/lmcache.md's config; every one is closed at teardown."""
    made: list[StorageEngine] = []

    def make(
        model: str = SHAPE.name,
        worker_id: int = 0,
        world_size: int = 1,
        config: dict[str, Any] | None = None,
        **settings: Any,
    ) -> StorageEngine:
        shape = ModelShape(model, SHAPE.layers, SHAPE.kv_heads, SHAPE.head_size, CHUNK)
        engine = StorageEngine(config or plugin_config(CHUNK, **settings), shape, worker_id, world_size)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()
