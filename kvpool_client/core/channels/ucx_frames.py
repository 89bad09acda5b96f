"""How the ``ucx`` transport carries the data-plane byte stream in UCX tag messages (pure, no I/O).

The data plane is a byte stream (header, meta, payload) read with exact sizes for
payload and "whatever has arrived" for heads. UCX tag messages must be received
into a buffer of exactly their size, and only rendezvous tag messages move large
payloads without an intermediate copy (and, on InfiniBand/RoCE, by RDMA). So one
``send(buffers)`` call becomes one *unit*:

- a **head** message on the connection's head tag: ``inline length u32,
  segment count u32, one u64 size per segment``, then the inline bytes (the
  leading small buffers, copied together: a frame's header and meta);
- one **segment** message per remaining buffer, on the segment tag, sent
  straight from the caller's memory (an arena slot, a tensor).

The receiver learns a head's size by probing for it (heads are small, eager
messages), then knows every segment's size before posting its receive. A segment
that fits in what the reader asked for is received straight into the reader's
buffer (:func:`fit_segments`); one that does not (the reader's buffers are cut
differently from the sender's, e.g. a refused block drained in 1 MiB pieces) is
received into a scratch buffer and handed out like inline bytes.

The stream the reader sees is the concatenation of every unit's inline bytes
then its segments, exactly the bytes the sender passed, in order.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvpool_client.core.errors import ProtocolError

INLINE_LIMIT = 16 << 10  # leading buffers up to this many bytes in all travel inside the head
HEAD_LIMIT = 64 << 10  # the largest head a receiver accepts
_UNIT = struct.Struct("<II")  # inline length, segment count
_SIZE = struct.Struct("<Q")
MAX_SEGMENTS = (HEAD_LIMIT - _UNIT.size - INLINE_LIMIT) // _SIZE.size  # per unit; more start another unit

HELLO = struct.Struct("<4sIQ")  # magic, version, the sender's receive tag base
HELLO_MAGIC = b"KVPU"
HELLO_VERSION = 1


@dataclass(frozen=True, slots=True)
class Unit:
    """One head message and its segments, as indices into the buffers of a send."""

    inline: range
    segments: range


def plan_units(lengths: Sequence[int]) -> list[Unit]:
    """Cut a send of buffers with ``lengths`` into units.

    Leading buffers go inline while they add up to at most :data:`INLINE_LIMIT`
    bytes; every later buffer is a segment of its own, at most
    :data:`MAX_SEGMENTS` per unit. Empty buffers are the caller's to drop first.
    """
    inline_end, total = 0, 0
    while inline_end < len(lengths) and total + lengths[inline_end] <= INLINE_LIMIT:
        total += lengths[inline_end]
        inline_end += 1
    units = [Unit(range(inline_end), range(inline_end, min(len(lengths), inline_end + MAX_SEGMENTS)))]
    start = units[0].segments.stop
    while start < len(lengths):
        stop = min(len(lengths), start + MAX_SEGMENTS)
        units.append(Unit(range(start, start), range(start, stop)))
        start = stop
    return units


def encode_head(inline: Sequence[bytes | memoryview], segment_sizes: Sequence[int]) -> bytes:
    """The head message of a unit: its preamble, then the inline bytes."""
    inline_len = sum(len(b) for b in inline)
    parts = [_UNIT.pack(inline_len, len(segment_sizes)), *(_SIZE.pack(n) for n in segment_sizes), *inline]
    return b"".join(parts)


def decode_head(raw: bytes | bytearray | memoryview, max_segment: int) -> tuple[memoryview, list[int]]:
    """The inline bytes and segment sizes of a head message.

    Raises:
        ProtocolError: the head is malformed or announces a segment over ``max_segment``.
    """
    view = memoryview(raw)
    if len(view) < _UNIT.size:
        raise ProtocolError(f"a ucx head of {len(view)} bytes is too short")
    inline_len, count = _UNIT.unpack_from(view)
    sizes_end = _UNIT.size + count * _SIZE.size
    if sizes_end + inline_len != len(view):
        raise ProtocolError(f"a ucx head of {len(view)} bytes announces {inline_len} inline bytes and {count} segments")
    sizes = [_SIZE.unpack_from(view, _UNIT.size + i * _SIZE.size)[0] for i in range(count)]
    if any(not 0 < n <= max_segment for n in sizes):
        raise ProtocolError(f"a ucx segment size is out of range 1..{max_segment}")
    return view[sizes_end:], sizes


def fit_segments(segments: deque[int], targets: list[memoryview]) -> tuple[list[memoryview], list[memoryview]]:
    """Pair the next segments with slices of ``targets`` they fill exactly, without copying.

    Takes segments from the left of ``segments`` while each fits in what is left
    of the current target. Stops at the first that does not (it must be bounced)
    or when segments or targets run out.

    Returns:
        The slices to receive the taken segments into, in order, and the targets
        (or their unfilled ends) still to fill.
    """
    slices: list[memoryview] = []
    rest = list(targets)
    while segments and rest:
        size = segments[0]
        if size > len(rest[0]):
            break
        segments.popleft()
        slices.append(rest[0][:size])
        rest[0] = rest[0][size:]
        if not len(rest[0]):
            rest.pop(0)
    return slices, rest


def encode_hello(tag_base: int) -> bytes:
    return HELLO.pack(HELLO_MAGIC, HELLO_VERSION, tag_base)


def decode_hello(raw: bytes | bytearray) -> int:
    """The peer's receive tag base from its hello.

    Raises:
        ProtocolError: not a kvpool ucx peer, or another version.
    """
    magic, version, tag_base = HELLO.unpack(bytes(raw))
    if magic != HELLO_MAGIC or version != HELLO_VERSION:
        raise ProtocolError(f"not a kvpool ucx peer (magic {magic!r}, version {version})")
    return int(tag_base)
