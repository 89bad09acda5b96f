"""Where records lie in the segment log, and the sequential reads a batch of them makes.

A :class:`RecordAddress` names a record's bytes in the log (segment, offset, length).
:func:`plan_spans` groups the records a batch wants into spans that lie back to back
on disk, and :func:`chunk_span` splits a span into read calls of about ``READ_CHUNK``
bytes. A span is then read the way a sequential reader reads a file, so the kernel's
read-ahead streams the device ahead of the reads (and past the span, into the records
written after it: a prefix chain's next blocks).

Why apart from :mod:`~kvpool_server.tiers.segments`: this is arithmetic on positions,
with no files and no I/O. The index keeps addresses
(:mod:`~kvpool_server.index.locations`), the rebuild makes them from columns
(:mod:`~kvpool_server.tiers.rebuild`) and the block store plans its read-ahead with
spans (:mod:`~kvpool_server.tiers.store`); none of them opens a segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

READ_CHUNK = 1 << 20  # bytes per read call of a span: a sequential reader's size; the kernel reads ahead of it
_CHUNK_RECORDS = 256  # two buffers per record, well under IOV_MAX (1024) per preadv


@dataclass(frozen=True, slots=True)
class RecordAddress:
    """A record's place in the log: ``length`` bytes (header + key + payload) at ``offset`` of a segment."""

    segment_id: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Span:
    """Records that lie back to back in one segment: read front to back as one stretch."""

    segment_id: int
    offset: int
    length: int
    members: tuple[int, ...]  # indices into the planned locations, in disk order

    @property
    def location(self) -> RecordAddress:
        return RecordAddress(self.segment_id, self.offset, self.length)


def plan_spans(locations: Sequence[RecordAddress]) -> list[Span]:
    """Group ``locations`` into spans of records back to back on disk, in disk order.

    Every index of ``locations`` is in exactly one span. The same location given
    twice starts a new span (its bytes are read twice): a span never overlaps itself.
    """
    order = sorted(range(len(locations)), key=lambda i: (locations[i].segment_id, locations[i].offset))
    groups: list[list[int]] = []
    for i in order:
        here, last = locations[i], locations[groups[-1][-1]] if groups else None
        if last is not None and (last.segment_id, last.offset + last.length) == (here.segment_id, here.offset):
            groups[-1].append(i)
        else:
            groups.append([i])
    spans = []
    for group in groups:
        first, final = locations[group[0]], locations[group[-1]]
        spans.append(Span(first.segment_id, first.offset, final.offset + final.length - first.offset, tuple(group)))
    return spans


def chunk_span(lengths: Sequence[int], max_bytes: int = READ_CHUNK, max_records: int = _CHUNK_RECORDS) -> list[range]:
    """Split a span's records (their lengths, in disk order) into read calls.

    Each call reads whole records, at most ``max_bytes`` (or one record, if larger)
    and ``max_records`` of them; the ranges cover every record once, in order.
    """
    calls: list[range] = []
    start, size = 0, 0
    for i, length in enumerate(lengths):
        if i > start and (size + length > max_bytes or i - start >= max_records):
            calls.append(range(start, i))
            start, size = i, 0
        size += length
    if lengths:
        calls.append(range(start, len(lengths)))
    return calls
