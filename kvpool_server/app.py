"""kvpool-server: the storage daemon's entry point and life cycle.

The main loop runs gRPC and accepts data connections; data connections are served
on worker loops (one thread each) that share the block store (DRAM tier, and the
SSD tier with its demoter thread when configured).

Phases: ``start`` (arena, tiers, listeners, health SERVING, announce), ``serve``
until SIGTERM or SIGINT, then ``shutdown``: health NOT_SERVING, stop accepting,
let in-flight requests finish within the grace period, close everything. Every
wait in shutdown has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvpool_client.core.auth import Credentials
from kvpool_client.core.config import tls_from_env
from kvpool_client.core.errors import KVPoolError, UsageError
from kvpool_client.core.membership.records import NodeRecord, NodeState
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.core.version import package_version
from kvpool_server import preflight
from kvpool_server.config import ConfigError, ServerConfig, load_config
from kvpool_server.control.auth import TokenInterceptor
from kvpool_server.control.malformed import MalformedBodyInterceptor
from kvpool_server.control.service import ControlService, NodeIdentity, SharedArenaIdentity
from kvpool_server.control.tls import CertificateFiles
from kvpool_server.data.plane import DataPlane
from kvpool_server.data.published_gets import PublishedGets
from kvpool_server.logs import configure_logging
from kvpool_server.membership.handoff import hand_off
from kvpool_server.membership.presence import NodePresence
from kvpool_server.membership.registration import InvalidTransition
from kvpool_server.membership.repair import MembershipRepair, RepairSettings
from kvpool_server.metrics import KVPoolCollector, MetricsServer, build_registry
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tenants.access import Access
from kvpool_server.tenants.usage import TenantUse, tenant_use
from kvpool_server.tiers.node import NodeTiers
from kvpool_server.tiers.store import BlockStore

if TYPE_CHECKING:
    from kvpool_server.config_sections import NetSettings
    from kvpool_server.data.nixl import NixlPeer

log = logging.getLogger("kvpool.server")

_POLL_S = 0.01


def _left(deadline: float) -> float:
    """Seconds until ``deadline``, at least 0.1: a late step still gets its bounded wait."""
    return max(0.1, deadline - time.monotonic())


class Daemon:
    """One node's storage daemon: DRAM and SSD tiers, TCP data plane, gRPC control plane."""

    def __init__(self, config: ServerConfig, access: Access | None = None) -> None:
        self.config = config
        self._access = access or Access(None)  # the cluster's token and the tenants'; none: no authentication
        self._token = self._access.cluster_token
        self.counters = Counters()
        self.latencies = Latencies()
        membership = config.membership
        self.presence = NodePresence(
            membership.etcd_endpoints, membership.cluster, membership.lease_ttl_s, membership.etcd_tls()
        )
        self._tiers: NodeTiers | None = None
        self._data: DataPlane | None = None
        self._grpc: grpc.aio.Server | None = None
        self._certificates: CertificateFiles | None = None  # TLS of gRPC and, with data_tls, the data plane
        self._metrics: MetricsServer | None = None
        self._health = health.aio.HealthServicer()
        self._stopping = asyncio.Event()
        self._background: set[asyncio.Task[object]] = set()
        self._repair: MembershipRepair | None = None
        self._nixl: NixlPeer | None = None

    async def start(self) -> None:
        """Tiers, data plane, control plane, then membership and health."""
        cfg = self.config
        tls = cfg.tls
        self._certificates = (
            CertificateFiles(tls.cert_file, tls.key_file, tls.client_ca_file) if tls.cert_file else None
        )
        tenants = self._access.has_tenants
        dram, ssd = (self._access.quotas(tier) if tenants else None for tier in ("dram", "ssd"))
        self._tiers = await NodeTiers.open(cfg.dram, cfg.ssd, self.counters, dram, ssd)
        store = self._tiers.store
        self._nixl = self._start_nixl() if cfg.nixl.enabled else None
        data = self._start_data_plane(store)
        grpc_port = self._bind_grpc()
        net = cfg.resolved(grpc_port).net
        metrics_port = self._start_metrics(store, net.node_id)
        identity = self._identity(net, metrics_port)
        await self._start_control_plane(store, identity)
        await self.presence.start(self._record(identity, net, grpc_port))
        await self.presence.set_state(NodeState.ACTIVE)
        await self._start_repair(store, identity.node_id)
        if self._tiers.shared_index is not None:
            drain = asyncio.get_running_loop().create_task(self._tiers.shared_index.run(store.dram, self.counters))
            self._background.add(drain)  # cancelled at shutdown
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set("kvpool.v1.KVPool", health_pb2.HealthCheckResponse.SERVING)
        self._announce(net.node_id, grpc_port, data.tcp_port, metrics_port)
        log.info(
            "serving",
            extra={
                "grpc_port": grpc_port,
                "data_port": data.tcp_port,
                "node_id": identity.node_id,
                "metrics": identity.metrics_url or "off",
            },
        )

    def _start_data_plane(self, store: BlockStore) -> DataPlane:
        """Serve data connections; puts are refused while this node takes no writes (draining)."""
        data = self._data = DataPlane(  # kept before it starts: shutdown stops what a failed start left running
            self.config,
            store,
            self.counters,
            self.latencies,
            self._access,
            self._certificates,
            self._accepting_writes,
            self._published_gets(),
            self._nixl,
        )
        data.start()
        return data

    def _start_nixl(self) -> NixlPeer:
        """The arena registered with a NIXL agent: clients read and write it one-sided.

        Raises:
            NixlUnavailable: NIXL is not installed or cannot register the arena.
        """
        assert self._tiers is not None
        from kvpool_server.data.nixl import NixlPeer  # NIXL is imported only when it is on

        arena = self._tiers.arena
        peer = NixlPeer(arena.view, self._tiers.generations.arena_id, arena.capacity)
        peer.start()
        return peer

    def _published_gets(self) -> PublishedGets | None:
        """One-key GETs of published blocks answered in compiled code; None without a published
        index, without the compiled reader, or when each block's checksum is verified before it is sent."""
        assert self._tiers is not None
        index = self._tiers.shared_index
        if index is None or self.config.data.verify_checksum_on_get:
            return None
        reader = index.reader(self._tiers.generations, self._tiers.arena)
        return None if reader is None else PublishedGets(index.table, reader, self.counters, self.config.wire_limits())

    def _accepting_writes(self) -> bool:
        return self.presence.accepting_writes

    def _identity(self, net: NetSettings, metrics_port: int) -> NodeIdentity:
        """What GetServerInfo reports; ``net`` resolved, so it names the node and the host clients reach."""
        assert self._data is not None
        host = net.advertise_host
        shared = self._shared_arena()
        endpoints = [
            ("tls" if self.config.tls.data else "tcp", f"{host}:{self._data.tcp_port}"),
            ("shm", shared.arena_path),
        ]
        if self._data.ucx_port is not None:
            endpoints.append(("ucx", f"{host}:{self._data.ucx_port}"))
        if self._nixl is not None:  # its agent is reached through the data endpoint (PEER)
            endpoints.append(("nixl", self._nixl.agent_name))
        # The advertised host, as for the data endpoints: where a scraper or kvpoolctl can reach it.
        url_host = f"[{host}]" if ":" in host else host  # IPv6
        metrics_url = f"http://{url_host}:{metrics_port}/metrics" if metrics_port > 0 else ""
        return NodeIdentity(
            node_id=net.node_id,
            version=package_version(),
            endpoints=tuple(endpoints),
            limits=self.config.wire_limits(),
            slab_size=self.config.dram.slab_size,
            started_at=time.time(),
            shared_arena=shared,
            metrics_url=metrics_url,
        )

    def _shared_arena(self) -> SharedArenaIdentity:
        """The arena as same-node clients map it (the ``shm`` transport)."""
        assert self._tiers is not None
        arena, index = self._tiers.arena, self._tiers.shared_index
        return SharedArenaIdentity(
            str(arena.path),
            arena.capacity,
            self._tiers.generations.arena_id,
            arena.capacity,
            self.config.data.verify_checksum_on_get,
            index.offset if index is not None else 0,
            index.marks_path if index is not None else "",
        )

    def _bind_grpc(self) -> int:
        """Create the gRPC server and bind its port; returns the port bound.

        Raises:
            OSError: the port is taken or the address unusable.
        """
        net = self.config.net
        interceptors: list[grpc.aio.ServerInterceptor] = [MalformedBodyInterceptor(self.counters)]
        if self._access.required:
            interceptors.insert(0, TokenInterceptor(self._access, self.counters))  # refuse before parsing
        self._grpc = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=interceptors)
        address = f"{net.host}:{net.grpc_port}"
        try:
            if self._certificates is not None:
                port = self._grpc.add_secure_port(address, self._certificates.credentials())
            else:
                port = self._grpc.add_insecure_port(address)
        except RuntimeError as exc:  # grpc reports a port in use this way
            raise OSError(f"cannot bind gRPC on {address}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot bind gRPC on {address}")
        return port

    async def _start_control_plane(self, store: BlockStore, identity: NodeIdentity) -> None:
        assert self._grpc is not None
        assert self._data is not None
        control = ControlService(
            identity,
            store,
            self.counters,
            self.presence,
            lambda: self._start_handoff(store, identity),
            self._access,
            self._data.admission.tenant_connections,
        )
        kvpool_pb2_grpc.add_KVPoolServicer_to_server(control, self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        await self._grpc.start()

    def _start_metrics(self, store: BlockStore, node_id: str) -> int:
        """Serve /metrics unless ``metrics_port`` is -1; returns the bound port (-1: off).

        Raises:
            OSError: the port is taken or the address unusable.
        """
        net = self.config.net
        if net.metrics_port < 0:
            return -1
        collector = KVPoolCollector(
            node_id, package_version(), store, self.counters, self.latencies, self.presence, self._tenant_use(store)
        )
        try:
            self._metrics = MetricsServer(net.host, net.metrics_port, build_registry(collector))
        except OSError as exc:
            raise OSError(f"cannot bind metrics on {net.host}:{net.metrics_port}: {exc}") from exc
        return self._metrics.port

    def _tenant_use(self, store: BlockStore) -> Callable[[], list[TenantUse]]:
        """Each tenant's use of this node, for the metrics; none without a credentials file."""
        if not self._access.has_tenants:
            return list
        data = self._data
        assert data is not None

        def use() -> list[TenantUse]:
            return tenant_use(self._access.credentials(), store.namespace_bytes(), data.admission.tenant_connections())

        return use

    def _record(self, identity: NodeIdentity, net: NetSettings, grpc_port: int) -> NodeRecord:
        """This node as etcd lists it; ``net`` resolved."""
        return NodeRecord(
            node_id=identity.node_id,
            address=f"{net.advertise_host}:{grpc_port}",
            data_endpoints=dict(identity.endpoints),
            capacity_bytes=self.config.dram.capacity,
            weight=self.config.membership.node_weight,
            version=identity.version,
            registered_at=identity.started_at,
        )

    def _credentials(self) -> Credentials:
        """What this node shows the nodes it copies blocks to (hand-off, repair)."""
        return Credentials(self._token, tls_from_env(os.environ))

    def _start_handoff(self, blocks: BlockStore, identity: NodeIdentity) -> None:
        """Copy this node's blocks to their next owners, in the background."""
        store = self.presence.store
        if store is None:
            log.warning("hand-off needs etcd membership; skipped")
            return
        task = asyncio.get_running_loop().create_task(
            hand_off(blocks, store, self.presence.cluster, identity.node_id, self.counters, self._credentials())
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _start_repair(self, blocks: BlockStore, node_id: str) -> None:
        """Re-replicate after membership changes, in the background (with etcd and ``repair_enabled``)."""
        repair = self.config.repair
        if not repair.enabled or self.presence.store is None:
            return
        self._repair = MembershipRepair(
            blocks,
            self.presence.store,
            self.presence.cluster,
            node_id,
            self.counters,
            self._credentials(),
            RepairSettings(repair.settle_s, repair.bandwidth, repair.replicas),
        )
        await self._repair.start()

    def _announce(self, node_id: str, grpc_port: int, data_port: int, metrics_port: int) -> None:
        """Write the bound ports to ``announce_file``, if set."""
        if not self.config.net.announce_file:
            return
        path = Path(self.config.net.announce_file)
        tmp = path.with_suffix(path.suffix + ".tmp")
        info = {
            "node_id": node_id,
            "grpc_port": grpc_port,
            "data_port": data_port,
            "metrics_port": metrics_port,
            "pid": os.getpid(),
        }
        tmp.write_text(json.dumps(info))
        tmp.rename(path)  # readers never see a half-written file

    def request_stop(self) -> None:
        self._stopping.set()

    async def serve(self) -> None:
        """Block until :meth:`request_stop` (wired to SIGTERM and SIGINT)."""
        await self._stopping.wait()

    async def shutdown(self) -> None:
        """Drain, let requests in flight finish within ``shutdown_grace_s``, then close everything."""
        grace = self.config.net.shutdown_grace_s
        log.info("shutting down", extra={"grace_s": grace})
        await self._leave()
        deadline = time.monotonic() + grace
        while self._data is not None and self._data.busy() and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        if self._data is not None:
            await self._data.close(deadline)
        for task in self._background:
            task.cancel()
        if self._background:  # a hand-off holds pins and the etcd store: let it unwind
            await asyncio.wait(self._background, timeout=_left(deadline))
        await self.presence.close()
        if self._tiers is not None:
            flush_s = max(0.0, deadline - time.monotonic()) if self.config.ssd.flush_on_shutdown else 0.0
            await self._tiers.close_tiers(flush_s)
        await self._close_servers(deadline)
        if self._nixl is not None:
            self._nixl.stop(_left(deadline))
        if self._tiers is not None:  # last: a gRPC call may have held a view of it
            self._tiers.close_arena()
        log.info("stopped")

    async def _leave(self) -> None:
        """Stop repairing, go draining (clients stop placing writes here; reads still work), stop accepting."""
        if self._repair is not None:  # no new copies from a node on its way out; a run in progress is cancelled
            await self._repair.close()
        with contextlib.suppress(InvalidTransition):
            await self.presence.set_state(NodeState.DRAINING)
        await self._health.enter_graceful_shutdown()
        if self._data is not None:
            await self._data.stop_accepting()

    async def _close_servers(self, deadline: float) -> None:
        """Stop /metrics and gRPC."""
        if self._metrics is not None:  # off the loop: stopping waits for the server's poll
            await asyncio.to_thread(self._metrics.stop, min(1.0, _left(deadline)))
        if self._grpc is not None:
            await self._grpc.stop(grace=_left(deadline))


async def run(config: ServerConfig, access: Access) -> None:
    daemon = Daemon(config, access)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop)
    try:
        await daemon.start()
        await daemon.serve()
    finally:
        await daemon.shutdown()


def main(argv: list[str] | None = None) -> int:
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, os.environ)
        access = Access(config.auth.token(), config.auth.tenants_file)
    except (ConfigError, UsageError) as exc:
        print(f"kvpool-server: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log.level, config.log.format, config.net.node_id or "kvpool")
    try:
        for warning in preflight.check(config):
            log.warning(warning)
        uvloop.run(run(config, access))
    except (OSError, KVPoolError) as exc:  # a port in use; ucx asked for and unavailable
        log.error("cannot start", extra={"error": str(exc)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
