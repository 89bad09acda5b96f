"""AsyncKVPoolClient: the asyncio client SDK, same operations as :class:`KVPoolClient`.

The per-node requests of one batch run concurrently. Each is bounded by the
request timeout as a whole (not per syscall), so a hung node costs at most that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

from kvpool_client import batching
from kvpool_client.config import ClientConfig
from kvpool_client.control import AsyncControlClient, NodeInfo
from kvpool_client.errors import ErrorCode, KVPoolError, NodeUnavailable, RequestTimeout
from kvpool_client.exchange import Exchange, run_async
from kvpool_client.keys import BlockKey
from kvpool_client.proto import kvpool_pb2 as pb
from kvpool_client.results import GetResult, PutResult, failure_code, to_codes
from kvpool_client.routing import Member, Router, StaticRouter
from kvpool_client.transport.aio_socket import AsyncSocketChannel
from kvpool_client.transport.tcp import open_async_connection
from kvpool_client.wire import WireLimits

T = TypeVar("T")


class _AsyncNode:
    """One node's cached info and idle connections (loop-confined)."""

    def __init__(self, address: str, config: ClientConfig) -> None:
        self.address = address
        self._config = config
        self._info: NodeInfo | None = None
        self._idle: list[AsyncSocketChannel] = []
        self.control = AsyncControlClient(address, config.request_timeout_s)

    async def info(self) -> NodeInfo:
        if self._info is None:
            self._info = await self.control.server_info()
        return self._info

    async def acquire(self) -> AsyncSocketChannel:
        while self._idle:
            pooled = self._idle.pop()
            if pooled.reusable():
                return pooled
            pooled.close()
        endpoint = (await self.info()).data_endpoints.get("tcp")
        if endpoint is None:
            raise NodeUnavailable(f"{self.address} offers no tcp data endpoint")
        return await open_async_connection(endpoint, self._config.connect_timeout_s)

    def release(self, connection: AsyncSocketChannel) -> None:
        if len(self._idle) < self._config.max_idle_connections:
            self._idle.append(connection)
        else:
            connection.close()

    def forget(self) -> None:
        idle, self._idle, self._info = self._idle, [], None
        for connection in idle:
            connection.close()

    async def close(self) -> None:
        self.forget()
        await self.control.close()


class AsyncKVPoolClient:
    """asyncio client of a kvpool cluster; see :class:`~kvpool_client.client.KVPoolClient`."""

    def __init__(
        self,
        nodes: Sequence[str] | None = None,
        *,
        config: ClientConfig | None = None,
        router: Router | None = None,
    ) -> None:
        self.config = config or ClientConfig(nodes=tuple(nodes or ()))
        self._router = router or StaticRouter(self.config.nodes)
        self._nodes: dict[str, _AsyncNode] = {}
        self._requests = batching.RequestFactory(self.config.verify_checksums)

    async def put(self, keys: Sequence[BlockKey], blocks: Sequence[Any]) -> PutResult:
        """Store blocks if absent; per-key OK, ALREADY_EXISTS, BUSY or the failure."""
        jobs = batching.plan(keys, self._router)
        max_block = {i: (await self._limits(job.member)).max_block_size for job in jobs for i in job.indices}
        views = batching.source_views(keys, blocks, max_block.__getitem__)
        pieces = await self._pieces(jobs, [len(v) for v in views])
        answers = await asyncio.gather(*(self._statuses(p, self._requests.put(p, views, lim)) for p, lim in pieces))
        statuses: list[int] = [ErrorCode.INTERNAL] * len(keys)
        for (piece, _), codes in zip(pieces, answers):
            batching.scatter(statuses, piece, codes)
        return PutResult(to_codes(statuses))

    async def get(self, keys: Sequence[BlockKey], into: Sequence[Any] | None = None) -> GetResult:
        """Fetch blocks into the caller's buffers (``None``: allocate per hit)."""
        targets = batching.target_views(keys, into)
        pieces = await self._pieces(batching.plan(keys, self._router))
        answers = await asyncio.gather(*(self._get_piece(p, targets, lim) for p, lim in pieces))
        statuses: list[int] = [ErrorCode.INTERNAL] * len(keys)
        filled: list[memoryview | None] = [None] * len(keys)
        for (piece, _), (codes, views) in zip(pieces, answers):
            batching.scatter(statuses, piece, codes)
            batching.scatter(filled, piece, views)
        return GetResult(to_codes(statuses), tuple(filled))

    async def exists(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Whether each key is stored; an unreachable node counts as not stored."""
        return [s is ErrorCode.OK for s in await self._probe(keys, prefix=False)]

    async def lookup(self, keys: Sequence[BlockKey]) -> int:
        """How many leading ``keys`` are stored."""
        return batching.leading_ok(await self._probe(keys, prefix=True))

    async def delete(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Remove blocks; True where removed. Raises the node's error if one fails."""
        pieces = await self._pieces(batching.plan(keys, self._router))
        answers = await asyncio.gather(*(self._run(p, self._requests.delete(p, lim)) for p, lim in pieces))
        statuses: list[int] = [ErrorCode.INTERNAL] * len(keys)
        for (piece, _), codes in zip(pieces, answers):
            batching.scatter(statuses, piece, codes)
        return [s == ErrorCode.OK for s in statuses]

    async def server_info(self, address: str) -> NodeInfo:
        return await self._node(address).info()

    async def stats(self, address: str) -> pb.Stats:
        return await self._node(address).control.stats()

    async def close(self) -> None:
        await asyncio.gather(*(node.close() for node in self._nodes.values()))

    async def __aenter__(self) -> AsyncKVPoolClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals ------------------------------------------------------------

    async def _probe(self, keys: Sequence[BlockKey], prefix: bool) -> tuple[ErrorCode, ...]:
        pieces = await self._pieces(batching.plan(keys, self._router))
        answers = await asyncio.gather(*(self._statuses(p, self._requests.exists(p, lim, prefix)) for p, lim in pieces))
        statuses: list[int] = [ErrorCode.INTERNAL] * len(keys)
        for (piece, _), codes in zip(pieces, answers):
            batching.scatter(statuses, piece, codes)
        return to_codes(statuses)

    async def _get_piece(
        self, piece: batching.Job, targets: list[memoryview | None], limits: WireLimits
    ) -> tuple[list[int], list[memoryview | None]]:
        try:
            return await self._run(piece, self._requests.get(piece, targets, limits))
        except KVPoolError as exc:
            return [failure_code(exc)] * len(piece.indices), []

    async def _pieces(
        self, jobs: list[batching.Job], sizes: Sequence[int] | None = None
    ) -> list[tuple[batching.Job, WireLimits]]:
        pieces = []
        for job in jobs:
            limits = await self._limits(job.member)
            pieces.extend((piece, limits) for piece in batching.chunk(job, limits, sizes))
        return pieces

    def _node(self, address: str) -> _AsyncNode:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = _AsyncNode(address, self.config)
        return node

    async def _limits(self, member: Member) -> WireLimits:
        try:
            return (await self._node(member.address).info()).limits
        except KVPoolError:
            return WireLimits()  # the node is down: its keys fail per key when tried

    async def _statuses(self, job: batching.Job, exchange: Exchange[list[int]]) -> list[int]:
        try:
            return await self._run(job, exchange)
        except KVPoolError as exc:
            return [failure_code(exc)] * len(job.indices)

    async def _run(self, job: batching.Job, exchange: Exchange[T]) -> T:
        """Run one exchange within the request timeout on a pooled connection.

        Raises:
            KVPoolError: the node failed or timed out; its pooled connections are dropped.
        """
        node = self._node(job.member.address)
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                connection = await node.acquire()
                try:
                    result = await run_async(connection, exchange)
                except BaseException:
                    connection.close()
                    raise
        except TimeoutError as exc:
            node.forget()
            raise RequestTimeout(f"{node.address}: no answer within {self.config.request_timeout_s}s") from exc
        except NodeUnavailable:
            node.forget()
            raise
        node.release(connection)
        return result
