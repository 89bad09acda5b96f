"""Where to read ahead from the SSD tier: sequential streams of client reads in the log.

An engine that reloads a long evicted prefix asks for it in batches, and the
demoter wrote the chain's records back to back, so the batches read the log front
to back. Served one at a time, each batch waits for its own disk reads while
the socket idles, then for its send while the disk idles. Reading the next records
into DRAM while a batch is sent overlaps the two.

This module only decides what to read, the way the kernel's read-ahead does for a
file, on positions in the log (:meth:`SsdTier.log_range` maps records to them; the
end of a sealed segment is the start of the next). A read that starts exactly where
an earlier read ended continues that stream, and a stream is kept ``window`` bytes
ahead of its reader, refilled once it runs less than half a window ahead. Any other
read starts a candidate stream and reads nothing ahead: one read is not a stream.
Several streams are followed at once (engines reload several prefixes). No I/O;
thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stretch:
    """Log positions ``[start, end)``."""

    start: int
    end: int


@dataclass(slots=True)
class _Stream:
    ahead_end: int  # where reading ahead reached (>= where the reader reached)


class ReadAheadPlanner:
    """Follows client reads of SSD records and says which stretch to read ahead.

    Args:
        window: bytes a stream is kept ahead of its reader (> 0).
        max_streams: streams followed at once; the least recently read is forgotten.
    """

    def __init__(self, window: int, max_streams: int = 64) -> None:
        if window <= 0 or max_streams <= 0:
            raise ValueError("window and max_streams must be > 0")
        self.window = window
        self._max_streams = max_streams
        self._streams: OrderedDict[int, _Stream] = OrderedDict()  # where its reader reached -> stream
        self._lock = threading.Lock()

    def observe(self, read: Stretch) -> Stretch | None:
        """Note that a client read ``read``; returns the stretch to read ahead now, if any."""
        with self._lock:
            stream = self._streams.pop(read.start, None)
            if stream is None:
                stream, ahead = _Stream(read.end), None
            else:
                stream.ahead_end = max(stream.ahead_end, read.end)
                ahead = self._refill(read.end, stream)
            self._streams[read.end] = stream
            if len(self._streams) > self._max_streams:
                self._streams.popitem(last=False)
            return ahead

    def _refill(self, read_end: int, stream: _Stream) -> Stretch | None:
        if stream.ahead_end - read_end > self.window // 2:
            return None  # far enough ahead: read in large steps, not one block per read
        stream.ahead_end = read_end + self.window
        # From the reader on, not from the last read-ahead's end: that need not be where
        # a record starts. What is in DRAM already is not read again.
        return Stretch(read_end, stream.ahead_end)
