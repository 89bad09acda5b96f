"""One-key GETs of published blocks, answered by the compiled reader without the DRAM tier's Python.

The usual answer to a one-key GET finds the key in the DRAM tier's index, pins the
block, refreshes its recency, sends it and unpins it: Python that costs a get as much
as the two syscalls around it. A block that is published (the table same-node
clients read, :mod:`kvpool_server.tiers.shared_index`) can be sent without any of it:
the compiled reader finds it in the table and sends its slot while holding the GIL, which
keeps the slot from being freed, so reused, meanwhile (``_arena_reader.c`` says why that
needs no pin), and marks the read as a same-node read marks it: the drain refreshes the
block's recency up to half a second later, with the reads of the other same-node readers.

Everything else takes the Python path: a block over :data:`HOLD_GIL_UP_TO`, a block not
published (its probe window was full, or it was read ahead from SSD and not read since), a
slot freed between the lookup and the send, a node that verifies checksums before sending, a
connection without a socket of its own (TLS, UCX, tests' channels), a build without the
compiled reader.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.wire import WireLimits
from kvpool_client.core.wire.one_key import encode_get_one
from kvpool_client.core.wire.published import MARK_SHIFT
from kvpool_server.index.published import PublishedIndex
from kvpool_server.stats import Counters

if TYPE_CHECKING:  # built where a C compiler was (an optional extension)
    from kvpool_client.core.wire._arena_reader import ArenaReader

# A session's sender: ``answer`` with its socket bound.
SendPublished = Callable[[int, str, bytes], bytes | None]

_OK = int(ErrorCode.OK)
# Larger blocks take the Python path, whose send lets the GIL go: the kernel's copy of this many
# bytes takes about as long as the Python it saves, and the GIL is held through it.
HOLD_GIL_UP_TO = 256 * 1024


class PublishedGets:
    """Sends published blocks in answer to one-key GETs (one per daemon, shared by its sessions).

    Args:
        table: the daemon's published index (for its key digests).
        reader: the compiled reader of that table (:meth:`SharedIndex.reader`).
        counters: the daemon's; a get answered here counts as the Python path counts it.
        limits: the connection limits; a block over ``max_payload`` is left to the Python path,
            which refuses it, as is one over :data:`HOLD_GIL_UP_TO`.
    """

    def __init__(self, table: PublishedIndex, reader: ArenaReader, counters: Counters, limits: WireLimits) -> None:
        self._table = table
        self._reader = reader
        self._counters = counters
        self._largest = min(limits.max_payload, HOLD_GIL_UP_TO)

    def bound(self, fd: int) -> SendPublished:
        """:meth:`answer` on the socket ``fd`` (one connection's)."""
        return functools.partial(self.answer, fd)

    def answer(self, fd: int, request_id: int, namespace: str, block: bytes) -> bytes | None:
        """Send the answer to a one-key GET of ``block`` to the socket ``fd`` if the block is published.

        Returns:
            What the socket did not take, copied, for the caller to send when it can
            (empty: all of it); None: nothing was sent, the Python path answers.

        Raises:
            OSError: the send failed (the peer reset the connection, say).
            ValueError: the table names a place that is not a slot of the arena (a bug).
        """
        low, high = self._table.digest((namespace, block))
        found = self._reader.locate(low, high, time.monotonic_ns() >> MARK_SHIFT)
        if found is None:
            return None
        offset, length, checksum, generation = found
        if length > self._largest:
            return None
        rest = self._reader.send(fd, encode_get_one(request_id, _OK, length, checksum), offset, length, generation)
        if rest is not None:
            counters = self._counters
            counters.add("requests_get")
            counters.add("dram_hits")
            counters.add("bytes_out", length)
            counters.add("shared_index_sends")
        return rest
