"""What both clients keep per node, minus the I/O: its member, cached info and idle connections.

:class:`NodeRecord` is the I/O-free base of the blocking and asyncio node objects;
they add fetching the info and opening, pooling and closing connections. The
record also negotiates the transport gets use: the node's shared arena when it can
be mapped here (``shm``), else ``tcp``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from kvpool_client.config import ClientConfig
from kvpool_client.control import NodeInfo
from kvpool_client.routing import Member
from kvpool_client.transport.shm import SharedArena, open_shared_arena
from kvpool_client.wire import WireLimits

C = TypeVar("C")  # a pooled data connection
N = TypeVar("N", bound="NodeRecord[Any]")


class NodeRecord(Generic[C]):
    """One node's member, cached info and idle connections of type ``C``."""

    def __init__(self, member: Member, config: ClientConfig) -> None:
        self.member = member
        self.address = member.address
        self._config = config
        self._info: NodeInfo | None = None
        self._idle: list[C] = []
        self._arena: SharedArena | None = None
        self._arena_tried = False

    def shared_arena(self) -> SharedArena | None:
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
        if not self._arena_tried:
            arena = self._arena = open_shared_arena(info.shared_arena, self._config.transport)
            self._arena_tried = True
        return arena

    def transport(self) -> str:
        """The transport gets use now: ``shm`` or ``tcp``."""
        return "shm" if self.shared_arena() is not None else "tcp"

    def reset_transport(self) -> None:
        """Negotiate again next time (after a failure, or when the info is re-read)."""
        self._arena, self._arena_tried = None, False

    def cached_limits(self) -> WireLimits | None:
        """The node's limits if its info was read (and not forgotten since), else None."""
        info = self._info
        return None if info is None else info.limits

    def serves(self, member: Member) -> bool:
        """Whether this record still fits ``member`` (same control and data addresses)."""
        return (self.address, self.member.data_address) == (member.address, member.data_address)

    def answers_to(self, address: str) -> bool:
        """Whether ``address`` names this node: its control address or its node id."""
        return address in (self.address, self.member.node_id)

    def has_room(self) -> bool:
        """Whether another idle connection may be pooled."""
        return len(self._idle) < self._config.max_idle_connections


def find_node(nodes: Iterable[N], address: str) -> N | None:
    """The first of ``nodes`` that :meth:`~NodeRecord.answers_to` ``address``, else None."""
    return next((node for node in nodes if node.answers_to(address)), None)
