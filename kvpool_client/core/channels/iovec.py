"""Lists of buffers for scatter/gather socket calls."""

from __future__ import annotations

from collections.abc import Sequence

IOV_MAX = 1024  # Linux: most buffers one sendmsg/recvmsg takes


def byte_count(buffers: Sequence[bytes | bytearray | memoryview]) -> int:
    """Bytes in ``buffers``: a memoryview's ``nbytes`` (its ``len`` counts items), the others' ``len``."""
    return sum([b.nbytes if type(b) is memoryview else len(b) for b in buffers])


def byte_views(buffers: Sequence[bytes | bytearray | memoryview]) -> list[memoryview]:
    """Flat byte views of the non-empty ``buffers``, as :func:`advance` takes them."""
    return [memoryview(b).cast("B") for b in buffers if len(b)]


def advance(buffers: list[memoryview], nbytes: int) -> list[memoryview]:
    """Drop the first ``nbytes`` from a list of buffers without copying."""
    if nbytes == sum(map(len, buffers)):  # the usual end, all sent or filled: no Python loop over the buffers
        return []
    index = 0
    while index < len(buffers) and nbytes >= len(buffers[index]):
        nbytes -= len(buffers[index])
        index += 1
    rest = buffers[index:]
    if nbytes:
        rest[0] = rest[0][nbytes:]
    return rest
