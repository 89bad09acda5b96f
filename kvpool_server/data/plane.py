"""The data plane: worker loops, the listeners that hand them connections, the sessions served.

A connection is admitted (connection limits), served by a :class:`Session` on the worker loop
the listener gave it to, then released. The TCP listener always runs, over TLS with
``data_tls``; the UCX listener with ``ucx_port`` >= 0. Stopping has two steps, so the daemon
can let requests in flight finish between them: stop accepting, then close.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from kvpool_client.core.channels.aio_socket import AsyncSocketChannel
from kvpool_client.core.errors import KVPoolError
from kvpool_server.data.admission import Admission
from kvpool_server.data.session import Channel, Session
from kvpool_server.data.tcp import TcpListener
from kvpool_server.data.workers import LoopThread
from kvpool_server.tenants.access import Access

if TYPE_CHECKING:
    from kvpool_server.config import ServerConfig
    from kvpool_server.control.tls import CertificateFiles
    from kvpool_server.data.nixl import NixlPeer
    from kvpool_server.data.published_gets import PublishedGets
    from kvpool_server.data.ucx import UcxListener
    from kvpool_server.stats import Counters, Latencies
    from kvpool_server.tiers.store import BlockStore

log = logging.getLogger("kvpool.data")

Serve = Callable[[Channel], Coroutine[Any, Any, None]]


def _left(deadline: float) -> float:
    """Seconds until ``deadline``, at least 0.1: a late step still gets its bounded wait."""
    return max(0.1, deadline - time.monotonic())


class DataPlane:
    """Serves data connections against one block store.

    Args:
        config: the daemon's settings; this reads its ``data``, ``net``, ``tls`` and ``ucx`` sections.
        store: the tiers every session reads and writes.
        counters, latencies: where sessions count requests and time them.
        access: the tokens a HELLO may prove, and their tenants.
        certificates: the server's certificates; with ``data_tls``, every connection is TLS.
        accepting_writes: whether this node takes writes now (False while draining).
        published: sends published blocks in answer to one-key GETs over plain TCP; None: the
            sessions answer every get themselves.
        nixl: the node's one-sided peer, which clients read and write the arena through; None: off.
    """

    def __init__(
        self,
        config: ServerConfig,
        store: BlockStore,
        counters: Counters,
        latencies: Latencies,
        access: Access,
        certificates: CertificateFiles | None,
        accepting_writes: Callable[[], bool],
        published: PublishedGets | None = None,
        nixl: NixlPeer | None = None,
    ) -> None:
        self._config = config
        self._nixl = nixl
        self._published = published
        self._store = store
        self._counters = counters
        self._latencies = latencies
        self._session_config = config.session_config(access.verifier())
        self._tls = certificates.server_context if config.tls.data and certificates is not None else None
        self._accepting_writes = accepting_writes
        self.admission = Admission(config.admission_limits(), counters)
        self._sessions: set[Session] = set()  # touched by every worker thread
        self._sessions_lock = threading.Lock()
        self._workers: list[LoopThread] = []
        self._tcp: TcpListener | None = None
        self._ucx: UcxListener | None = None

    @property
    def tcp_port(self) -> int:
        assert self._tcp is not None, "start() first"
        return self._tcp.port

    @property
    def ucx_port(self) -> int | None:
        """The bound UCX port; None: UCX is off."""
        return self._ucx.port if self._ucx is not None else None

    def start(self) -> None:
        """Start the worker loops, then listen.

        Raises:
            OSError: the TCP port is taken or the address unusable.
            KVPoolError: UCX is asked for and ucxx is missing, or UCX cannot listen.
        """
        cfg = self._config
        self._workers = [LoopThread(f"kvpool-data-{i}") for i in range(cfg.data.effective_workers())]
        for worker in self._workers:
            worker.start()
        self._tcp = TcpListener(
            cfg.net.host, cfg.net.data_port, self._serve, self._workers, cfg.data.io_timeout_s, self._tls
        )
        self._tcp.start()
        if cfg.ucx.port >= 0:
            limits = self._session_config.limits
            # A segment carries one block, or a frame's meta when it is too big to inline.
            self._ucx = _start_ucx(cfg, self._serve, max(limits.max_block_size, limits.max_meta))

    async def _serve(self, channel: Channel) -> None:
        """One connection, on its worker loop, from admission to close."""
        if not self.admission.connect(channel.peer):  # over a connection limit: closed unserved
            log.info("connection refused: over a connection limit", extra={"peer": channel.peer})
            return
        session = Session(
            channel,
            self._store,
            self._counters,
            self._latencies,
            self._session_config,
            self._accepting_writes,
            self.admission,
            self._published.bound(channel.fileno())
            if self._published is not None and isinstance(channel, AsyncSocketChannel)
            else None,
            self._nixl,
        )
        with self._sessions_lock:
            self._sessions.add(session)
        try:
            await session.run()
        finally:
            with self._sessions_lock:
                self._sessions.discard(session)
            self.admission.disconnect(channel.peer)

    def busy(self) -> bool:
        """Whether a request is being served."""
        with self._sessions_lock:
            return any(s.busy for s in self._sessions)

    async def stop_accepting(self) -> None:
        """Close the listening ports; connections go on."""
        if self._tcp is not None:
            await self._tcp.stop_accepting()
        if self._ucx is not None:
            await self._ucx.stop_accepting()

    async def close(self, deadline: float) -> None:
        """Cancel the connections left, stop UCX and the worker loops; each wait ends by ``deadline``."""
        if self._tcp is not None:
            await self._tcp.close_connections(timeout=_left(deadline))
        if self._ucx is not None:
            await self._ucx.close_connections(timeout=_left(deadline))
            await asyncio.to_thread(self._ucx.stop, _left(deadline))
        for worker in self._workers:
            worker.stop(timeout=_left(deadline))


def _start_ucx(cfg: ServerConfig, handler: Serve, max_segment: int) -> UcxListener:
    """The UCX listener (ucxx is imported only here: the daemon runs without it when ucx is off).

    Raises:
        KVPoolError: ucxx is missing, or UCX cannot listen on ``ucx_port``.
    """
    try:
        from kvpool_client.core.channels.ucx_channel import UcxSettings
        from kvpool_server.data.ucx import UcxListener
    except ImportError as exc:
        raise KVPoolError(f"ucx_port is set but ucxx cannot be imported ({exc}): install kvpool's ucx extra") from exc
    ucx = cfg.ucx
    settings = UcxSettings(ucx.tls, ucx.progress_mode, ucx.net_devices)
    listener = UcxListener(ucx.port, handler, settings, cfg.data.io_timeout_s, max_segment)
    listener.start()
    return listener
