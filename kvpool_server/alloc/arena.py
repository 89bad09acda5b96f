"""The DRAM arena: one preallocated file in shared memory, mapped once.

It lives in ``/dev/shm`` (tmpfs) so that a later same-node transport can map it
and copy a block by offset. The file is created exclusively and its pages are
allocated and mapped up front, so the daemon fails at start, not on the hundredth
put, when the machine cannot hold it.

A daemon killed with SIGKILL cannot remove its file, and tmpfs would keep that
memory forever. So the owner holds an exclusive ``flock`` on its file for life, and
a starting daemon removes every arena file whose lock it can take: its owner is
gone. This works across PID namespaces, unlike checking process ids.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from pathlib import Path

ARENA_PREFIX = "kvpool-"
# The daemon writes; members of its group (same-node engines) may map it read-only; nobody else.
_ARENA_MODE = 0o640


class SharedArena:
    """A fixed-size shared-memory mapping; ``view`` slices are zero-copy.

    Args:
        directory: tmpfs folder, normally ``/dev/shm``.
        name: file name, unique per daemon.
        capacity: bytes to map.
        prefault: allocate and map every page now, so that missing memory fails at
            start and the hot path takes no page faults.
        extra: bytes mapped past ``capacity``, outside the blocks: bookkeeping that
            same-node readers map along with them (the slot generations).
        mode: the file's permissions (by default the daemon writes and its group reads).

    Raises:
        OSError: the file exists already, or the memory cannot be reserved.
    """

    def __init__(
        self, directory: str, name: str, capacity: int, prefault: bool = True, extra: int = 0, mode: int = _ARENA_MODE
    ) -> None:
        self.path = Path(directory) / name
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)  # whatever the umask: same-node readers come in by group
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until the process exits
            os.posix_fallocate(fd, 0, capacity + extra)
            # MAP_POPULATE maps every page now: a first write into a fresh slot would
            # otherwise take one page fault per 4 KiB on the put's path.
            flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if prefault else 0)
            self._map = mmap.mmap(fd, capacity + extra, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        self._fd = fd
        self.capacity = capacity
        self.view = memoryview(self._map)
        self.extra = self.view[capacity:]

    def slice(self, offset: int, length: int) -> memoryview:
        return self.view[offset : offset + length]

    def close(self) -> None:
        """Remove the file, then unmap it.

        The file goes first: shared memory left behind would outlive the daemon.
        Unmapping fails while a view is still exported (a session cancelled at
        shutdown may hold one); the mapping then goes with the process.

        Raises:
            BufferError: views of the arena are still alive (the file is removed anyway).
        """
        self.path.unlink(missing_ok=True)
        self.extra.release()
        self.view.release()
        self._map.close()
        os.close(self._fd)


def remove_stale_arenas(directory: str, prefix: str = ARENA_PREFIX) -> list[Path]:
    """Delete arena files in ``directory`` whose owning daemon is gone; returns them."""
    removed = []
    for path in Path(directory).glob(f"{prefix}*"):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live daemon holds it
        finally:
            os.close(fd)
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed
