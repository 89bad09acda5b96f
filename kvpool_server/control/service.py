"""gRPC servicer of ``kvpool.v1.KVPool``: control calls answered from the tiers' indexes.

Block bytes never pass through here. Errors carry a gRPC status and the stable
kvpool ``ErrorCode`` in the trailing metadata key ``kvpool-error-code``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc
from grpc.aio import ServicerContext

from kvpool_client.core.control import ERROR_CODE_METADATA, Req, Resp
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.core.wire import PROTOCOL_VERSION, WireLimits
from kvpool_client.core.wire.frames import MAX_HASH_BYTES, MAX_NAMESPACE_BYTES
from kvpool_server.index import StoreKey
from kvpool_server.membership.presence import NodePresence
from kvpool_server.membership.registration import InvalidTransition
from kvpool_server.stats import Counters
from kvpool_server.tenants.access import Access
from kvpool_server.tenants.usage import tenant_use
from kvpool_server.tiers.store import BlockStore, TierReport


@dataclass(frozen=True, slots=True)
class SharedArenaIdentity:
    """Where same-node clients find the arena to map read-only."""

    arena_path: str
    generations_offset: int
    arena_id: int
    capacity_bytes: int
    verify_checksums: bool = False  # the node checks blocks it serves; readers of the arena should too
    index_offset: int = 0  # the published index inside the arena file; 0: none
    hit_marks_path: str = ""  # where readers of the published index mark their reads


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What GetServerInfo reports about this daemon."""

    node_id: str
    version: str
    endpoints: tuple[tuple[str, str], ...]  # (transport, "host:port" or the arena path for shm)
    limits: WireLimits
    slab_size: int
    started_at: float
    shared_arena: SharedArenaIdentity | None = None
    metrics_url: str = ""  # empty: /metrics is off


class ControlService(kvpool_pb2_grpc.KVPoolServicer):
    """Answers control calls; ``start_handoff`` launches a background hand-off on drain."""

    def __init__(
        self,
        identity: NodeIdentity,
        store: BlockStore,
        counters: Counters,
        presence: NodePresence,
        start_handoff: Callable[[], None],
        access: Access | None = None,
        tenant_connections: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._identity = identity
        self._store = store
        self._counters = counters
        self._presence = presence
        self._start_handoff = start_handoff
        self._access = access or Access(None)
        self._tenant_connections = tenant_connections

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: ServicerContext[pb.GetServerInfoRequest, pb.ServerInfo]
    ) -> pb.ServerInfo:
        return self._server_info()

    def _server_info(self) -> pb.ServerInfo:
        ident = self._identity
        return pb.ServerInfo(
            node_id=ident.node_id,
            version=ident.version,
            protocol_version=PROTOCOL_VERSION,
            endpoints=[pb.DataEndpoint(transport=t, address=a) for t, a in ident.endpoints],
            dram_capacity_bytes=self._store.dram.usage().capacity_bytes,
            ssd_capacity_bytes=self._store.ssd.usage().capacity_bytes if self._store.ssd is not None else 0,
            slab_size=ident.slab_size,
            limits=pb.WireLimits(
                max_keys=ident.limits.max_keys,
                max_block_size=ident.limits.max_block_size,
                max_payload=ident.limits.max_payload,
            ),
            state=str(self._presence.state),
            started_at_unix_s=ident.started_at,
            shared_arena=_shared_arena(ident.shared_arena),
            metrics_url=ident.metrics_url,
        )

    async def Exists(
        self, request: pb.KeysRequest, context: ServicerContext[pb.KeysRequest, pb.ExistsResponse]
    ) -> pb.ExistsResponse:
        keys = await self._keys(request, context)
        return pb.ExistsResponse(present=[self._store.contains(k) for k in keys])

    async def Lookup(
        self, request: pb.KeysRequest, context: ServicerContext[pb.KeysRequest, pb.LookupResponse]
    ) -> pb.LookupResponse:
        keys = await self._keys(request, context)
        return pb.LookupResponse(prefix_hits=self._store.prefix_hits(keys))

    async def Delete(
        self, request: pb.KeysRequest, context: ServicerContext[pb.KeysRequest, pb.DeleteResponse]
    ) -> pb.DeleteResponse:
        keys = await self._keys(request, context)
        return pb.DeleteResponse(deleted=[self._store.delete(k) for k in keys])

    async def GetStats(
        self, request: pb.GetStatsRequest, context: ServicerContext[pb.GetStatsRequest, pb.Stats]
    ) -> pb.Stats:
        tiers = [_tier_stats(report) for report in self._store.reports()]
        counters = self._counters
        uptime = time.time() - self._identity.started_at
        snapshot = counters.snapshot(zeros=True)  # every declared counter, as /metrics exports them
        snapshot["etcd_registered"] = int(self._presence.session == "registered")
        return pb.Stats(node_id=self._identity.node_id, uptime_s=uptime, tiers=tiers, counters=snapshot)

    async def FlushNamespace(
        self,
        request: pb.FlushNamespaceRequest,
        context: ServicerContext[pb.FlushNamespaceRequest, pb.FlushNamespaceResponse],
    ) -> pb.FlushNamespaceResponse:
        named = [v for v in (request.namespace, request.model) if v]
        if len(named) != 1 or not 0 < len(named[0].encode()) <= MAX_NAMESPACE_BYTES:
            await self._abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"give a namespace or a model, 1..{MAX_NAMESPACE_BYTES} bytes of UTF-8",
            )
        if request.namespace:
            deleted = await asyncio.to_thread(self._store.flush, request.namespace.__eq__)
        else:
            prefix = request.model + "@"  # a namespace id is model@dtype@layout@tpRofS
            deleted = await asyncio.to_thread(self._store.flush, lambda namespace: namespace.startswith(prefix))
        self._counters.add("namespace_flushes")
        return pb.FlushNamespaceResponse(deleted=deleted)

    async def ListNamespaces(
        self, request: pb.ListNamespacesRequest, context: ServicerContext[pb.ListNamespacesRequest, pb.NamespaceList]
    ) -> pb.NamespaceList:
        tiers = await asyncio.to_thread(self._store.namespace_usage)
        rows = [
            pb.NamespaceUsage(namespace=ns, tier=tier, blocks=u.blocks, bytes=u.bytes)
            for tier, usage in tiers.items()
            for ns, u in sorted(usage.items())
        ]
        return pb.NamespaceList(namespaces=rows)

    async def ListTenants(
        self, request: pb.ListTenantsRequest, context: ServicerContext[pb.ListTenantsRequest, pb.TenantList]
    ) -> pb.TenantList:
        tiers = await asyncio.to_thread(self._store.namespace_bytes)
        uses = tenant_use(self._access.credentials(), tiers, self._tenant_connections())
        return pb.TenantList(
            tenants=[
                pb.TenantUsage(
                    tenant=use.tenant.name,
                    namespaces=use.tenant.namespaces,
                    rights=sorted(r.value for r in use.tenant.rights),
                    dram_bytes=use.tier_bytes.get("dram", 0),
                    ssd_bytes=use.tier_bytes.get("ssd", 0),
                    dram_quota=use.tenant.quotas.dram,
                    ssd_quota=use.tenant.quotas.ssd,
                    connections=use.connections,
                    connection_cap=use.tenant.quotas.connections,
                )
                for use in uses
            ]
        )

    async def SetState(
        self, request: pb.SetStateRequest, context: ServicerContext[pb.SetStateRequest, pb.ServerInfo]
    ) -> pb.ServerInfo:
        if request.state not in ("draining", "active"):
            await self._abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"state must be draining or active, not {request.state[:64]!r}",
            )
        try:
            await self._presence.set_state(request.state)
        except InvalidTransition as exc:
            await self._abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if request.handoff and request.state == "draining":
            self._start_handoff()
        return self._server_info()

    async def _keys(self, request: pb.KeysRequest, context: ServicerContext[pb.KeysRequest, Resp]) -> list[StoreKey]:
        """Validate a batch of keys or abort the call with INVALID_ARGUMENT."""
        problem = _keys_problem(request, self._identity.limits)
        if problem:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)
        return [(request.namespace, h) for h in request.hashes]

    async def _abort(self, context: ServicerContext[Req, Resp], status: grpc.StatusCode, message: str) -> None:
        """End the call with ``status``; the kvpool code rides in the trailing metadata."""
        self._counters.add(f"errors_{status.name.lower()}")
        # Both are the caller's to fix: a bad argument, or a move the node's state forbids.
        caller_errors = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
        code = ErrorCode.INVALID_ARGUMENT if status in caller_errors else ErrorCode.INTERNAL
        context.set_trailing_metadata(((ERROR_CODE_METADATA, str(int(code))),))
        await context.abort(status, message)


def _shared_arena(arena: SharedArenaIdentity | None) -> pb.SharedArena | None:
    if arena is None:
        return None
    return pb.SharedArena(
        arena_path=arena.arena_path,
        generations_offset=arena.generations_offset,
        arena_id=arena.arena_id,
        capacity_bytes=arena.capacity_bytes,
        verify_checksums=arena.verify_checksums,
        index_offset=arena.index_offset,
        hit_marks_path=arena.hit_marks_path,
    )


def _tier_stats(report: TierReport) -> pb.TierStats:
    usage = report.usage
    return pb.TierStats(
        name=report.name,
        capacity_bytes=usage.capacity_bytes,
        used_bytes=usage.used_bytes,
        blocks=usage.blocks,
        hits=report.hits,
        misses=report.misses,
        evictions=report.evictions,
        promotions=report.promotions,
        demotions=report.demotions,
        corrupt_blocks=report.corrupt_blocks,
        io_errors=report.io_errors,
        failure=report.failure,
    )


def _keys_problem(request: pb.KeysRequest, limits: WireLimits) -> str | None:
    if not 0 < len(request.namespace.encode()) <= MAX_NAMESPACE_BYTES:
        return f"namespace must be 1..{MAX_NAMESPACE_BYTES} bytes of UTF-8"
    if len(request.hashes) > limits.max_keys:
        return f"{len(request.hashes)} keys exceed the limit of {limits.max_keys} per request"
    bad = next((i for i, h in enumerate(request.hashes) if not 0 < len(h) <= MAX_HASH_BYTES), None)
    if bad is not None:
        return f"hash {bad} is {len(request.hashes[bad])} bytes; expected 1..{MAX_HASH_BYTES}"
    return None
