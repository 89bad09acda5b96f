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
