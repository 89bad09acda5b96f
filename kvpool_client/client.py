"""KVPoolClient: the blocking client SDK engines call from their worker threads.

Batched put / get / exists / lookup / delete of blocks. Bytes go from the caller's
buffers to the node and back into the caller's buffers with no copy in Python.
Failures of a node show up per key (``UNAVAILABLE``, ``TIMEOUT``) so one bad node
does not fail a whole batch; misuse raises :class:`~kvpool_client.errors.UsageError`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from kvpool_client import batching
from kvpool_client.config import ClientConfig
from kvpool_client.control import ControlClient, NodeInfo
from kvpool_client.errors import ErrorCode, KVPoolError, NodeUnavailable
from kvpool_client.exchange import Exchange, run_sync
from kvpool_client.keys import BlockKey
from kvpool_client.proto import kvpool_pb2 as pb
from kvpool_client.results import GetResult, PutResult, failure_code, to_codes
from kvpool_client.routing import Member, Router, StaticRouter
from kvpool_client.transport.tcp import TcpConnection
from kvpool_client.wire import WireLimits

T = TypeVar("T")


class _Node:
    """One node's cached info and idle connections (thread-safe)."""

    def __init__(self, address: str, config: ClientConfig) -> None:
        self.address = address
        self._config = config
        self._lock = threading.Lock()
        self._info: NodeInfo | None = None
        self._idle: list[TcpConnection] = []
        self.control = ControlClient(address, config.request_timeout_s)

    def info(self) -> NodeInfo:
        info = self._info
        if info is None:
            info = self._info = self.control.server_info()
        return info

    def acquire(self) -> TcpConnection:
        while True:
            with self._lock:
                pooled = self._idle.pop() if self._idle else None
            if pooled is None:
                break
            if pooled.reusable():
                return pooled
            pooled.close()
        endpoint = self.info().data_endpoints.get("tcp")
        if endpoint is None:
            raise NodeUnavailable(f"{self.address} offers no tcp data endpoint")
        return TcpConnection(endpoint, self._config.request_timeout_s, self._config.connect_timeout_s)

    def release(self, connection: TcpConnection) -> None:
        with self._lock:
            if len(self._idle) < self._config.max_idle_connections:
                self._idle.append(connection)
                return
        connection.close()

    def forget(self) -> None:
        """After a failure: drop pooled connections and re-read the node's info next time."""
        with self._lock:
            idle, self._idle, self._info = self._idle, [], None
        for connection in idle:
            connection.close()

    def close(self) -> None:
        self.forget()
        self.control.close()


class KVPoolClient:
    """Blocking client of a kvpool cluster.

    Args:
        nodes: control-plane addresses ``host:port``; or pass ``config``.
        config: full settings (timeouts, pool size, checksum verification).
        router: placement; defaults to rendezvous hashing over ``nodes``.
    """

    def __init__(
        self,
        nodes: Sequence[str] | None = None,
        *,
        config: ClientConfig | None = None,
        router: Router | None = None,
    ) -> None:
        self.config = config or ClientConfig(nodes=tuple(nodes or ()))
        self._router = router or StaticRouter(self.config.nodes)
        self._nodes = {a: _Node(a, self.config) for a in self.config.nodes}
        self._requests = batching.RequestFactory(self.config.verify_checksums)

    def put(self, keys: Sequence[BlockKey], blocks: Sequence[Any]) -> PutResult:
        """Store blocks if absent (put is idempotent: keys are content addresses).

        Args:
            keys: one key per block.
            blocks: contiguous buffers (torch CPU tensors, numpy arrays, bytes, ...).

        Returns:
            Per-key status: OK, ALREADY_EXISTS, BUSY, or the failure.

        Raises:
            UsageError: counts differ, a block is empty, too large, or not contiguous.
        """
        jobs = batching.plan(keys, self._router)
        max_block = {i: self._limits(job.member).max_block_size for job in jobs for i in job.indices}
        views = batching.source_views(keys, blocks, max_block.__getitem__)
        statuses: list[int] = [ErrorCode.INTERNAL] * len(keys)
        for piece, limits in self._pieces(jobs, [len(v) for v in views]):
            batching.scatter(statuses, piece, self._statuses(piece, self._requests.put(piece, views, limits)))
        return PutResult(to_codes(statuses))

    def get(self, keys: Sequence[BlockKey], into: Sequence[Any] | None = None) -> GetResult:
        """Fetch blocks into the caller's buffers.

        Args:
            into: one writable contiguous buffer per key, each exactly the block's
                size; ``None`` allocates a ``bytearray`` per hit.

        Returns:
            Per-key status (OK, NOT_FOUND, SIZE_MISMATCH, ...) and the filled buffers.
        """
        targets = batching.target_views(keys, into)
        statuses: list[int] = [ErrorCode.INTERNAL] * len(keys)
        filled: list[memoryview | None] = [None] * len(keys)
        for piece, limits in self._pieces(batching.plan(keys, self._router)):
            try:
                codes, views = self._run(piece, self._requests.get(piece, targets, limits))
            except KVPoolError as exc:
                codes, views = [failure_code(exc)] * len(piece.indices), []
            batching.scatter(statuses, piece, codes)
            batching.scatter(filled, piece, views)
        return GetResult(to_codes(statuses), tuple(filled))

    def exists(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Whether each key is stored; an unreachable node counts as not stored."""
        return [s is ErrorCode.OK for s in self._probe(keys, prefix=False)]

    def lookup(self, keys: Sequence[BlockKey]) -> int:
        """How many leading ``keys`` are stored: the prefix the engine can load."""
        return batching.leading_ok(self._probe(keys, prefix=True))

    def delete(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Remove blocks; True where a block was removed.

        Raises:
            NodeUnavailable, RequestTimeout: a node holding some of the keys failed.
        """
        statuses: list[int] = [ErrorCode.INTERNAL] * len(keys)
        for piece, limits in self._pieces(batching.plan(keys, self._router)):
            batching.scatter(statuses, piece, self._run(piece, self._requests.delete(piece, limits)))
        return [s == ErrorCode.OK for s in statuses]

    def server_info(self, address: str) -> NodeInfo:
        return self._node(address).info()

    def stats(self, address: str) -> pb.Stats:
        return self._node(address).control.stats()

    def close(self) -> None:
        for node in self._nodes.values():
            node.close()

    def __enter__(self) -> KVPoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------

    def _probe(self, keys: Sequence[BlockKey], prefix: bool) -> tuple[ErrorCode, ...]:
        statuses: list[int] = [ErrorCode.INTERNAL] * len(keys)
        for piece, limits in self._pieces(batching.plan(keys, self._router)):
            batching.scatter(statuses, piece, self._statuses(piece, self._requests.exists(piece, limits, prefix)))
        return to_codes(statuses)

    def _pieces(
        self, jobs: list[batching.Job], sizes: Sequence[int] | None = None
    ) -> Iterator[tuple[batching.Job, WireLimits]]:
        for job in jobs:
            limits = self._limits(job.member)
            for piece in batching.chunk(job, limits, sizes):
                yield piece, limits

    def _node(self, address: str) -> _Node:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = _Node(address, self.config)
        return node

    def _limits(self, member: Member) -> WireLimits:
        try:
            return self._node(member.address).info().limits
        except KVPoolError:
            return WireLimits()  # the node is down: its keys fail per key when tried

    def _statuses(self, job: batching.Job, exchange: Exchange[list[int]]) -> list[int]:
        """Run a per-key-status exchange; a node failure becomes that code for each key."""
        try:
            return self._run(job, exchange)
        except KVPoolError as exc:
            return [failure_code(exc)] * len(job.indices)

    def _run(self, job: batching.Job, exchange: Exchange[T]) -> T:
        """Run one exchange on a pooled connection of the job's node.

        Raises:
            KVPoolError: the node failed; its pooled connections are dropped.
        """
        node = self._node(job.member.address)
        try:
            connection = node.acquire()
            try:
                result = run_sync(connection, exchange)
            except BaseException:
                connection.close()
                raise
        except NodeUnavailable:
            node.forget()
            raise
        node.release(connection)
        return result
