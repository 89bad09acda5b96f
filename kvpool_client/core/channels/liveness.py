"""Is a pooled connection still usable? Checked before reuse, at the cost of one poll.

A node that restarted closed every connection a client had pooled. A pooled
connection has nothing to read between requests, so a socket that polls readable
is either closed by the peer (end of stream or reset) or out of step with the
protocol: the client then opens a fresh connection instead of failing a request
on a dead one.
"""

from __future__ import annotations

import select
import socket


def reusable(sock: socket.socket) -> bool:
    """True when the peer has neither closed the connection nor sent unasked bytes."""
    if sock.fileno() < 0:
        return False
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    # Zero timeout: this never waits, whatever the socket's own timeout mode.
    return not poller.poll(0)


class IdleProbe:
    """:func:`reusable` for one socket, with its poller made once: checked before every
    pooled request, a new poller each time cost more than the check."""

    __slots__ = ("_sock", "_poller")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN | select.POLLPRI)

    def reusable(self) -> bool:
        """True when the peer has neither closed the connection nor sent unasked bytes."""
        return self._sock.fileno() >= 0 and not self._poller.poll(0)
