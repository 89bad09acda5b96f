"""``EtcdStore``: the few etcd operations kvpool needs, behind one small async API.

This is the only module that imports the etcd client library (``etcd3aio``); only one
etcd client package can live in a process (their generated protos clash), so keeping
it here makes a swap a one-file change. Everything it returns is plain Python:
``str`` keys, ``bytes`` values, typed events, and the errors of
:mod:`kvpool_client.core.membership.errors`:

- :class:`EtcdUnavailable`: not reachable, or no answer within the request timeout;
- :class:`LeaseLost`: the lease expired or was revoked;
- :class:`WatchCompacted`: a watch asked for history that compaction removed;
- :class:`EtcdError`: anything else etcd refused.

Every unary call is bounded by ``request_timeout_s`` (retries of transient failures
included). A watch bounds its creation by the same timeout; after that it waits for
events as long as the connection lives, and a dead or hung etcd is detected by gRPC
keepalive pings (``keepalive_time_s`` + ``keepalive_timeout_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import cast

import etcd3aio
import grpc
import grpc.aio

# Watch goes through the raw stub: the library's own watch reconnects silently and
# never reports compaction, and kvpool must re-read the prefix in both cases.
from etcd3aio._protobuf import LeaseKeepAliveResponse, WatchCreateRequest, WatchRequest, WatchResponse, WatchStub
from etcd3aio.kv import KVService, prefix_range_end
from etcd3aio.lease import LeaseService

from kvpool_client.core.auth import TlsFiles
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.membership.endpoints import channel_target, uses_tls
from kvpool_client.core.membership.errors import EtcdError, EtcdUnavailable, LeaseLost, RecordError, WatchCompacted

__all__ = [
    "DeleteEvent",
    "Entry",
    "EtcdError",
    "EtcdStore",
    "EtcdUnavailable",
    "LeaseLost",
    "PutEvent",
    "RecordError",
    "WatchCompacted",
    "WatchEvent",
    "channel_target",
]

log = logging.getLogger("kvpool.membership.etcd")

_UNAVAILABLE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
_EVENT_DELETE = 1  # mvccpb.Event.EventType.DELETE


@dataclass(frozen=True, slots=True)
class PutEvent:
    """A key was created or changed at ``mod_revision``."""

    key: str
    value: bytes
    mod_revision: int


@dataclass(frozen=True, slots=True)
class DeleteEvent:
    """A key was deleted (or its lease expired) at ``mod_revision``."""

    key: str
    mod_revision: int


WatchEvent = PutEvent | DeleteEvent


@dataclass(frozen=True, slots=True)
class Entry:
    """One key as read: its value, the revision of its last change, and its lease (0: none)."""

    key: str
    value: bytes
    mod_revision: int
    lease: int


@contextlib.contextmanager
def _translated(operation: str, lease_id: int = 0) -> Iterator[None]:
    """Map the client library's and gRPC's exceptions to kvpool's etcd errors."""
    try:
        yield
    except TimeoutError:
        raise EtcdUnavailable(f"etcd {operation}: no answer in time", ErrorCode.TIMEOUT) from None
    except (etcd3aio.EtcdConnectionError, etcd3aio.EtcdTransientError) as exc:
        raise EtcdUnavailable(f"etcd {operation}: {exc}") from exc
    except grpc.aio.AioRpcError as exc:
        if exc.code() in _UNAVAILABLE_CODES:
            raise EtcdUnavailable(f"etcd {operation}: {exc.code().name} {exc.details()}") from exc
        if exc.code() == grpc.StatusCode.NOT_FOUND and "lease" in (exc.details() or ""):
            raise LeaseLost(lease_id) from exc
        raise EtcdError(f"etcd {operation}: {exc.code().name} {exc.details()}") from exc
    except etcd3aio.EtcdError as exc:
        raise EtcdError(f"etcd {operation}: {exc}") from exc


class EtcdStore:
    """A connection to an etcd cluster, used from one event loop.

    Args:
        endpoints: ``host:port`` (or ``http://host:port``) of the members, or one
            comma-separated string.
        request_timeout_s: bound on every unary call, retries included.
        rpc_attempts: tries of a unary call on a transient failure.
        keepalive_time_s, keepalive_timeout_s: gRPC pings on open streams; a peer
            that misses one is dropped. etcd rejects pings more often than every 5 s.
        reconnect_backoff_max_s: cap on gRPC's reconnect back-off, so a restarted
            etcd is found again within about this long.
        tls: CA (and client certificate, for etcd's ``--client-cert-auth``) to
            verify the members with. TLS is used when this is given or the
            endpoints are ``https://``; without a CA file the system's roots apply.
    Raises:
        ValueError: malformed endpoints or settings.
    """

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        request_timeout_s: float = 2.0,
        rpc_attempts: int = 2,
        keepalive_time_s: float = 10.0,
        keepalive_timeout_s: float = 5.0,
        reconnect_backoff_max_s: float = 2.0,
        tls: TlsFiles | None = None,
    ) -> None:
        if request_timeout_s <= 0 or rpc_attempts < 1 or reconnect_backoff_max_s <= 0:
            raise ValueError("timeouts must be > 0 and rpc_attempts >= 1")
        if keepalive_time_s < 5:
            raise ValueError("keepalive_time_s must be >= 5 (etcd drops clients that ping more often)")
        self.target = channel_target(endpoints)
        self.tls = tls
        self.secure = tls is not None or uses_tls(endpoints)
        self.request_timeout_s = request_timeout_s
        self._attempts = rpc_attempts
        self._options: list[tuple[str, int | str]] = [
            ("grpc.lb_policy_name", "round_robin"),
            ("grpc.keepalive_time_ms", int(keepalive_time_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
            # Pings only while a stream is open: etcd counts idle pings as abuse.
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", int(reconnect_backoff_max_s * 1000)),
            ("grpc.max_receive_message_length", 64 << 20),
        ]
        self._channel: grpc.aio.Channel | None = None
        self._kv: KVService | None = None
        self._lease: LeaseService | None = None
        self._watch: WatchStub | None = None

    async def connect(self, *, check: bool = False) -> EtcdStore:
        """Open the channel (idempotent). gRPC connects lazily and reconnects by itself.

        Args:
            check: also make one read, so an unreachable etcd fails here.
        Raises:
            EtcdUnavailable: ``check`` and etcd did not answer.
            UsageError: a TLS file cannot be read.
        """
        if self._channel is None:
            self._channel = self._open_channel()
            self._kv = KVService(self._channel, max_attempts=self._attempts)
            self._lease = LeaseService(self._channel, max_attempts=self._attempts)
            self._watch = WatchStub(self._channel)
        if check:
            await self.ping()
        return self

    def _open_channel(self) -> grpc.aio.Channel:
        if not self.secure:
            return grpc.aio.insecure_channel(self.target, options=self._options)
        credentials = self.tls.channel_credentials() if self.tls else grpc.ssl_channel_credentials()
        return grpc.aio.secure_channel(self.target, credentials, options=self._options)

    async def close(self) -> None:
        """Close the channel; open watches end with :class:`EtcdUnavailable`."""
        channel, self._channel = self._channel, None
        self._kv = self._lease = self._watch = None
        if channel is not None:
            await channel.close(grace=None)

    async def __aenter__(self) -> EtcdStore:
        return await self.connect()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def kv(self) -> KVService:
        if self._kv is None:
            raise RuntimeError("EtcdStore is not connected (call connect() first)")
        return self._kv

    @property
    def leases(self) -> LeaseService:
        if self._lease is None:
            raise RuntimeError("EtcdStore is not connected (call connect() first)")
        return self._lease

    async def ping(self) -> int:
        """One cheap read; returns the cluster's current revision.

        Raises:
            EtcdUnavailable: no answer.
        """
        with _translated("ping"):
            response = await self.kv.get(b"/kvpool/", count_only=True, timeout=self.request_timeout_s)
        return int(response.header.revision)

    async def get(self, key: str) -> Entry | None:
        """The key's entry, or None if absent.

        Raises:
            EtcdUnavailable, EtcdError.
        """
        with _translated("get"):
            response = await self.kv.get(key, timeout=self.request_timeout_s)
        if not response.kvs:
            return None
        kv = response.kvs[0]
        return Entry(key, bytes(kv.value), int(kv.mod_revision), int(kv.lease))

    async def get_prefix(self, prefix: str) -> tuple[dict[str, bytes], int]:
        """Every key under ``prefix`` and the revision the read saw (watch from revision + 1).

        Raises:
            EtcdUnavailable, EtcdError.
        """
        with _translated("get_prefix"):
            response = await self.kv.get(prefix, range_end=prefix_range_end(prefix), timeout=self.request_timeout_s)
        items = {_key(kv.key): bytes(kv.value) for kv in response.kvs}
        return items, int(response.header.revision)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Write ``key``; with ``lease``, the key dies with the lease. Returns the new revision.

        Raises:
            LeaseLost: ``lease`` no longer exists.
            EtcdUnavailable, EtcdError.
        """
        with _translated("put", lease or 0):
            response = await self.kv.put(key, value, lease=lease or 0, timeout=self.request_timeout_s)
        return int(response.header.revision)

    async def compare_and_swap(self, key: str, expected: bytes | None, value: bytes, lease: int | None = None) -> bool:
        """Write ``value`` only if the key currently holds ``expected`` (None: only if absent).

        Returns:
            True if written; False if the key held something else.
        Raises:
            LeaseLost, EtcdUnavailable, EtcdError.
        """
        kv = KVService
        compare = kv.txn_compare_create_revision(key, 0) if expected is None else kv.txn_compare_value(key, expected)
        with _translated("compare_and_swap", lease or 0):
            response = await self.kv.txn(
                [compare], [kv.txn_op_put(key, value, lease=lease or 0)], timeout=self.request_timeout_s
            )
        return bool(response.succeeded)

    async def put_if_absent(self, key: str, value: bytes, lease: int | None = None) -> bool:
        """Create ``key`` unless it exists. Returns True if created."""
        return await self.compare_and_swap(key, None, value, lease)

    async def delete(self, key: str) -> bool:
        """Delete ``key``. Returns True if it existed."""
        with _translated("delete"):
            response = await self.kv.delete(key, timeout=self.request_timeout_s)
        return int(response.deleted) > 0

    async def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (watches from older revisions get WatchCompacted)."""
        with _translated("compact"):
            await self.kv.compact(revision, physical=True, timeout=self.request_timeout_s)

    async def grant_lease(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; returns its id.

        Raises:
            EtcdUnavailable, EtcdError.
        """
        with _translated("grant_lease"):
            response = await self.leases.grant(ttl_s, timeout=self.request_timeout_s)
        if response.error:
            raise EtcdError(f"etcd grant_lease: {response.error}")
        return int(response.ID)

    async def keepalive_once(self, lease_id: int) -> int:
        """Renew the lease once. Returns the TTL it now has, in seconds.

        Raises:
            LeaseLost: it expired or was revoked.
            EtcdUnavailable: no answer within the request timeout.
        """
        call = self.leases.keep_alive(lease_id)
        try:
            with _translated("keepalive", lease_id):
                async with asyncio.timeout(self.request_timeout_s):
                    response = await call.read()
        finally:
            call.cancel()
        if response is grpc.aio.EOF:
            raise EtcdUnavailable("etcd keepalive: the stream closed without an answer")
        answer = cast(LeaseKeepAliveResponse, response)  # the stream's only other item
        if answer.TTL <= 0:
            raise LeaseLost(lease_id)
        return int(answer.TTL)

    async def revoke(self, lease_id: int) -> bool:
        """Revoke the lease, deleting its keys now. Returns False if it was already gone.

        Raises:
            EtcdUnavailable, EtcdError.
        """
        try:
            with _translated("revoke", lease_id):
                await self.leases.revoke(lease_id, timeout=self.request_timeout_s)
        except LeaseLost:
            return False
        return True

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        """Events under ``prefix`` from ``start_revision`` on, in revision order.

        Iterate it inside ``contextlib.aclosing`` so the stream is cancelled when the
        consumer stops. It never ends normally.

        Raises:
            WatchCompacted: ``start_revision`` is older than the compacted history.
            EtcdUnavailable: creation took longer than the request timeout, the
                connection broke, or the server ended the stream.
            EtcdError: etcd cancelled the watch for another reason.
        """
        create = WatchCreateRequest(
            key=prefix.encode(), range_end=prefix_range_end(prefix), start_revision=start_revision
        )
        if self._watch is None:
            raise RuntimeError("EtcdStore is not connected (call connect() first)")
        # Written, not fed from a request iterator: grpc would drive an async generator
        # in a task of its own, whose finalizer raises when the call is cancelled.
        call = self._watch.Watch()
        try:
            with _translated("watch"):
                async with asyncio.timeout(self.request_timeout_s):
                    await call.write(WatchRequest(create_request=create))
                    _check_watch(await call.read())
                while True:
                    response = _check_watch(await call.read())
                    for event in response.events:
                        revision = int(event.kv.mod_revision)
                        if event.type == _EVENT_DELETE:
                            yield DeleteEvent(_key(event.kv.key), revision)
                        else:
                            yield PutEvent(_key(event.kv.key), bytes(event.kv.value), revision)
        finally:
            call.cancel()


def _check_watch(response: WatchResponse | object) -> WatchResponse:
    if response is grpc.aio.EOF:
        raise EtcdUnavailable("etcd watch: the server ended the stream")
    response = cast(WatchResponse, response)
    if response.compact_revision > 0:
        raise WatchCompacted(int(response.compact_revision))
    if response.canceled:
        raise EtcdError(f"etcd watch cancelled: {response.cancel_reason or 'no reason given'}")
    return response


def _key(raw: bytes) -> str:
    # kvpool writes ASCII keys; surrogateescape keeps any other byte round-trippable.
    return bytes(raw).decode("utf-8", "surrogateescape")
