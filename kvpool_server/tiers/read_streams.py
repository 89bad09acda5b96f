"""Where to read ahead from the SSD tier: sequential streams of client reads in the log.

An engine that reloads a long evicted prefix asks for it in batches, and the
demoter wrote the chain's records back to back, so the batches read the log front
to back. Served one at a time, each batch waits for its own disk reads while
the socket idles, then for its send while the disk idles. Reading the next records
into DRAM while a batch is sent overlaps the two.

This module only decides what to read, the way the kernel's read-ahead does for a
file, on positions in the log (:meth:`SsdTier.log_range` maps records to them; the
end of a sealed segment is the start of the next). A read that starts exactly where
an earlier read ended continues that stream forward; one that ends exactly where an
earlier read started continues it backward. Backward streams are the common case:
the demoter writes the coldest blocks first, and a chain is committed tail first, so
its head lies last on disk and a prefix read head first walks the log down. A stream
is kept ``window`` bytes ahead of its reader, in its direction, refilled once less
than half a window is left. Any other read starts a candidate stream and reads
nothing ahead: one read is not a stream. Several streams are followed at once
(engines reload several prefixes). No I/O; thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stretch:
    """Log positions ``[start, end)``; ``backward``: to be walked from ``end`` down."""

    start: int
    end: int
    backward: bool = False


@dataclass(slots=True)
class _Stream:
    ahead: int  # where reading ahead reached, in the stream's direction


class ReadAheadPlanner:
    """Follows client reads of SSD records and says which stretch to read ahead.

    Args:
        window: bytes a stream is kept ahead of its reader (> 0).
        max_streams: streams followed at once in each direction; the least recently
            read is forgotten.
    """

    def __init__(self, window: int, max_streams: int = 64) -> None:
        if window <= 0 or max_streams <= 0:
            raise ValueError("window and max_streams must be > 0")
        self.window = window
        self._max_streams = max_streams
        # Forward streams by where their reader reached (a read's end), backward ones
        # by where theirs reached (a read's start).
        self._forward: OrderedDict[int, _Stream] = OrderedDict()
        self._backward: OrderedDict[int, _Stream] = OrderedDict()
        self._lock = threading.Lock()

    def observe(self, read: Stretch) -> Stretch | None:
        """Note that a client read ``read``; returns the stretch to read ahead now, if any."""
        with self._lock:
            if (stream := self._forward.pop(read.start, None)) is not None:
                stream.ahead = max(stream.ahead, read.end)
                self._remember(self._forward, read.end, stream)
                return self._refill_forward(read.end, stream)
            if (stream := self._backward.pop(read.end, None)) is not None:
                stream.ahead = min(stream.ahead, read.start)
                self._remember(self._backward, read.start, stream)
                return self._refill_backward(read.start, stream)
            self._remember(self._forward, read.end, _Stream(read.end))  # candidates, either way
            self._remember(self._backward, read.start, _Stream(read.start))
            return None

    def _remember(self, streams: OrderedDict[int, _Stream], reached: int, stream: _Stream) -> None:
        streams[reached] = stream
        if len(streams) > self._max_streams:
            streams.popitem(last=False)

    def _refill_forward(self, reached: int, stream: _Stream) -> Stretch | None:
        if stream.ahead - reached > self.window // 2:
            return None  # far enough ahead: read in large steps, not one block per read
        stream.ahead = reached + self.window
        # From the reader on, not from the last read-ahead's end: that need not be where
        # a record starts. What is in DRAM already is not read again.
        return Stretch(reached, stream.ahead)

    def _refill_backward(self, reached: int, stream: _Stream) -> Stretch | None:
        if reached - stream.ahead > self.window // 2:
            return None
        stream.ahead = reached - self.window
        return Stretch(stream.ahead, reached, backward=True)
