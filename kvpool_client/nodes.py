"""What both clients keep per node, minus the I/O: its member, cached info and idle connections.

:class:`NodeRecord` is the I/O-free base of the blocking and asyncio node objects;
they add fetching the info and opening, pooling and closing connections.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from kvpool_client.config import ClientConfig
from kvpool_client.control import NodeInfo
from kvpool_client.routing import Member
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
