"""AsyncKVPoolClient: the asyncio client SDK, same operations as :class:`KVPoolClient`.

The per-node requests of one batch run concurrently. Each is bounded by the
request timeout as a whole (not per syscall), so a hung node costs at most that.
Planning is shared with the blocking client (:mod:`~kvpool_client.replication`,
:mod:`~kvpool_client.failover`); this module only runs the requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from kvpool_client import batching
from kvpool_client.breaker import CircuitBreaker
from kvpool_client.config import ClientConfig
from kvpool_client.control import AsyncControlClient, NodeInfo
from kvpool_client.errors import ErrorCode, KVPoolError, NodeUnavailable, RequestTimeout
from kvpool_client.exchange import Exchange, run_async
from kvpool_client.failover import ReadPlan
from kvpool_client.keys import BlockKey
from kvpool_client.placement_source import AsyncMembershipSource, Placement, PlacementSource, StaticSource, member_at
from kvpool_client.proto import kvpool_pb2 as pb
from kvpool_client.replication import DeleteTally, WritePlan, fan_out
from kvpool_client.results import GetResult, PutResult
from kvpool_client.routing import Member, Router
from kvpool_client.transport.aio_socket import AsyncSocketChannel
from kvpool_client.transport.tcp import open_async_connection
from kvpool_client.wire import WireLimits

T = TypeVar("T")
Build = Callable[[batching.Job, WireLimits], Exchange[Any]]
Outcome = Any  # an exchange's result, or the KVPoolError the node failed it with


class _AsyncNode:
    """One node's cached info and idle connections (loop-confined)."""

    def __init__(self, member: Member, config: ClientConfig) -> None:
        self.member = member
        self.address = member.address
        self._config = config
        self._info: NodeInfo | None = None
        self._idle: list[AsyncSocketChannel] = []
        self.control = AsyncControlClient(member.address, config.request_timeout_s)

    async def info(self) -> NodeInfo:
        if self._info is None:
            self._info = await self.control.server_info()
        return self._info

    def cached_limits(self) -> WireLimits | None:
        return None if self._info is None else self._info.limits

    async def acquire(self) -> AsyncSocketChannel:
        while self._idle:
            pooled = self._idle.pop()
            if pooled.reusable():
                return pooled
            pooled.close()
        endpoint = self.member.data_address or (await self.info()).data_endpoints.get("tcp")
        if not endpoint:
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
    """asyncio client of a kvpool cluster; see :class:`~kvpool_client.client.KVPoolClient`.

    With etcd, the membership watch starts on the first operation (or on
    ``async with``) in the running loop; use the client from that loop only.
    """

    def __init__(
        self,
        nodes: Sequence[str] | None = None,
        *,
        config: ClientConfig | None = None,
        router: Router | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.config = config or ClientConfig(nodes=tuple(nodes or ()))
        self.breaker = breaker or CircuitBreaker(probe_timeout_s=self.config.probe_timeout_s)
        self._nodes: dict[str, _AsyncNode] = {}
        self._requests = batching.RequestFactory(self.config.verify_checksums)
        self._membership = AsyncMembershipSource(self.config) if self.config.uses_etcd and router is None else None
        self._source: PlacementSource = self._membership or StaticSource(self.config, router)
        self._started: asyncio.Future[None] | None = None
        self._closing: set[asyncio.Future[None]] = set()

    async def start(self) -> None:
        """Start following etcd (idempotent; operations call it). A no-op for static nodes."""
        if self._membership is None:
            return
        if self._started is None:
            self._started = asyncio.ensure_future(self._membership.start())
        await asyncio.shield(self._started)

    async def put(self, keys: Sequence[BlockKey], blocks: Sequence[Any]) -> PutResult:
        """Store blocks if absent on each key's write owners; see :meth:`KVPoolClient.put`."""
        batching.check_keys(keys)
        views = batching.block_views(keys, blocks)
        placement = await self._placement()
        placements = [placement.router.placement(k) for k in keys]
        known = await self._limits_of(m for p in placements for m in p.write_owners)
        batching.check_block_sizes(views, lambda i: batching.block_limit(placements[i].write_owners, known))
        plan = WritePlan(keys, placements, placement.write_quorum)
        sizes = [len(v) for v in views]
        await self._drive(plan, lambda job, lim: self._requests.put(job, views, lim), batching.statuses_of, sizes)
        return PutResult(tuple(plan.statuses()), plan.stored_on())

    async def get(self, keys: Sequence[BlockKey], into: Sequence[Any] | None = None) -> GetResult:
        """Fetch blocks into the caller's buffers (``None``: allocate per hit), falling back to replicas."""
        batching.check_keys(keys)
        targets = batching.target_views(keys, into)
        plan = ReadPlan(keys, await self._read_orders(keys))
        filled: list[memoryview | None] = [None] * len(keys)

        def answer(job: batching.Job, outcome: Outcome) -> list[int]:
            codes, views = batching.get_answer(job, outcome)
            batching.scatter(filled, job, views)
            return codes

        sizes = batching.expected_sizes(targets)  # keeps each answer under the payload limit
        await self._drive(plan, lambda job, lim: self._requests.get(job, targets, lim), answer, sizes)
        return GetResult(plan.statuses(), tuple(filled))

    async def exists(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Whether each key is stored on any of its readers; unreachable nodes count as not storing it."""
        return [s is ErrorCode.OK for s in await self._probe(keys, prefix=False)]

    async def lookup(self, keys: Sequence[BlockKey]) -> int:
        """How many leading ``keys`` are stored."""
        return batching.leading_ok(await self._probe(keys, prefix=True))

    async def delete(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Remove blocks from every reachable reader; True where some node removed one.

        Raises:
            NodeUnavailable, RequestTimeout: no reader of some key could be reached.
        """
        batching.check_keys(keys)
        tally = DeleteTally(len(keys))
        jobs = fan_out(keys, await self._read_orders(keys), self.breaker.gate())
        failure: KVPoolError | None = None
        for job, outcome in await self._run_round(jobs, lambda job, lim: self._requests.delete(job, lim)):
            if isinstance(outcome, KVPoolError):
                failure = failure or outcome
            tally.record(job, None if isinstance(outcome, KVPoolError) else outcome)
        if tally.unreached():
            raise failure or NodeUnavailable(f"no reader of key {tally.unreached()[0]} is reachable")
        return tally.removed

    async def placement(self) -> Placement:
        """The placement the next operation will use (router, write quorum, revision)."""
        return await self._placement()

    async def server_info(self, address: str) -> NodeInfo:
        return await self._node_at(address).info()

    async def stats(self, address: str) -> pb.Stats:
        return await self._node_at(address).control.stats()

    async def close(self) -> None:
        if self._membership is not None and self._started is not None:
            with contextlib.suppress(Exception):  # a failed start was already reported to callers
                await self._started
            await self._membership.close()
        await asyncio.gather(*(node.close() for node in self._nodes.values()), *self._closing)

    async def __aenter__(self) -> AsyncKVPoolClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals ------------------------------------------------------------

    async def _placement(self) -> Placement:
        await self.start()
        return self._source.current()

    async def _probe(self, keys: Sequence[BlockKey], prefix: bool) -> tuple[ErrorCode, ...]:
        batching.check_keys(keys)
        orders = await self._read_orders(keys)
        plan = ReadPlan(keys, orders, prefix=prefix)
        # A node may stop at its first miss only when no other replica could fill the gap.
        node_prefix = prefix and all(len(order) == 1 for order in orders)
        await self._drive(plan, lambda job, lim: self._requests.exists(job, lim, node_prefix), batching.statuses_of)
        return plan.statuses()

    async def _read_orders(self, keys: Sequence[BlockKey]) -> list[tuple[Member, ...]]:
        router = (await self._placement()).router
        return [router.placement(k).read_order for k in keys]

    async def _drive(
        self,
        plan: batching.RoundPlan,
        build: Build,
        answer: Callable[[batching.Job, Outcome], list[int]],
        sizes: Sequence[int] | None = None,
    ) -> None:
        """Run ``plan`` round after round until it has nothing left to send."""
        while jobs := plan.next_round(self.breaker.gate()):
            for piece, outcome in await self._run_round(jobs, build, sizes):
                plan.record(piece, answer(piece, outcome))

    async def _run_round(
        self, jobs: list[batching.Job], build: Build, sizes: Sequence[int] | None = None
    ) -> list[tuple[batching.Job, Outcome]]:
        """Every job's pieces and outcomes, all nodes at once."""
        per_node = await asyncio.gather(*(self._node_job(job, build, sizes) for job in jobs))
        return [pair for pairs in per_node for pair in pairs]

    async def _node_job(
        self, job: batching.Job, build: Build, sizes: Sequence[int] | None
    ) -> list[tuple[batching.Job, Outcome]]:
        """Run one node's job, its pieces concurrently; a piece after a node failure is not sent."""
        node = self._node(job.member)
        try:
            limits = (await node.info()).limits
        except KVPoolError as exc:
            self._report(node, exc)
            return [(job, exc)]
        pieces = batching.chunk(job, limits, sizes)
        outcomes = await asyncio.gather(*(self._exchange(node, build(piece, limits)) for piece in pieces))
        return list(zip(pieces, outcomes))

    async def _exchange(self, node: _AsyncNode, exchange: Exchange[T]) -> T | KVPoolError:
        """Run one exchange within the request timeout; a failure is returned, and reported to the breaker."""
        timeout = self.config.request_timeout_s
        try:
            try:
                async with asyncio.timeout(timeout):
                    connection = await node.acquire()
                    try:
                        result = await run_async(connection, exchange)
                    except BaseException:
                        connection.close()
                        raise
            except TimeoutError as exc:
                raise RequestTimeout(f"{node.address}: no answer within {timeout}s") from exc
        except KVPoolError as exc:
            self._report(node, exc)
            return exc
        node.release(connection)
        self.breaker.success(node.member.node_id)
        return result

    def _report(self, node: _AsyncNode, exc: KVPoolError) -> None:
        """Tell the breaker how a request to ``node`` ended in ``exc``."""
        if self.breaker.record(node.member.node_id, exc):
            node.forget()

    async def _limits_of(self, members: Iterable[Member]) -> dict[str, WireLimits]:
        """Known limits of ``members``, asking (concurrently) the nodes not asked yet that may be asked."""
        unique = {m.node_id: m for m in members}
        gate = self.breaker.gate()
        missing = [m for m in unique.values() if self._node(m).cached_limits() is None and gate(m.node_id)]
        await asyncio.gather(*(self._fetch_info(m) for m in missing))
        known = {n: self._node(m).cached_limits() for n, m in unique.items()}
        return {n: lim for n, lim in known.items() if lim is not None}

    async def _fetch_info(self, member: Member) -> None:
        node = self._node(member)
        try:
            await node.info()
        except KVPoolError as exc:
            self._report(node, exc)
        else:
            self.breaker.success(member.node_id)

    def _node(self, member: Member) -> _AsyncNode:
        """The node state for ``member``; replaced (and its failures forgotten) if its addresses changed."""
        node = self._nodes.get(member.node_id)
        if node is not None and (node.address, node.member.data_address) == (member.address, member.data_address):
            return node
        if node is not None:  # the node moved (new address): its failures were the old process's
            closing = asyncio.ensure_future(node.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            self.breaker.reset(member.node_id)
        node = self._nodes[member.node_id] = _AsyncNode(member, self.config)
        return node

    def _node_at(self, address: str) -> _AsyncNode:
        """The node with control address ``address`` (a node id works too)."""
        for node in self._nodes.values():
            if address in (node.address, node.member.node_id):
                return node
        return self._node(member_at(self._source.current(), address))
