"""AsyncKVPoolClient: the asyncio client SDK, same operations as :class:`KVPoolClient`.

The per-node requests of one batch run concurrently. Each is bounded by the
request timeout as a whole (not per syscall), so a hung node costs at most that.
Planning is shared with the blocking client (:mod:`~kvpool_client.replication`,
:mod:`~kvpool_client.failover`); this module only runs the requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, TypeVar, overload

from kvpool_client import batching, exchange, operations
from kvpool_client.breaker import CircuitBreaker
from kvpool_client.buffers import byte_view
from kvpool_client.core.channels.aio_socket import AsyncSocketChannel
from kvpool_client.core.channels.tcp import open_async_connection, parse_address
from kvpool_client.core.channels.tls import AsyncTlsChannel
from kvpool_client.core.config import ClientConfig
from kvpool_client.core.control import AsyncControlClient, NodeInfo
from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable, RequestTimeout
from kvpool_client.core.keys import BlockKey, Namespace, check_model, namespace_id
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.routing import Member, Router
from kvpool_client.core.wire import HelloRequest, WireLimits
from kvpool_client.counters import ClientCounters, ClientStats
from kvpool_client.exchange import Exchange, GetAnswer, SingleGet, run_async, steps_of
from kvpool_client.failure_log import FailureLog, node_label
from kvpool_client.nodes import NodeHandle, find_node
from kvpool_client.operations import Build, Outcome
from kvpool_client.placement_source import AsyncMembershipSource, Placement, PlacementSource, StaticSource, member_at
from kvpool_client.request_factory import RequestFactory
from kvpool_client.results import GetResult, PutResult
from kvpool_client.transport.nixl import LocalAgent, RemoteArena
from kvpool_client.transport.shm import MappedArena
from kvpool_client.transport.ucx import AsyncUcxConnection, UcxEngine, UcxUnavailable

T = TypeVar("T")
R = TypeVar("R")


DataChannel = AsyncSocketChannel | AsyncTlsChannel | AsyncUcxConnection  # a node's data plane: plain, TLS or UCX


class _AsyncNode(NodeHandle[DataChannel]):
    """One node's cached info and idle connections (loop-confined)."""

    def __init__(self, member: Member, config: ClientConfig, ucx: UcxEngine, nixl: LocalAgent) -> None:
        super().__init__(member, config, nixl)
        self._ucx = ucx  # the client's, shared by its nodes
        self.control = AsyncControlClient(member.address, config.request_timeout_s, config.credentials)

    async def info(self) -> NodeInfo:
        if self._info is None:
            self._info = await self.control.server_info()
        return self._info

    async def acquire(self) -> DataChannel:
        while self._idle:
            pooled = self._idle.pop()
            if pooled.reusable():
                return pooled
            pooled.close()
        connection = await self._open_ucx() or await self._open_tcp()
        token = self._config.auth_token
        if token is not None:
            try:
                await run_async(connection, exchange.hello(HelloRequest(0, token), WireLimits()))
            except BaseException:
                connection.close()
                raise
        return connection

    async def _open_tcp(self) -> DataChannel:
        known = {"tcp": self.member.data_address} if self.member.data_address else (await self.info()).data_endpoints
        endpoint, tls = self.data_endpoint(known)
        connection: DataChannel
        connection = await open_async_connection(endpoint, self._config.connect_timeout_s)
        if tls is not None:
            connection = await AsyncTlsChannel.connect(connection, tls, parse_address(endpoint)[0])
        return connection

    async def _open_ucx(self) -> AsyncUcxConnection | None:
        """A ucx connection when negotiated; None: use tcp (auto after a ucx failure too)."""
        address = self.ucx_address()
        if address is None:
            return None
        try:
            return await AsyncUcxConnection.open(self._ucx, address, self._config.connect_timeout_s)
        except (NodeUnavailable, UcxUnavailable) as exc:
            self.ucx_failed(exc)
            return None

    def release(self, connection: DataChannel) -> None:
        if self.has_room():
            self._idle.append(connection)
        else:
            connection.close()

    def forget(self) -> None:
        idle, self._idle, self._info = self._idle, [], None
        self.reset_transport()
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
        if config is None:
            config = ClientConfig.from_env(nodes=tuple(nodes)) if nodes else ClientConfig.from_env()
        self.config = config
        self.breaker = breaker or CircuitBreaker(probe_timeout_s=self.config.probe_timeout_s)
        self._failures = FailureLog()
        self._counters = ClientCounters()
        self._nodes: dict[str, _AsyncNode] = {}
        self._ucx = UcxEngine()  # starts with the first ucx connection
        self._nixl = LocalAgent(self.config.request_timeout_s)  # NIXL is loaded with the first nixl node
        self._requests = RequestFactory(
            self.config.verify_checksums,
            self._shared_arena,
            self.config.streams_per_node,
            self._one_sided,
            blocking=False,
        )
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
        views = batching.block_views(keys, blocks)
        sizes = [len(v) for v in views] if len(keys) > 1 else None  # one key fits any frame
        found = operations.direct_job(
            keys, await self._placement(), self._cached_limits, sizes, write=True, allow=self.breaker.allow
        )
        result = None if found is None else await self._run(operations.one_node_put(*found, views, self._requests))
        if result is None:  # replicas to write, several nodes, or the node drains: the plan
            result = await self._run(operations.put(keys, views, self._requests, self.breaker.gate))
        self._counters.put(result)
        return result

    async def get(self, keys: Sequence[BlockKey], into: Sequence[Any] | None = None) -> GetResult:
        """Fetch blocks into the caller's buffers (``None``: allocate per hit), falling back to replicas."""
        targets = batching.target_views(keys, into)
        sizes = batching.expected_sizes(targets) if len(keys) > 1 else None  # one key fits any frame
        found = operations.direct_job(
            keys, await self._placement(), self._cached_limits, sizes, allow=self.breaker.allow
        )
        if found is None:
            result = await self._run(operations.get(keys, targets, self._requests, self.breaker.gate))
        elif isinstance(got := operations.one_node_get(*found, targets, self._requests), GetResult):
            result = got  # copied out of the node's arena here: no I/O
        else:
            result = await self._run(got)
        self._counters.got(result)
        return result

    async def exists(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Whether each key is stored on any of its readers; unreachable nodes count as not storing it."""
        return [s is ErrorCode.OK for s in await self._probe(keys, prefix=False)]

    async def lookup(self, keys: Sequence[BlockKey]) -> int:
        """How many leading ``keys`` are stored."""
        hits = batching.leading_ok(await self._probe(keys, prefix=True))
        self._counters.looked_up(len(keys), hits)
        return hits

    def counters(self) -> ClientStats:
        """See :meth:`KVPoolClient.counters`."""
        return self._counters.snapshot()

    async def delete(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Remove blocks from every reachable reader; True where some node removed one.

        Raises:
            NodeUnavailable, RequestTimeout: no reader of some key could be reached.
            PermissionDenied: this client's token may not delete in a key's namespace.
        """
        return await self._run(operations.delete(keys, self._requests, self.breaker.gate))

    async def placement(self) -> Placement:
        """The placement the next operation will use (router, write quorum, revision)."""
        return await self._placement()

    async def server_info(self, address: str) -> NodeInfo:
        return await self._node_at(address).info()

    async def stats(self, address: str) -> pb.Stats:
        return await self._node_at(address).control.stats()

    async def namespaces(self, address: str) -> list[pb.NamespaceUsage]:
        """See :meth:`KVPoolClient.namespaces`."""
        return await self._node_at(address).control.namespaces()

    async def flush_namespace(self, namespace: Namespace | str) -> int:
        """See :meth:`KVPoolClient.flush_namespace`."""
        name = namespace_id(namespace)
        members = (await self._placement()).router.members()
        return sum([await self._node(m).control.flush_namespace(name) for m in members])

    async def flush_model(self, model: str) -> int:
        """See :meth:`KVPoolClient.flush_model`."""
        check_model(model)
        members = (await self._placement()).router.members()
        return sum([await self._node(m).control.flush_namespace(model=model) for m in members])

    def register(self, buffer: Any) -> None:
        """See :meth:`KVPoolClient.register`."""
        self._nixl.register(byte_view(buffer, False))

    def unregister(self, buffer: Any) -> None:
        """See :meth:`KVPoolClient.unregister`."""
        self._nixl.unregister(byte_view(buffer, False))

    async def transport(self, address: str) -> str:
        """The transport gets from the node at ``address`` use; see :meth:`KVPoolClient.transport`."""
        node = self._node_at(address)
        await node.info()
        return node.transport()

    async def close(self) -> None:
        if self._membership is not None and self._started is not None:
            with contextlib.suppress(Exception):  # a failed start was already reported to callers
                await self._started
            await self._membership.close()
        await asyncio.gather(*(node.close() for node in self._nodes.values()), *self._closing)
        await asyncio.to_thread(self._ucx.close)  # joins the engine's thread
        self._nixl.close()

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
        found = operations.direct_job(keys, await self._placement(), self._cached_limits, allow=self.breaker.allow)
        if found is None:
            return await self._run(operations.probe(keys, prefix, self._requests, self.breaker.gate))
        return await self._run(operations.one_node_probe(*found, prefix, self._requests))

    async def _run(self, operation: operations.Runnable[R]) -> R:
        """Drive ``operation`` to its result, awaiting each step it asks for."""
        if isinstance(operation, operations.OneExchange):
            job = operation.job
            return operation.finish(job, await self._exchange(self._node(job.member), operation.request))
        answer: Any = None
        while True:
            try:
                step = operation.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            answer = await self._perform(step)

    async def _perform(self, step: operations.Step) -> Any:
        if isinstance(step, operations.CurrentPlacement):
            return await self._placement()
        if isinstance(step, operations.FetchLimits):
            return await self._limits_of(step.members)
        return await self._run_round(step.jobs, step.build, step.sizes)

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
        return list(zip(pieces, outcomes, strict=True))

    @overload
    async def _exchange(self, node: _AsyncNode, request: SingleGet) -> GetAnswer | KVPoolError: ...

    @overload
    async def _exchange(self, node: _AsyncNode, request: Exchange[T]) -> T | KVPoolError: ...

    async def _exchange(self, node: _AsyncNode, request: Exchange[T] | SingleGet) -> T | GetAnswer | KVPoolError:
        """Run one exchange within the request timeout; a failure is returned, and reported to the breaker."""
        exchange = steps_of(request)
        timeout = self.config.request_timeout_s
        try:
            try:
                async with asyncio.timeout(timeout):
                    connection = await node.acquire()
                    try:
                        if isinstance(connection, AsyncUcxConnection):  # one hand-off to the ucx engine
                            result = await connection.run(exchange)
                        else:
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
        """Tell the breaker how a request to ``node`` ended in ``exc``, and the log once in a while."""
        label = node_label(node.member.node_id, node.member.address)
        self._failures.note(label, exc)
        self._counters.failed(label, exc.code)
        if self.breaker.record(node.member.node_id, exc):
            node.forget()

    async def _limits_of(self, members: Sequence[Member]) -> dict[str, WireLimits]:
        """Known limits of distinct ``members``, asking (concurrently) the nodes not asked yet that may be."""
        missing = operations.limits_to_fetch(members, self._cached_limits, self.breaker.gate())
        await asyncio.gather(*(self._fetch_info(m) for m in missing))
        return operations.known_limits(members, self._cached_limits)

    def _shared_arena(self, member: Member) -> MappedArena | None:
        return self._node(member).shared_arena()

    def _one_sided(self, member: Member) -> RemoteArena | None:
        return self._node(member).one_sided()

    def _cached_limits(self, member: Member) -> WireLimits | None:
        return self._node(member).cached_limits()

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
        if node is not None and node.serves(member):
            return node
        if node is not None:  # the node moved (new address): its failures were the old process's
            closing = asyncio.ensure_future(node.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            self.breaker.reset(member.node_id)
        node = self._nodes[member.node_id] = _AsyncNode(member, self.config, self._ucx, self._nixl)
        return node

    def _node_at(self, address: str) -> _AsyncNode:
        """The node with control address ``address`` (a node id works too)."""
        return find_node(self._nodes.values(), address) or self._node(member_at(self._source.current(), address))
