"""gRPC servicer of ``kvpool.v1.KVPool``: control calls answered from the DRAM index.

Block bytes never pass through here. Errors carry a gRPC status and the stable
kvpool ``ErrorCode`` in the trailing metadata key ``kvpool-error-code``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc

from kvpool_client.errors import ErrorCode
from kvpool_client.proto import kvpool_pb2 as pb
from kvpool_client.proto import kvpool_pb2_grpc
from kvpool_client.wire import PROTOCOL_VERSION, WireLimits
from kvpool_client.wire.frames import MAX_HASH_BYTES, MAX_NAMESPACE_BYTES
from kvpool_server.index import StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.dram import DramTier

ERROR_CODE_METADATA = "kvpool-error-code"


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What GetServerInfo reports about this daemon."""

    node_id: str
    version: str
    endpoints: tuple[tuple[str, str], ...]  # (transport, "host:port")
    limits: WireLimits
    slab_size: int
    started_at: float


class ControlService(kvpool_pb2_grpc.KVPoolServicer):
    def __init__(self, identity: NodeIdentity, tier: DramTier, counters: Counters) -> None:
        self._identity = identity
        self._tier = tier
        self._counters = counters

    async def GetServerInfo(self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext) -> pb.ServerInfo:
        ident = self._identity
        return pb.ServerInfo(
            node_id=ident.node_id,
            version=ident.version,
            protocol_version=PROTOCOL_VERSION,
            endpoints=[pb.DataEndpoint(transport=t, address=a) for t, a in ident.endpoints],
            dram_capacity_bytes=self._tier.usage().capacity_bytes,
            slab_size=ident.slab_size,
            limits=pb.WireLimits(
                max_keys=ident.limits.max_keys,
                max_block_size=ident.limits.max_block_size,
                max_payload=ident.limits.max_payload,
            ),
            state="active",
            started_at_unix_s=ident.started_at,
        )

    async def Exists(self, request: pb.KeysRequest, context: grpc.aio.ServicerContext) -> pb.ExistsResponse:
        keys = await self._keys(request, context)
        return pb.ExistsResponse(present=[self._tier.contains(k) for k in keys])

    async def Lookup(self, request: pb.KeysRequest, context: grpc.aio.ServicerContext) -> pb.LookupResponse:
        keys = await self._keys(request, context)
        return pb.LookupResponse(prefix_hits=self._tier.prefix_hits(keys))

    async def Delete(self, request: pb.KeysRequest, context: grpc.aio.ServicerContext) -> pb.DeleteResponse:
        keys = await self._keys(request, context)
        return pb.DeleteResponse(deleted=[self._tier.delete(k) for k in keys])

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.Stats:
        usage = self._tier.usage()
        counters = self._counters
        dram = pb.TierStats(
            name="dram",
            capacity_bytes=usage.capacity_bytes,
            used_bytes=usage.used_bytes,
            blocks=usage.blocks,
            hits=counters.get("dram_hits"),
            misses=counters.get("dram_misses"),
            evictions=counters.get("dram_evictions"),
        )
        uptime = time.time() - self._identity.started_at
        return pb.Stats(node_id=self._identity.node_id, uptime_s=uptime, tiers=[dram], counters=counters.snapshot())

    async def _keys(self, request: pb.KeysRequest, context: grpc.aio.ServicerContext) -> list[StoreKey]:
        """Validate a batch of keys or abort the call with INVALID_ARGUMENT."""
        problem = _keys_problem(request, self._identity.limits)
        if problem:
            self._counters.add("errors_invalid_argument")
            context.set_trailing_metadata(((ERROR_CODE_METADATA, str(int(ErrorCode.INVALID_ARGUMENT))),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return [(request.namespace, h) for h in request.hashes]


def _keys_problem(request: pb.KeysRequest, limits: WireLimits) -> str | None:
    if not 0 < len(request.namespace.encode()) <= MAX_NAMESPACE_BYTES:
        return f"namespace must be 1..{MAX_NAMESPACE_BYTES} bytes of UTF-8"
    if len(request.hashes) > limits.max_keys:
        return f"{len(request.hashes)} keys exceed the limit of {limits.max_keys} per request"
    bad = next((i for i, h in enumerate(request.hashes) if not 0 < len(h) <= MAX_HASH_BYTES), None)
    if bad is not None:
        return f"hash {bad} is {len(request.hashes[bad])} bytes; expected 1..{MAX_HASH_BYTES}"
    return None
