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
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvpool_client.core.auth import Credentials, read_token
from kvpool_client.core.config import tls_from_env
from kvpool_client.core.errors import KVPoolError, UsageError
from kvpool_client.core.membership.records import NodeRecord, NodeState
from kvpool_client.core.proto import kvpool_pb2_grpc
from kvpool_client.core.version import package_version
from kvpool_client.core.wire import WireLimits
from kvpool_server import preflight
from kvpool_server.alloc.arena import ARENA_PREFIX, SharedArena, remove_stale_arenas
from kvpool_server.alloc.generations import SlotGenerations
from kvpool_server.alloc.slab import SlabAllocator
from kvpool_server.config import ConfigError, ServerConfig, load_config
from kvpool_server.data.admission import Admission, AdmissionLimits
from kvpool_server.control.auth import TokenInterceptor
from kvpool_server.control.malformed import MalformedBodyInterceptor
from kvpool_server.control.service import ControlService, NodeIdentity, SharedArenaIdentity
from kvpool_server.control.tls import CertificateFiles
from kvpool_server.data.session import Channel, Session, SessionConfig
from kvpool_server.data.tcp import TcpListener
from kvpool_server.data.workers import LoopThread
from kvpool_server.eviction import POLICIES
from kvpool_server.logs import configure_logging
from kvpool_server.membership.handoff import hand_off
from kvpool_server.membership.presence import NodePresence
from kvpool_server.membership.registration import InvalidTransition
from kvpool_server.membership.repair import MembershipRepair
from kvpool_server.metrics import KVPoolCollector, MetricsServer, build_registry
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tiers.demoter import Demoter, count_lost_evictions
from kvpool_server.tiers.dram import DramTier
from kvpool_server.tiers.shared_index import SharedIndex, entries_for, extra_bytes
from kvpool_server.tiers.ssd import SsdTier
from kvpool_server.tiers.store import BlockStore

if TYPE_CHECKING:
    from kvpool_server.data.ucx import UcxListener

log = logging.getLogger("kvpool.server")

_POLL_S = 0.01


class Daemon:
    """One node's storage daemon: DRAM and SSD tiers, TCP data plane, gRPC control plane."""

    def __init__(self, config: ServerConfig, token: bytes | None = None) -> None:
        self.config = config
        self._token = token  # the cluster's shared token; None: no authentication
        self.counters = Counters()
        self.latencies = Latencies()
        self.limits = WireLimits(config.max_keys_per_request, config.max_block_size, config.max_frame_bytes)
        self._sessions: set[Session] = set()  # touched by every worker thread
        self._sessions_lock = threading.Lock()
        self._workers: list[LoopThread] = []
        self._arena: SharedArena | None = None
        self._generations: SlotGenerations | None = None
        self._shared_index: SharedIndex | None = None  # the published index, with shared_index_entries
        self._store: BlockStore | None = None
        self._demoter: Demoter | None = None
        self._data: TcpListener | None = None
        self._ucx: UcxListener | None = None  # with ucx_port >= 0
        self._grpc: grpc.aio.Server | None = None
        self._certificates: CertificateFiles | None = None  # TLS of gRPC and, with data_tls, the data plane
        self._metrics: MetricsServer | None = None
        self._health = health.aio.HealthServicer()
        self._stopping = asyncio.Event()
        self._background: set[asyncio.Task[object]] = set()
        self._repair: MembershipRepair | None = None
        self.presence = NodePresence(config.etcd_endpoints, config.cluster, config.lease_ttl_s, config.etcd_tls())

    async def start(self) -> None:
        """Tiers, data plane, control plane, then membership and health."""
        cfg = self.config
        if cfg.tls_cert_file:
            self._certificates = CertificateFiles(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
        store = await self._open_store()
        self._start_data_plane(store)
        assert self._data is not None
        grpc_port = self._bind_grpc()
        resolved = self.config.resolved(grpc_port)
        shared = self._shared_arena()
        metrics_port = self._start_metrics(store, resolved.node_id)
        # The advertised host, as for the data endpoints: where a scraper or kvpoolctl can reach it.
        host = f"[{resolved.advertise_host}]" if ":" in resolved.advertise_host else resolved.advertise_host  # IPv6
        metrics_url = f"http://{host}:{metrics_port}/metrics" if metrics_port > 0 else ""
        identity = NodeIdentity(
            node_id=resolved.node_id,
            version=package_version(),
            endpoints=(
                ("tls" if cfg.data_tls else "tcp", f"{resolved.advertise_host}:{self._data.port}"),
                ("shm", shared.arena_path),
                *((("ucx", f"{resolved.advertise_host}:{self._ucx.port}"),) if self._ucx is not None else ()),
            ),
            limits=self.limits,
            slab_size=self.config.slab_size,
            started_at=time.time(),
            shared_arena=shared,
            metrics_url=metrics_url,
        )
        await self._start_control_plane(store, identity)
        await self.presence.start(self._record(identity, grpc_port))
        await self.presence.set_state(NodeState.ACTIVE)
        await self._start_repair(store, identity.node_id)
        if self._shared_index is not None:
            drain = asyncio.get_running_loop().create_task(self._shared_index.run(store.dram, self.counters))
            self._background.add(drain)  # cancelled at shutdown
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set("kvpool.v1.KVPool", health_pb2.HealthCheckResponse.SERVING)
        self._announce(resolved.node_id, grpc_port, self._data.port, metrics_port)
        log.info("serving", extra={"grpc_port": grpc_port, "data_port": self._data.port, "node_id": identity.node_id,
                                   "metrics": metrics_url or "off"})

    async def _open_store(self) -> BlockStore:
        """The DRAM arena and tier, plus the SSD tier and its demoter when ``ssd_dir`` is set."""
        cfg = self.config
        for stale in remove_stale_arenas(cfg.shm_dir):
            log.warning("removed the arena of a daemon that died", extra={"path": str(stale)})
        name = f"{ARENA_PREFIX}{os.getpid()}-{time.monotonic_ns()}"
        entries = entries_for(cfg.shared_index_entries, cfg.dram_capacity)
        extra = extra_bytes(cfg.dram_capacity, entries)
        if cfg.prefault_arena:  # seconds per GiB: say so before the wait
            log.info("prefaulting the DRAM arena", extra={"bytes": cfg.dram_capacity, "shm_dir": cfg.shm_dir})
        mapped = time.monotonic()
        self._arena = SharedArena(cfg.shm_dir, name, cfg.dram_capacity, prefault=cfg.prefault_arena, extra=extra)
        log.info("DRAM arena ready", extra={"bytes": cfg.dram_capacity, "seconds": round(time.monotonic() - mapped, 2)})
        arena_id = int.from_bytes(os.urandom(8), "little") or 1  # tells this arena from a restarted daemon's
        self._generations = SlotGenerations(self._arena.extra, cfg.dram_capacity, arena_id)
        self._shared_index = SharedIndex(self._arena, entries, arena_id) if entries else None
        ssd = await asyncio.to_thread(self._open_ssd) if cfg.ssd_dir else None  # scans segments
        on_evict = count_lost_evictions(ssd, self.counters) if ssd is not None else None
        allocator = SlabAllocator(cfg.dram_capacity, cfg.slab_size)
        policy = POLICIES[cfg.eviction_policy]
        dram = DramTier(self._arena, allocator, self.counters, policy_factory=policy, on_evict=on_evict,
                        namespace_quota=cfg.namespace_quota,
                        generations=self._generations,
                        published=self._shared_index.table if self._shared_index is not None else None)
        self._store = BlockStore(dram, ssd, self.counters, promote_on_hit=cfg.ssd_promote_on_hit,
                                 write_through=cfg.ssd_write_through, io_threads=cfg.ssd_io_threads,
                                 read_ahead=min(cfg.ssd_read_ahead, cfg.dram_capacity // 4))
        if ssd is not None:
            self._demoter = Demoter(self._store, cfg.ssd_demote_share)
            self._demoter.start()
        return self._store

    def _shared_arena(self) -> SharedArenaIdentity:
        """The arena as same-node clients map it (the ``shm`` transport)."""
        assert self._arena is not None and self._generations is not None
        arena = self._arena
        index = self._shared_index
        return SharedArenaIdentity(str(arena.path), arena.capacity, self._generations.arena_id, arena.capacity,
                                   self.config.verify_checksum_on_get, index.offset if index is not None else 0,
                                   index.marks_path if index is not None else "")

    def _open_ssd(self) -> SsdTier:
        cfg = self.config
        return SsdTier(cfg.ssd.tier_config(), self.counters, POLICIES[cfg.dram.eviction_policy])

    def _start_data_plane(self, store: BlockStore) -> None:
        """Worker loops and the TCP listener that hands them connections."""
        cfg = self.config
        session_config = SessionConfig(self.limits, cfg.verify_checksum_on_get, self._token, cfg.idle_timeout_s,
                                       cfg.io_timeout_s)
        admission = self.admission = Admission(AdmissionLimits(cfg.effective_inflight_put_bytes(), cfg.max_connections,
                                                               cfg.max_connections_per_peer), self.counters)

        async def serve_connection(channel: Channel) -> None:
            if not admission.connect(channel.peer):  # over a connection limit: closed unserved
                log.info("connection refused: over a connection limit", extra={"peer": channel.peer})
                return
            session = Session(channel, store, self.counters, self.latencies, session_config,
                              lambda: self.presence.accepting_writes, admission)
            with self._sessions_lock:
                self._sessions.add(session)
            try:
                await session.run()
            finally:
                with self._sessions_lock:
                    self._sessions.discard(session)
                admission.disconnect(channel.peer)

        self._workers = [LoopThread(f"kvpool-data-{i}") for i in range(cfg.effective_data_workers())]
        for worker in self._workers:
            worker.start()
        tls = self._certificates.server_context if cfg.data_tls and self._certificates else None
        self._data = TcpListener(cfg.host, cfg.data_port, serve_connection, self._workers, cfg.io_timeout_s, tls)
        self._data.start()
        if cfg.ucx_port >= 0:
            # A segment carries one block, or a frame's meta when it is too big to inline.
            largest_segment = max(self.limits.max_block_size, self.limits.max_meta)
            self._ucx = _start_ucx(cfg, serve_connection, largest_segment)

    def _bind_grpc(self) -> int:
        """Create the gRPC server and bind its port; returns the port bound.

        Raises:
            OSError: the port is taken or the address unusable.
        """
        cfg = self.config
        interceptors: list[grpc.aio.ServerInterceptor] = [MalformedBodyInterceptor(self.counters)]
        if self._token is not None:
            interceptors.insert(0, TokenInterceptor(self._token, self.counters))  # refuse before parsing
        self._grpc = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=interceptors)
        address = f"{cfg.host}:{cfg.grpc_port}"
        try:
            if self._certificates is not None:
                port = self._grpc.add_secure_port(address, self._certificates.credentials())
            else:
                port = self._grpc.add_insecure_port(address)
        except RuntimeError as exc:  # grpc reports a port in use this way
            raise OSError(f"cannot bind gRPC on {cfg.host}:{cfg.grpc_port}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot bind gRPC on {cfg.host}:{cfg.grpc_port}")
        return port

    async def _start_control_plane(self, store: BlockStore, identity: NodeIdentity) -> None:
        assert self._grpc is not None
        control = ControlService(identity, store, self.counters, self.presence, lambda: self._start_handoff(store, identity))
        kvpool_pb2_grpc.add_KVPoolServicer_to_server(control, self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        await self._grpc.start()

    def _start_metrics(self, store: BlockStore, node_id: str) -> int:
        """Serve /metrics unless ``metrics_port`` is -1; returns the bound port (-1: off).

        Raises:
            OSError: the port is taken or the address unusable.
        """
        cfg = self.config
        if cfg.metrics_port < 0:
            return -1
        collector = KVPoolCollector(node_id, package_version(), store, self.counters, self.latencies, self.presence)
        try:
            self._metrics = MetricsServer(cfg.host, cfg.metrics_port, build_registry(collector))
        except OSError as exc:
            raise OSError(f"cannot bind metrics on {cfg.host}:{cfg.metrics_port}: {exc}") from exc
        return self._metrics.port

    async def _close_store(self, deadline: float) -> None:
        """Stop the demoter (flushing DRAM to SSD if configured, within the grace period)."""
        if self._demoter is not None:
            flush_s = max(0.0, deadline - time.monotonic()) if self.config.ssd_flush_on_shutdown else 0.0
            await asyncio.to_thread(self._demoter.stop, flush_s)
        if self._store is not None:
            await asyncio.to_thread(self._store.close)
            if self._store.ssd is not None:
                self._store.ssd.close()

    def _record(self, identity: NodeIdentity, grpc_port: int) -> NodeRecord:
        host = self.config.resolved(grpc_port).advertise_host
        return NodeRecord(
            node_id=identity.node_id,
            address=f"{host}:{grpc_port}",
            data_endpoints=dict(identity.endpoints),
            capacity_bytes=self.config.dram_capacity,
            weight=self.config.node_weight,
            version=identity.version,
            registered_at=identity.started_at,
        )

    def _start_handoff(self, blocks: BlockStore, identity: NodeIdentity) -> None:
        """Copy this node's blocks to their next owners, in the background."""
        store = self.presence.store
        if store is None:
            log.warning("hand-off needs etcd membership; skipped")
            return
        task = asyncio.get_running_loop().create_task(
            hand_off(blocks, store, self.presence.cluster, identity.node_id, self.counters,
                     Credentials(self._token, tls_from_env(os.environ)))
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _start_repair(self, blocks: BlockStore, node_id: str) -> None:
        """Re-replicate after membership changes, in the background (with etcd and ``repair_enabled``)."""
        cfg = self.config
        if not cfg.repair.enabled or self.presence.store is None:
            return
        settings = cfg.repair.settings()
        credentials = Credentials(self._token, tls_from_env(os.environ))
        self._repair = MembershipRepair(blocks, self.presence.store, self.presence.cluster, node_id, self.counters,
                                        credentials, settings)  # fmt: skip
        await self._repair.start()

    def _announce(self, node_id: str, grpc_port: int, data_port: int, metrics_port: int) -> None:
        if not self.config.announce_file:
            return
        path = Path(self.config.announce_file)
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

    def _any_request_in_flight(self) -> bool:
        with self._sessions_lock:
            return any(s.busy for s in self._sessions)

    async def shutdown(self) -> None:
        grace = self.config.shutdown_grace_s
        log.info("shutting down", extra={"grace_s": grace})
        if self._repair is not None:  # no new copies from a node on its way out; a run in progress is cancelled
            await self._repair.close()
        # Draining first: clients stop placing writes here while reads still work.
        with contextlib.suppress(InvalidTransition):
            await self.presence.set_state(NodeState.DRAINING)
        await self._health.enter_graceful_shutdown()
        if self._data is not None:
            await self._data.stop_accepting()
        if self._ucx is not None:
            await self._ucx.stop_accepting()
        deadline = time.monotonic() + grace
        while self._any_request_in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        if self._data is not None:
            await self._data.close_connections(timeout=max(0.1, deadline - time.monotonic()))
        if self._ucx is not None:
            await self._ucx.close_connections(timeout=max(0.1, deadline - time.monotonic()))
            await asyncio.to_thread(self._ucx.stop, max(0.1, deadline - time.monotonic()))
        for worker in self._workers:
            worker.stop(timeout=max(0.1, deadline - time.monotonic()))
        for task in self._background:
            task.cancel()
        if self._background:  # a hand-off holds pins and the etcd store: let it unwind
            await asyncio.wait(self._background, timeout=max(0.1, deadline - time.monotonic()))
        await self.presence.close()
        await self._close_store(deadline)
        if self._metrics is not None:  # off the loop: stopping waits for the server's poll
            await asyncio.to_thread(self._metrics.stop, max(0.1, min(1.0, deadline - time.monotonic())))
        if self._grpc is not None:
            await self._grpc.stop(grace=max(0.1, deadline - time.monotonic()))
        if self._shared_index is not None:  # retired first: readers of its table map the next arena
            self._shared_index.close()
        if self._generations is not None:
            self._generations.close()
        if self._arena is not None:
            try:
                self._arena.close()
            except BufferError:
                log.warning("arena still mapped by an unfinished request; it is freed at exit")
        log.info("stopped")


def _start_ucx(cfg: ServerConfig, handler: Callable[[Any], Coroutine[Any, Any, None]], max_segment: int) -> UcxListener:
    """The UCX listener (ucxx is imported only here: the daemon runs without it when ucx is off).

    Raises:
        KVPoolError: ucxx is missing, or UCX cannot listen on ``ucx_port``.
    """
    try:
        from kvpool_client.core.channels.ucx_channel import UcxSettings
        from kvpool_server.data.ucx import UcxListener
    except ImportError as exc:
        raise KVPoolError(f"ucx_port is set but ucxx cannot be imported ({exc}); pip install 'kvpool[ucx]'") from exc
    settings = UcxSettings(cfg.ucx_tls, cfg.ucx_progress_mode, cfg.ucx_net_devices)
    listener = UcxListener(cfg.ucx_port, handler, settings, cfg.io_timeout_s, max_segment)
    listener.start()
    return listener


async def run(config: ServerConfig, token: bytes | None) -> None:
    daemon = Daemon(config, token)
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
        token = read_token(config.auth_token_file) if config.auth_token_file else None
    except (ConfigError, UsageError) as exc:
        print(f"kvpool-server: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_format, config.node_id or "kvpool")
    try:
        for warning in preflight.check(config):
            log.warning(warning)
        uvloop.run(run(config, token))
    except (OSError, KVPoolError) as exc:  # a port in use; ucx asked for and unavailable
        log.error("cannot start", extra={"error": str(exc)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
