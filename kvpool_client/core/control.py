"""gRPC control-plane calls a client needs: who a node is, its stats, batched key calls.

Blocking and asyncio flavours share the request building and the error mapping.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from kvpool_client.core.auth import Credentials, open_aio_channel, open_channel
from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable, RequestTimeout, error_for_code
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.core.wire import PROTOCOL_VERSION, WireLimits

ERROR_CODE_METADATA = "kvpool-error-code"


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
        shared = None if arena is None else SharedArenaInfo(
            arena.arena_path, arena.generations_offset, arena.arena_id, arena.capacity_bytes, arena.verify_checksums,
            arena.index_offset, arena.hit_marks_path,
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
    for key, value in (exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else ():
        if key == ERROR_CODE_METADATA and str(value).isdigit():
            return error_for_code(int(value), f"{address}: {detail}")
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimeout(f"{address}: control call timed out")
    if status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return NodeUnavailable(f"{address}: {detail}")
    return KVPoolError(f"{address}: {status.name if status else 'error'}: {detail}")


class ControlClient:
    """Blocking control-plane calls to one node."""

    def __init__(self, address: str, timeout: float, credentials: Credentials = Credentials()) -> None:
        self.address = address
        self._timeout = timeout
        self._channel = open_channel(address, credentials)
        self._stub = kvpool_pb2_grpc.KVPoolStub(self._channel)

    def server_info(self) -> NodeInfo:
        return NodeInfo.from_proto(self.address, self._call("GetServerInfo", pb.GetServerInfoRequest()))

    def stats(self) -> pb.Stats:
        return self._call("GetStats", pb.GetStatsRequest())

    def namespaces(self) -> list[pb.NamespaceUsage]:
        """Blocks and bytes of each namespace in each tier of this node."""
        return list(self._call("ListNamespaces", pb.ListNamespacesRequest()).namespaces)

    def flush_namespace(self, namespace: str = "", model: str = "") -> int:
        """Delete every block of ``namespace`` (or of every namespace of ``model``) on this node; returns how many."""
        return self._call("FlushNamespace", pb.FlushNamespaceRequest(namespace=namespace, model=model)).deleted


    def _call(self, method: str, request: object) -> object:
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout)
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
        self._stub = kvpool_pb2_grpc.KVPoolStub(self._channel)

    async def server_info(self) -> NodeInfo:
        return NodeInfo.from_proto(self.address, await self._call("GetServerInfo", pb.GetServerInfoRequest()))

    async def stats(self) -> pb.Stats:
        return await self._call("GetStats", pb.GetStatsRequest())

    async def namespaces(self) -> list[pb.NamespaceUsage]:
        """See :meth:`ControlClient.namespaces`."""
        return list((await self._call("ListNamespaces", pb.ListNamespacesRequest())).namespaces)

    async def flush_namespace(self, namespace: str = "", model: str = "") -> int:
        """See :meth:`ControlClient.flush_namespace`."""
        return (await self._call("FlushNamespace", pb.FlushNamespaceRequest(namespace=namespace, model=model))).deleted

    async def _call(self, method: str, request: object) -> object:
        try:
            return await getattr(self._stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise translate_rpc_error(self.address, exc) from None
        except ValueError as exc:  # the channel was closed under us (the node moved)
            raise NodeUnavailable(f"{self.address}: {exc}") from None

    async def close(self) -> None:
        await self._channel.close()
