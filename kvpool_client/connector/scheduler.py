"""Scheduler side of the connector: which leading blocks of a request the pool holds.

This side moves no bytes. It turns token ids into block keys (vLLM's hash chain in
the layout's namespace) and asks the pool how many of the blocks after the ones the
engine already has locally are stored, so the scheduler can allocate pages for them
and skip their prefill. The worker side (:mod:`~kvpool_client.connector.worker`)
then loads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpool_client.aio import AsyncKVPoolClient
from kvpool_client.client import KVPoolClient
from kvpool_client.connector.layout import KVLayout
from kvpool_client.core.errors import UsageError
from kvpool_client.core.keys import BlockKey, BlockKeyBuilder, Namespace


@dataclass(frozen=True, slots=True)
class PoolMatch:
    """Blocks the pool holds right after the engine's locally computed ones.

    Attributes:
        first_block: index of the first matched block in the request (= blocks the engine had).
        keys: keys of the matched blocks, in order; load them into fresh pages.
        block_size: tokens per block.
    """

    first_block: int
    keys: tuple[BlockKey, ...]
    block_size: int

    @property
    def blocks(self) -> int:
        return len(self.keys)

    @property
    def tokens(self) -> int:
        """Tokens the pool can supply: the prefill the engine may skip."""
        return len(self.keys) * self.block_size


class _KeyPlanner:
    """What both scheduler classes share: keys, and which of them to ask about."""

    def __init__(self, layout: KVLayout, namespace: Namespace, seed: str) -> None:
        if namespace.layout != layout.id or namespace.dtype != layout.dtype:
            raise UsageError(f"namespace {namespace.id} does not describe layout {layout.id} ({layout.dtype})")
        self.layout = layout
        self.namespace = namespace
        self._builder = BlockKeyBuilder(namespace, layout.block_size, seed=seed)

    def block_keys(self, token_ids: Sequence[int], parent: bytes | None = None) -> list[BlockKey]:
        """Keys of the full blocks of ``token_ids`` (chained from ``parent``, or from the root).

        Raises:
            UsageError: a token cannot be hashed (pass Python ints).
        """
        return self._builder.keys(token_ids, parent)

    def candidates(self, keys: Sequence[BlockKey], computed_blocks: int, limit: int | None) -> list[BlockKey]:
        """The keys worth asking about: after ``computed_blocks``, at most ``limit`` of them."""
        if computed_blocks < 0 or (limit is not None and limit < 0):
            raise UsageError("computed_blocks and limit must be >= 0")
        end = len(keys) if limit is None else min(len(keys), computed_blocks + limit)
        return list(keys[computed_blocks:end])

    def match(self, computed_blocks: int, asked: Sequence[BlockKey], hits: int) -> PoolMatch:
        return PoolMatch(computed_blocks, tuple(asked[:hits]), self.layout.block_size)


class ConnectorScheduler:
    """Scheduler side over a blocking :class:`KVPoolClient`.

    Args:
        client: the pool client (shared with the worker side in one process, or not).
        layout: the engine's KV block layout.
        namespace: model, dtype, layout and TP rank; ``layout.namespace(model)`` builds it.
        seed: the hash seed (vLLM's PYTHONHASHSEED); every engine sharing blocks must use the same.

    Raises:
        UsageError: the namespace's layout or dtype is not ``layout``'s.
    """

    def __init__(self, client: KVPoolClient, layout: KVLayout, namespace: Namespace, seed: str = "0") -> None:
        self._client = client
        self._plan = _KeyPlanner(layout, namespace, seed)

    @property
    def namespace(self) -> Namespace:
        return self._plan.namespace

    def block_keys(self, token_ids: Sequence[int], parent: bytes | None = None) -> list[BlockKey]:
        """Keys of the full blocks of ``token_ids``; see :meth:`_KeyPlanner.block_keys`."""
        return self._plan.block_keys(token_ids, parent)

    def match(self, keys: Sequence[BlockKey], computed_blocks: int = 0, limit: int | None = None) -> PoolMatch:
        """The leading blocks after ``computed_blocks`` that the pool holds (one batched lookup, no bytes).

        Args:
            keys: the request's block keys (:meth:`block_keys`).
            computed_blocks: leading blocks the engine already has (its local prefix cache hits).
            limit: ask about at most this many blocks (e.g. keep the last prompt token to compute).
        """
        asked = self._plan.candidates(keys, computed_blocks, limit)
        hits = self._client.lookup(asked) if asked else 0
        return self._plan.match(computed_blocks, asked, hits)


class AsyncConnectorScheduler:
    """Scheduler side over an :class:`AsyncKVPoolClient`; same contract as :class:`ConnectorScheduler`."""

    def __init__(self, client: AsyncKVPoolClient, layout: KVLayout, namespace: Namespace, seed: str = "0") -> None:
        self._client = client
        self._plan = _KeyPlanner(layout, namespace, seed)

    @property
    def namespace(self) -> Namespace:
        return self._plan.namespace

    def block_keys(self, token_ids: Sequence[int], parent: bytes | None = None) -> list[BlockKey]:
        return self._plan.block_keys(token_ids, parent)

    async def match(self, keys: Sequence[BlockKey], computed_blocks: int = 0, limit: int | None = None) -> PoolMatch:
        asked = self._plan.candidates(keys, computed_blocks, limit)
        hits = await self._client.lookup(asked) if asked else 0
        return self._plan.match(computed_blocks, asked, hits)
