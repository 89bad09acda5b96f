"""gRPC control-plane calls a client needs: who a node is, its stats, batched key calls.

Blocking and asyncio flavours share the request building and the error mapping.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc

from kvpool_client.core.auth import Credentials, open_aio_channel, open_channel
from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable, RequestTimeout, error_for_code
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.core.wire import PROTOCOL_VERSION, WireLimits

ERROR_CODE_METADATA = "kvpool-error-code"

Req = TypeVar("Req")  # a call's request message
Resp = TypeVar("Resp")  # its response message


class KVPoolCalls(Protocol):
    """The blocking stub's calls, typed (protoc writes the gRPC stub without annotations)."""

    GetServerInfo: grpc.UnaryUnaryMultiCallable[pb.GetServerInfoRequest, pb.ServerInfo]
    Exists: grpc.UnaryUnaryMultiCallable[pb.KeysRequest, pb.ExistsResponse]
    Lookup: grpc.UnaryUnaryMultiCallable[pb.KeysRequest, pb.LookupResponse]
    Delete: grpc.UnaryUnaryMultiCallable[pb.KeysRequest, pb.DeleteResponse]
    GetStats: grpc.UnaryUnaryMultiCallable[pb.GetStatsRequest, pb.Stats]
    SetState: grpc.UnaryUnaryMultiCallable[pb.SetStateRequest, pb.ServerInfo]
    FlushNamespace: grpc.UnaryUnaryMultiCallable[pb.FlushNamespaceRequest, pb.FlushNamespaceResponse]
    ListNamespaces: grpc.UnaryUnaryMultiCallable[pb.ListNamespacesRequest, pb.NamespaceList]


class AsyncKVPoolCalls(Protocol):
    """The asyncio stub's calls, typed: :class:`KVPoolCalls` on a ``grpc.aio`` channel."""

    GetServerInfo: grpc.aio.UnaryUnaryMultiCallable[pb.GetServerInfoRequest, pb.ServerInfo]
    Exists: grpc.aio.UnaryUnaryMultiCallable[pb.KeysRequest, pb.ExistsResponse]
    Lookup: grpc.aio.UnaryUnaryMultiCallable[pb.KeysRequest, pb.LookupResponse]
    Delete: grpc.aio.UnaryUnaryMultiCallable[pb.KeysRequest, pb.DeleteResponse]
    GetStats: grpc.aio.UnaryUnaryMultiCallable[pb.GetStatsRequest, pb.Stats]
    SetState: grpc.aio.UnaryUnaryMultiCallable[pb.SetStateRequest, pb.ServerInfo]
    FlushNamespace: grpc.aio.UnaryUnaryMultiCallable[pb.FlushNamespaceRequest, pb.FlushNamespaceResponse]
    ListNamespaces: grpc.aio.UnaryUnaryMultiCallable[pb.ListNamespacesRequest, pb.NamespaceList]


def blocking_stub(channel: grpc.Channel) -> KVPoolCalls:
    """The generated stub over ``channel``, seen through its typed calls."""
    stub: KVPoolCalls = kvpool_pb2_grpc.KVPoolStub(channel)
    return stub


def async_stub(channel: grpc.aio.Channel) -> AsyncKVPoolCalls:
    """The generated stub over an asyncio ``channel``, seen through its typed calls."""
    stub: AsyncKVPoolCalls = kvpool_pb2_grpc.KVPoolStub(channel)
    return stub


@dataclass(frozen=True, slots=True)
class SharedArenaInfo:
    """The node's DRAM arena, which a client on the same node may map read-only (``shm``)."""

    arena_path: str
    generations_offset: int  # the slot generations' header, inside the arena file
    arena_id: int
    capacity_bytes: int
    verify_checksums: bool = False  # the node checks each block it serves (reads it does not see are checked here)
    index_offset: int = 0  # the published index's header, inside the arena file; 0: none
    hit_marks_path: str = ""  # the file same-node readers mark their reads through the index in


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as its GetServerInfo describes it."""

    address: str  # control plane, host:port
    node_id: str
    data_endpoints: dict[str, str]  # transport -> host:port (shm: the arena's path)
    limits: WireLimits
    protocol_version: int
    version: str = ""
    state: str = ""
    dram_capacity_bytes: int = 0
    started_at_unix_s: float = 0.0
    shared_arena: SharedArenaInfo | None = None

    @classmethod
    def from_proto(cls, address: str, info: pb.ServerInfo) -> NodeInfo:
        if info.protocol_version != PROTOCOL_VERSION:
            raise KVPoolError(
                f"{address} speaks data protocol v{info.protocol_version}, this client v{PROTOCOL_VERSION}",
                ErrorCode.UNSUPPORTED_VERSION,
            )
        limits = WireLimits(info.limits.max_keys, info.limits.max_block_size, info.limits.max_payload)
        endpoints = {e.transport: e.address for e in info.endpoints}
        arena = info.shared_arena if info.HasField("shared_arena") else None
        shared = (
            None
            if arena is None
            else SharedArenaInfo(
                arena.arena_path,
                arena.generations_offset,
                arena.arena_id,
                arena.capacity_bytes,
                arena.verify_checksums,
                arena.index_offset,
                arena.hit_marks_path,
            )
        )
        return cls(
            address,
            info.node_id,
            endpoints,
            limits,
            info.protocol_version,
            version=info.version,
            state=info.state,
            dram_capacity_bytes=info.dram_capacity_bytes,
            started_at_unix_s=info.started_at_unix_s,
            shared_arena=shared,
        )


def translate_rpc_error(address: str, exc: grpc.RpcError) -> KVPoolError:
    """A typed kvpool exception for a failed gRPC call."""
    status = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    for key, value in _trailing_metadata(exc):
        if key == ERROR_CODE_METADATA and str(value).isdigit():
            return error_for_code(int(value), f"{address}: {detail}")
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimeout(f"{address}: control call timed out")
    if status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return NodeUnavailable(f"{address}: {detail}")
    return KVPoolError(f"{address}: {status.name if status else 'error'}: {detail}")


def _trailing_metadata(exc: grpc.RpcError) -> Iterable[tuple[str, str | bytes]]:
    """The failed call's trailing metadata as (key, value) pairs; none when ``exc`` is not a call."""
    if not hasattr(exc, "trailing_metadata"):
        return ()
    # types-grpcio declares _Metadatum without its base: at run time each item is a (key, value) tuple.
    return exc.trailing_metadata() or ()  # type: ignore[return-value]


class ControlClient:
    """Blocking control-plane calls to one node."""

    def __init__(self, address: str, timeout: float, credentials: Credentials = Credentials()) -> None:
        self.address = address
        self._timeout = timeout
        self._channel = open_channel(address, credentials)
        self._stub = blocking_stub(self._channel)

    def server_info(self) -> NodeInfo:
        return NodeInfo.from_proto(self.address, self._call(self._stub.GetServerInfo, pb.GetServerInfoRequest()))

    def stats(self) -> pb.Stats:
        return self._call(self._stub.GetStats, pb.GetStatsRequest())

    def namespaces(self) -> list[pb.NamespaceUsage]:
        """Blocks and bytes of each namespace in each tier of this node."""
        return list(self._call(self._stub.ListNamespaces, pb.ListNamespacesRequest()).namespaces)

    def flush_namespace(self, namespace: str = "", model: str = "") -> int:
        """Delete every block of ``namespace`` (or of every namespace of ``model``) on this node; returns how many."""
        request = pb.FlushNamespaceRequest(namespace=namespace, model=model)
        return self._call(self._stub.FlushNamespace, request).deleted

    def _call(self, rpc: grpc.UnaryUnaryMultiCallable[Req, Resp], request: Req) -> Resp:
        try:
            return rpc(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise translate_rpc_error(self.address, exc) from None
        except ValueError as exc:  # the channel was closed under us (the node moved)
            raise NodeUnavailable(f"{self.address}: {exc}") from None

    def close(self) -> None:
        self._channel.close()


class AsyncControlClient:
    """asyncio control-plane calls to one node."""

    def __init__(self, address: str, timeout: float, credentials: Credentials = Credentials()) -> None:
        self.address = address
        self._timeout = timeout
        self._channel = open_aio_channel(address, credentials)
        self._stub = async_stub(self._channel)

    async def server_info(self) -> NodeInfo:
        return NodeInfo.from_proto(self.address, await self._call(self._stub.GetServerInfo, pb.GetServerInfoRequest()))

    async def stats(self) -> pb.Stats:
        return await self._call(self._stub.GetStats, pb.GetStatsRequest())

    async def namespaces(self) -> list[pb.NamespaceUsage]:
        """See :meth:`ControlClient.namespaces`."""
        return list((await self._call(self._stub.ListNamespaces, pb.ListNamespacesRequest())).namespaces)

    async def flush_namespace(self, namespace: str = "", model: str = "") -> int:
        """See :meth:`ControlClient.flush_namespace`."""
        request = pb.FlushNamespaceRequest(namespace=namespace, model=model)
        return (await self._call(self._stub.FlushNamespace, request)).deleted

    async def _call(self, rpc: grpc.aio.UnaryUnaryMultiCallable[Req, Resp], request: Req) -> Resp:
        try:
            return await rpc(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise translate_rpc_error(self.address, exc) from None
        except ValueError as exc:  # the channel was closed under us (the node moved)
            raise NodeUnavailable(f"{self.address}: {exc}") from None

    async def close(self) -> None:
        await self._channel.close()
