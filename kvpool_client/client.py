"""KVPoolClient: the blocking client SDK engines call from their worker threads.

Batched put / get / exists / lookup / delete of blocks. Bytes go from the caller's
buffers to the node and back into the caller's buffers with no copy in Python.
Failures of a node show up per key (``UNAVAILABLE``, ``TIMEOUT``) so one bad node
does not fail a whole batch; misuse raises :class:`~kvpool_client.core.errors.UsageError`.

Placement, replication and failover are planned by pure modules
(:mod:`~kvpool_client.replication`, :mod:`~kvpool_client.failover`); this module
only runs the planned requests: one node's in the caller's thread, the others'
on a small thread pool, so a batch spread over nodes costs one round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, overload

from kvpool_client import batching, exchange, operations
from kvpool_client.breaker import CircuitBreaker
from kvpool_client.buffers import byte_view
from kvpool_client.core.channels.tcp import TcpConnection, parse_address
from kvpool_client.core.channels.tls import TlsConnection
from kvpool_client.core.config import ClientConfig
from kvpool_client.core.control import ControlClient, NodeInfo
from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable, RequestTimeout
from kvpool_client.core.keys import BlockKey, Namespace, check_model, namespace_id
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.routing import Member, Router
from kvpool_client.core.wire import HelloRequest, WireLimits
from kvpool_client.counters import ClientCounters, ClientStats
from kvpool_client.exchange import Exchange, GetAnswer, SingleGet, run_sync, steps_of
from kvpool_client.failure_log import FailureLog, node_label
from kvpool_client.nodes import NodeHandle, find_node
from kvpool_client.operations import Build, Outcome
from kvpool_client.placement_source import (
    Placement,
    PlacementSource,
    StaticSource,
    ThreadedMembershipSource,
    member_at,
)
from kvpool_client.request_factory import RequestFactory
from kvpool_client.results import GetResult, PutResult
from kvpool_client.transport.nixl import LocalAgent, RemoteArena
from kvpool_client.transport.shm import MappedArena
from kvpool_client.transport.ucx import UcxConnection, UcxEngine, UcxUnavailable

T = TypeVar("T")
R = TypeVar("R")


DataConnection = TcpConnection | TlsConnection | UcxConnection  # a node's data plane: plain, TLS or UCX


class _Node(NodeHandle[DataConnection]):
    """One node's cached info and idle connections (thread-safe)."""

    def __init__(self, member: Member, config: ClientConfig, ucx: UcxEngine, nixl: LocalAgent) -> None:
        super().__init__(member, config, nixl)
        self._lock = threading.Lock()
        self._ucx = ucx  # the client's, shared by its nodes
        self.control = ControlClient(member.address, config.request_timeout_s, config.credentials)

    def info(self) -> NodeInfo:
        info = self._info
        if info is None:
            info = self._info = self.control.server_info()
        return info

    def acquire(self) -> DataConnection:
        while True:
            with self._lock:
                pooled = self._idle.pop() if self._idle else None
            if pooled is None:
                break
            if pooled.reusable():
                return pooled
            pooled.close()
        connection = self._open_ucx() or self._open_tcp()
        token = self._config.auth_token
        if token is not None:
            try:
                connection.start_request()
                run_sync(connection, exchange.hello(HelloRequest(0, token), WireLimits()))
            except BaseException:
                connection.close()
                raise
        return connection

    def _open_tcp(self) -> DataConnection:
        known = {"tcp": self.member.data_address} if self.member.data_address else self.info().data_endpoints
        endpoint, tls = self.data_endpoint(known)
        connection: DataConnection
        connection = TcpConnection(endpoint, self._config.request_timeout_s, self._config.connect_timeout_s)
        if tls is not None:
            connection = TlsConnection(connection, tls, parse_address(endpoint)[0])
        return connection

    def _open_ucx(self) -> UcxConnection | None:
        """A ucx connection when negotiated; None: use tcp (auto after a ucx failure too)."""
        address = self.ucx_address()
        if address is None:
            return None
        try:
            return UcxConnection(self._ucx, address, self._config.request_timeout_s, self._config.connect_timeout_s)
        except (NodeUnavailable, RequestTimeout, UcxUnavailable) as exc:
            self.ucx_failed(exc)
            return None

    def release(self, connection: DataConnection) -> None:
        with self._lock:
            if self.has_room():
                self._idle.append(connection)
                return
        connection.close()

    def forget(self) -> None:
        """After a failure: drop pooled connections and re-read the node's info next time."""
        with self._lock:
            idle, self._idle, self._info = self._idle, [], None
            self.reset_transport()
        for connection in idle:
            connection.close()

    def close(self) -> None:
        self.forget()
        self.control.close()


def _perform(connection: DataConnection, exchange: Exchange[T] | SingleGet) -> T | GetAnswer:
    """Run ``exchange`` on ``connection``: UCX runs its steps itself, a socket runs a single get in line."""
    if isinstance(connection, UcxConnection):
        return connection.run(steps_of(exchange))
    return exchange.run_sync(connection) if isinstance(exchange, SingleGet) else run_sync(connection, exchange)


class KVPoolClient:
    """Blocking client of a kvpool cluster; safe to share between threads.

    Args:
        nodes: control-plane addresses ``host:port``; or pass ``config``.
        config: full settings (static nodes or etcd, replication, timeouts). Without it, the
            settings come from the ``KVPOOL_*`` environment (:meth:`ClientConfig.from_env`),
            with ``nodes``, when given, in place of ``KVPOOL_NODES``.
        router: placement to use instead of the one ``config`` implies.
        breaker: circuit breaker to use (tests inject one with a fake clock).
    Raises:
        UsageError: the settings are invalid.
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
        self._nodes: dict[str, _Node] = {}
        self._nodes_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._ucx = UcxEngine()  # starts with the first ucx connection
        self._nixl = LocalAgent(self.config.request_timeout_s)  # NIXL is loaded with the first nixl node
        self._requests = RequestFactory(
            self.config.verify_checksums, self._shared_arena, self.config.streams_per_node, self._one_sided
        )
        self._source: PlacementSource = (
            ThreadedMembershipSource(self.config)
            if self.config.uses_etcd and router is None
            else StaticSource(self.config, router)
        )

    def put(self, keys: Sequence[BlockKey], blocks: Sequence[Any]) -> PutResult:
        """Store blocks if absent (put is idempotent: keys are content addresses).

        Each key goes to its ``R`` write owners in parallel and succeeds when the
        write quorum of them stored it.

        Args:
            keys: one key per block.
            blocks: contiguous buffers (torch CPU tensors, numpy arrays, bytes, ...).

        Returns:
            Per-key status (OK, ALREADY_EXISTS, BUSY, or the failure) and the nodes
            that stored each key.

        Raises:
            UsageError: counts differ, a block is empty, too large, or not contiguous.
        """
        views = batching.block_views(keys, blocks)
        sizes = [len(v) for v in views] if len(keys) > 1 else None  # one key fits any frame
        found = operations.direct_job(
            keys, self._source.current(), self._cached_limits, sizes, write=True, allow=self.breaker.allow
        )
        result = None if found is None else self._run(operations.one_node_put(*found, views, self._requests))
        if result is None:  # replicas to write, several nodes, or the node drains: the plan
            result = self._run(operations.put(keys, views, self._requests, self.breaker.gate))
        self._counters.put(result)
        return result

    def get(self, keys: Sequence[BlockKey], into: Sequence[Any] | None = None) -> GetResult:
        """Fetch blocks into the caller's buffers, falling back to replicas.

        Args:
            into: one writable contiguous buffer per key, each exactly the block's
                size; ``None`` allocates a ``bytearray`` per hit.

        Returns:
            Per-key status (OK, NOT_FOUND, SIZE_MISMATCH, ...) and the filled buffers.
        """
        targets = batching.target_views(keys, into)
        sizes = batching.expected_sizes(targets) if len(keys) > 1 else None  # one key fits any frame
        found = operations.direct_job(
            keys, self._source.current(), self._cached_limits, sizes, allow=self.breaker.allow
        )
        if found is None:
            result = self._run(operations.get(keys, targets, self._requests, self.breaker.gate))
        elif isinstance(got := operations.one_node_get(*found, targets, self._requests), GetResult):
            result = got  # copied out of the node's arena here: no I/O
        else:
            result = self._run(got)
        self._counters.got(result)
        return result

    def exists(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Whether each key is stored on any of its readers; unreachable nodes count as not storing it."""
        return [s is ErrorCode.OK for s in self._probe(keys, prefix=False)]

    def lookup(self, keys: Sequence[BlockKey]) -> int:
        """How many leading ``keys`` are stored: the prefix the engine can load."""
        hits = batching.leading_ok(self._probe(keys, prefix=True))
        self._counters.looked_up(len(keys), hits)
        return hits

    def counters(self) -> ClientStats:
        """What this client has done since it started: gets, hits, bytes, errors by node."""
        return self._counters.snapshot()

    def delete(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Remove blocks from every reachable reader; True where some node removed one.

        Raises:
            NodeUnavailable, RequestTimeout: no reader of some key could be reached.
            PermissionDenied: this client's token may not delete in a key's namespace.
        """
        return self._run(operations.delete(keys, self._requests, self.breaker.gate))

    def placement(self) -> Placement:
        """The placement the next operation will use (router, write quorum, revision)."""
        return self._source.current()

    def server_info(self, address: str) -> NodeInfo:
        return self._node_at(address).info()

    def stats(self, address: str) -> pb.Stats:
        return self._node_at(address).control.stats()

    def namespaces(self, address: str) -> list[pb.NamespaceUsage]:
        """Blocks and bytes of each namespace in each tier of the node at ``address``."""
        return self._node_at(address).control.namespaces()

    def flush_namespace(self, namespace: Namespace | str) -> int:
        """Delete every block of ``namespace`` on every node of the placement; returns how many.

        Raises:
            UsageError: ``namespace`` is not a Namespace or a non-empty str.
            KVPoolError: a node failed the call (the others may have flushed already).
        """
        name = namespace_id(namespace)
        return sum(self._node(m).control.flush_namespace(name) for m in self.placement().router.members())

    def flush_model(self, model: str) -> int:
        """Delete every block of every namespace of ``model`` (``model@...``) on every node; returns how many.

        Raises:
            UsageError: ``model`` is not a valid namespace model field.
            KVPoolError: a node failed the call (the others may have flushed already).
        """
        check_model(model)
        return sum(self._node(m).control.flush_namespace(model=model) for m in self.placement().router.members())

    def register(self, buffer: Any) -> None:
        """Register ``buffer`` (a CPU tensor, an array, any contiguous buffer) with the one-sided data
        plane, once: gets into it and puts from it then move straight between it and the nodes
        (``nixl`` transport); other buffers go through a staging buffer, one copy more. Kept (and
        the buffer kept alive) until :meth:`unregister`; harmless where NIXL is not used.

        Raises:
            UsageError: not a contiguous CPU buffer.
        """
        self._nixl.register(byte_view(buffer, False))

    def unregister(self, buffer: Any) -> None:
        """Undo :meth:`register`."""
        self._nixl.unregister(byte_view(buffer, False))

    def transport(self, address: str) -> str:
        """The transport gets from the node at ``address`` use: ``shm`` (same node), ``nixl``, ``ucx`` or ``tcp``.

        Raises:
            SharedArenaUnavailable: ``transport="shm"`` is set and the node's arena cannot be mapped.
        """
        node = self._node_at(address)
        node.info()
        return node.transport()

    def close(self) -> None:
        close_source = getattr(self._source, "close", None)
        if close_source is not None:
            close_source()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        for node in list(self._nodes.values()):
            node.close()
        self._ucx.close()
        self._nixl.close()

    def __enter__(self) -> KVPoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------

    def _probe(self, keys: Sequence[BlockKey], prefix: bool) -> tuple[ErrorCode, ...]:
        found = operations.direct_job(keys, self._source.current(), self._cached_limits, allow=self.breaker.allow)
        if found is None:
            return self._run(operations.probe(keys, prefix, self._requests, self.breaker.gate))
        return self._run(operations.one_node_probe(*found, prefix, self._requests))

    def _run(self, operation: operations.Runnable[R]) -> R:
        """Drive ``operation`` to its result, performing each step it asks for in this thread."""
        if isinstance(operation, operations.OneExchange):
            job = operation.job
            return operation.finish(job, self._exchange(self._node(job.member), operation.request))
        answer: Any = None
        while True:
            try:
                step = operation.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            answer = self._perform(step)

    def _perform(self, step: operations.Step) -> Any:
        if isinstance(step, operations.CurrentPlacement):
            return self._source.current()
        if isinstance(step, operations.FetchLimits):
            return self._limits_of(step.members)
        return self._run_round(step.jobs, step.build, step.sizes)

    def _run_round(
        self, jobs: list[batching.Job], build: Build, sizes: Sequence[int] | None = None
    ) -> list[tuple[batching.Job, Outcome]]:
        """Every job's pieces and outcomes; the first job runs here, the others on the pool."""
        if not jobs:
            return []
        futures = [self._executor().submit(self._node_job, job, build, sizes) for job in jobs[1:]]
        results = self._node_job(jobs[0], build, sizes)
        for future in futures:
            results.extend(future.result())
        return results

    def _node_job(
        self, job: batching.Job, build: Build, sizes: Sequence[int] | None
    ) -> list[tuple[batching.Job, Outcome]]:
        """Run one node's job, chunked to its limits; after a node failure the rest fail alike."""
        node = self._node(job.member)
        try:
            limits = node.info().limits
        except KVPoolError as exc:
            self._report(node, exc)
            return [(job, exc)]
        results: list[tuple[batching.Job, Outcome]] = []
        down: KVPoolError | None = None
        for piece in batching.chunk(job, limits, sizes):
            outcome = down or self._exchange(node, build(piece, limits))
            if isinstance(outcome, (NodeUnavailable, RequestTimeout)):
                down = outcome
            results.append((piece, outcome))
        return results

    @overload
    def _exchange(self, node: _Node, exchange: SingleGet) -> GetAnswer | KVPoolError: ...

    @overload
    def _exchange(self, node: _Node, exchange: Exchange[T]) -> T | KVPoolError: ...

    def _exchange(self, node: _Node, exchange: Exchange[T] | SingleGet) -> T | GetAnswer | KVPoolError:
        """Run one exchange on a pooled connection; a failure is returned, and reported to the breaker."""
        try:
            connection = node.acquire()
            connection.start_request()
            try:
                result = _perform(connection, exchange)
            except BaseException:
                connection.close()
                raise
        except KVPoolError as exc:
            self._report(node, exc)
            return exc
        node.release(connection)
        self.breaker.success(node.member.node_id)
        return result

    def _report(self, node: _Node, exc: KVPoolError) -> None:
        """Tell the breaker how a request to ``node`` ended in ``exc``, and the log once in a while."""
        label = node_label(node.member.node_id, node.member.address)
        self._failures.note(label, exc)
        self._counters.failed(label, exc.code)
        if self.breaker.record(node.member.node_id, exc):
            node.forget()

    def _limits_of(self, members: Sequence[Member]) -> dict[str, WireLimits]:
        """Known limits of distinct ``members``, asking (in parallel) the nodes not asked yet that may be."""
        missing = operations.limits_to_fetch(members, self._cached_limits, self.breaker.gate())
        if len(missing) > 1:
            list(self._executor().map(self._fetch_info, missing))
        elif missing:
            self._fetch_info(missing[0])
        return operations.known_limits(members, self._cached_limits)

    def _shared_arena(self, member: Member) -> MappedArena | None:
        return self._node(member).shared_arena()

    def _one_sided(self, member: Member) -> RemoteArena | None:
        return self._node(member).one_sided()

    def _cached_limits(self, member: Member) -> WireLimits | None:
        return self._node(member).cached_limits()

    def _fetch_info(self, member: Member) -> None:
        node = self._node(member)
        try:
            node.info()
        except KVPoolError as exc:
            self._report(node, exc)
        else:
            self.breaker.success(member.node_id)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._nodes_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.config.io_threads, thread_name_prefix="kvpool-io")
        return self._pool

    def _node(self, member: Member) -> _Node:
        """The node state for ``member``; replaced (and its failures forgotten) if its addresses changed."""
        node = self._nodes.get(member.node_id)
        if node is not None and (node.member is member or node.serves(member)):  # the first: the usual case, inline
            return node
        with self._nodes_lock:
            old = self._nodes.get(member.node_id)
            if old is not None and old.serves(member):
                return old
            node = self._nodes[member.node_id] = _Node(member, self.config, self._ucx, self._nixl)
        if old is not None:
            old.close()
            self.breaker.reset(member.node_id)
        return node

    def _node_at(self, address: str) -> _Node:
        """The node with control address ``address`` (a node id works too)."""
        return find_node(list(self._nodes.values()), address) or self._node(member_at(self._source.current(), address))
