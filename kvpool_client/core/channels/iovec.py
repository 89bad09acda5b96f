"""Lists of buffers for scatter/gather socket calls."""

from __future__ import annotations

IOV_MAX = 1024  # Linux: most buffers one sendmsg/recvmsg takes


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
