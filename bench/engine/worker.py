"""An engine in its own process, driven through two queues.

The benchmark's driver sends :class:`Configure` (build a fresh engine: pages, prefix
cache, pool client), :class:`Submit`, :class:`EvictAll`, :class:`Collect` and
:class:`Stop`; the worker answers with lists of engine events, :class:`Ready`,
:class:`Evicted` and :class:`WorkerReport`. Between messages it steps its engine
while there is work, so requests that arrive mid-batch join the next step.
The model's weights are kept across configurations of the same shape. Several
workers may share one reply queue: each reply is tagged with the worker's name.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue
from typing import Any

import torch

from bench.engine.engine import Engine, EngineConfig, EngineStats
from bench.engine.model import Model, ModelConfig
from bench.engine.pages import PagedKVCache
from bench.engine.pool_tier import PoolTier, SavePolicy, TierStats
from bench.engine.request import Request
from bench.harness.procs import ignore_sigint
from kvpool_client import ClientConfig, KVPoolClient
from kvpool_client.integrations.namespaces import KVLayout

BLOCK_SIZE = 16  # tokens per KV block (vLLM's default)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """How to reach the pool and when to save to it."""

    nodes: tuple[str, ...] = ()
    etcd_endpoints: tuple[str, ...] = ()
    cluster: str = "local"
    replicas: int = 1
    policy: SavePolicy = SavePolicy.EVICT

    def client_config(self) -> ClientConfig:
        return ClientConfig(
            nodes=self.nodes,
            etcd_endpoints=self.etcd_endpoints,
            cluster=self.cluster,
            replicas=self.replicas,
            write_quorum=1,
        )


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """Everything a worker needs to build an engine."""

    model: ModelConfig
    engine: EngineConfig
    pool: PoolSpec | None = None
    threads: int = 1
    block_size: int = BLOCK_SIZE

    def layout(self) -> KVLayout:
        m = self.model
        return KVLayout(m.layers, m.kv_heads, m.head_dim, self.block_size, "fp32", "LKHTD")


@dataclass(frozen=True, slots=True)
class Configure:
    spec: EngineSpec


@dataclass(frozen=True, slots=True)
class Submit:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    arrival: float


@dataclass(frozen=True, slots=True)
class EvictAll:
    pass


@dataclass(frozen=True, slots=True)
class Collect:
    pass


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Ready:
    pass


@dataclass(frozen=True, slots=True)
class Evicted:
    blocks: int


@dataclass(frozen=True, slots=True)
class WorkerReport:
    engine: EngineStats
    tier: TierStats | None = None
    cached_blocks: int = 0


@dataclass(slots=True)
class _State:
    model: Model | None = None
    engine: Engine | None = None
    client: KVPoolClient | None = None

    def close_client(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def build_engine(spec: EngineSpec, model: Model, client: KVPoolClient | None) -> Engine:
    """An engine over ``model`` as ``spec`` says, with a pool tier when ``client`` is given."""
    layout = spec.layout()
    namespace = layout.namespace(spec.model.name)
    factory = None
    if client is not None and spec.pool is not None:
        policy = spec.pool.policy

        def factory(kv: PagedKVCache) -> PoolTier:
            return PoolTier(client, namespace, kv, policy)

    return Engine(model, layout, namespace, spec.engine, factory)


def _configure(state: _State, spec: EngineSpec) -> None:
    torch.set_num_threads(spec.threads)
    if state.model is None or state.model.cfg != spec.model:
        state.model = Model(spec.model)
    state.close_client()
    if spec.pool is not None:
        state.client = KVPoolClient(config=spec.pool.client_config())
    state.engine = build_engine(spec, state.model, state.client)


def _handle(state: _State, message: Any, reply: Callable[[Any], None]) -> bool:
    """Act on one message; False on Stop."""
    if isinstance(message, Stop):
        return False
    if isinstance(message, Configure):
        _configure(state, message.spec)
        reply(Ready())
    elif isinstance(message, Submit):
        assert state.engine is not None
        state.engine.submit(Request(message.rid, message.prompt, message.max_new_tokens, message.arrival))
    elif isinstance(message, EvictAll):
        assert state.engine is not None
        reply(Evicted(state.engine.evict_all()))
    elif isinstance(message, Collect):
        engine = state.engine
        assert engine is not None
        tier = engine.tier.stats if engine.tier is not None else None
        reply(WorkerReport(engine.stats, tier, engine.cache.cached_blocks))
    return True


def serve(name: str, inbox: Queue[Any], outbox: Queue[Any]) -> None:
    """The worker process's main loop (a ``multiprocessing`` target); replies go out as ``(name, payload)``."""
    ignore_sigint()
    state = _State()

    def reply(payload: Any) -> None:
        outbox.put((name, payload))

    try:
        while True:
            busy = state.engine is not None and state.engine.busy
            messages = [] if busy else [inbox.get()]
            while True:
                try:
                    messages.append(inbox.get_nowait())
                except queue.Empty:
                    break
            if not all(_handle(state, m, reply) for m in messages):
                return
            if state.engine is not None and state.engine.busy:
                events = state.engine.step()
                if events:
                    reply(events)
    finally:
        state.close_client()
