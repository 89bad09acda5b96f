"""What both clients keep per node, minus the I/O: its member, cached info and idle connections.

:class:`NodeHandle` is the I/O-free base of the blocking and asyncio node objects;
they add fetching the info and opening, pooling and closing connections. The
record also negotiates the transports: gets read the node's shared arena when it
can be mapped here (``shm``); puts, and gets the mapping does not serve, move their bytes
one-sided when the node and this process have NIXL (``nixl``); connections use ``ucx``
when both ends can and the arena is not used, else ``tcp``. ``auto`` falls back to tcp when
ucx fails.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

from kvpool_client.core.auth import TlsFiles
from kvpool_client.core.channels.nixl_agent import NixlUnavailable
from kvpool_client.core.config import ClientConfig
from kvpool_client.core.control import NodeInfo
from kvpool_client.core.errors import KVPoolError, NodeUnavailable
from kvpool_client.core.routing import Member
from kvpool_client.core.wire import WireLimits
from kvpool_client.transport import ucx
from kvpool_client.transport.nixl import LocalAgent, RemoteArena
from kvpool_client.transport.shm import MappedArena, open_shared_arena

C = TypeVar("C")  # a pooled data connection
N = TypeVar("N", bound="NodeHandle[Any]")


class NodeHandle(Generic[C]):
    """One node's member, cached info and idle connections of type ``C``."""

    def __init__(self, member: Member, config: ClientConfig, nixl: LocalAgent) -> None:
        self.member = member
        self._nixl = nixl  # the client's NIXL agent, shared by its nodes
        self._remote: RemoteArena | None = None
        self._remote_tried = False
        self.address = member.address
        self._config = config
        self._info: NodeInfo | None = None
        self._idle: list[C] = []
        self._arena: MappedArena | None = None
        self._arena_tried = False
        self._tls_context: ssl.SSLContext | None = None
        self._ucx_failed = False  # auto: a ucx connection failed; tcp until the next negotiation

    def shared_arena(self) -> MappedArena | None:
        """The node's arena mapped here when the transport setting allows it; None: use tcp.

        Decided once per info read (None before the info is read). An arena the node
        no longer serves (it restarted) is dropped with the info, so the next
        operation reads the info again and maps the new arena.

        Raises:
            SharedArenaUnavailable: the ``shm`` transport is required and unusable.
        """
        info = self._info
        if info is None:
            return None
        arena = self._arena
        if arena is not None and arena.stale:
            self._info = None
            self.reset_transport()
            return None
        if self._config.transport in ("ucx", "nixl"):  # the arena is not read
            return None
        if not self._arena_tried:
            arena = self._arena = open_shared_arena(
                info.shared_arena, self._config.transport, self._config.location_ttl_s
            )
            self._arena_tried = True
        return arena

    def one_sided(self) -> RemoteArena | None:
        """The node's arena to read and write one-sided when the transport setting allows it;
        None: over the wire (None before the info is read).

        ``nixl`` requires it; ``auto`` takes it when the node offers it and NIXL works here.
        Decided once per info read; an arena found stale (the node restarted, or a transfer
        failed) is dropped with the info, so the next operation negotiates again.

        Raises:
            NixlUnavailable: ``nixl`` is required and the node or this process cannot do it.
        """
        info = self._info
        if info is None:
            return None
        remote = self._remote
        if remote is not None and remote.stale:
            self._info = None
            self.reset_transport()
            return None
        transport = self._config.transport
        if transport not in ("auto", "nixl") or self._remote_tried:
            return remote
        self._remote_tried = True
        if "nixl" not in info.data_endpoints:
            if transport == "nixl":
                raise NixlUnavailable(f"{self.address} offers no one-sided data plane (nixl transport)")
        elif self._nixl.available(required=transport == "nixl"):
            verify = info.shared_arena is not None and info.shared_arena.verify_checksums
            self._remote = RemoteArena(self._nixl, self._config.location_ttl_s, verify)
        return self._remote

    def transport(self) -> str:
        """The transport gets use now: ``shm``, ``nixl``, ``ucx`` or ``tcp``."""
        if self.shared_arena() is not None:
            return "shm"
        if self.one_sided() is not None:
            return "nixl"
        return "ucx" if self.ucx_address() is not None else "tcp"

    def ucx_address(self) -> str | None:
        """The node's ucx data address when new connections should use UCX; None: tcp (None before the info is read).

        ``ucx`` requires it. ``auto`` takes it when the node offers it, its arena is
        not mapped here (``shm`` serves gets then), ucxx imports here, and no ucx
        connection to the node failed since the last negotiation.

        Raises:
            UcxUnavailable: ``ucx`` is required and the node or this process cannot use it.
        """
        transport, info = self._config.transport, self._info
        if transport not in ("auto", "ucx") or info is None:
            return None
        address = info.data_endpoints.get("ucx")
        if transport == "ucx":
            if not address:
                raise ucx.UcxUnavailable(f"{self.address} offers no ucx data endpoint (ucx transport)")
            reason = ucx.import_error()
            if reason is not None:
                raise ucx.UcxUnavailable(f"ucxx cannot be imported ({reason}); pip install 'kvpool[ucx]'")
            return address
        if not address or self._ucx_failed or self.shared_arena() is not None or ucx.import_error() is not None:
            return None
        return address

    def ucx_failed(self, error: KVPoolError) -> None:
        """A ucx connection could not be opened: re-raise when ucx is required, else use tcp for now."""
        if self._config.transport == "ucx":
            raise error
        self._ucx_failed = True

    def reset_transport(self) -> None:
        """Negotiate again next time (after a failure, or when the info is re-read)."""
        self._arena, self._arena_tried = None, False
        self._ucx_failed = False
        if self._remote is not None:
            self._remote.close()
        self._remote, self._remote_tried = None, False

    def data_endpoint(self, endpoints: Mapping[str, str]) -> tuple[str, ssl.SSLContext | None]:
        """The node's TCP data address and, when its data plane requires TLS, the context to dial it with.

        Raises:
            NodeUnavailable: the node offers no TCP data endpoint, plain or TLS.
            UsageError: the TLS files (``ClientConfig.tls``) cannot be loaded.
        """
        if "tls" in endpoints:
            if self._tls_context is None:
                self._tls_context = (self._config.tls or TlsFiles("")).ssl_context()
            return endpoints["tls"], self._tls_context
        if "tcp" in endpoints:
            return endpoints["tcp"], None
        raise NodeUnavailable(f"{self.address} offers no tcp data endpoint")

    def cached_limits(self) -> WireLimits | None:
        """The node's limits if its info was read (and not forgotten since), else None."""
        info = self._info
        return None if info is None else info.limits

    def serves(self, member: Member) -> bool:
        """Whether this record still fits ``member`` (same control and data addresses)."""
        if member is self.member:  # the usual case: the same placement as last time
            return True
        return (self.address, self.member.data_address) == (member.address, member.data_address)

    def answers_to(self, address: str) -> bool:
        """Whether ``address`` names this node: its control address or its node id."""
        return address in (self.address, self.member.node_id)

    def has_room(self) -> bool:
        """Whether another idle connection may be pooled."""
        return len(self._idle) < self._config.max_idle_connections


def find_node(nodes: Iterable[N], address: str) -> N | None:
    """The first of ``nodes`` that :meth:`~NodeHandle.answers_to` ``address``, else None."""
    return next((node for node in nodes if node.answers_to(address)), None)
