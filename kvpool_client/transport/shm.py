"""The ``shm`` transport: a same-node client reads blocks straight out of the daemon's arena.

The daemon's DRAM arena is a file in ``/dev/shm``. A client on the same node maps
it read-only, asks the node over the TCP connection where a batch of blocks lies
(``LOCATE``: offset, length, checksum and slot generation per key) and copies
each block into the caller's buffer: one copy (:mod:`kvpool_client.core.channels.copy`, fast
whatever the buffer's alignment), no socket in between.

Nothing is pinned during the copy. Instead the daemon bumps a slot's generation
whenever it frees the slot, before it can be reused (:mod:`kvpool_client.core.wire.generations`).
The reader copies, then reads the generation again: unchanged means no reuse
overlapped the copy (x86-64 keeps loads in order, and the daemon's bump is stored
before any new bytes); changed means the bytes may be torn, and the block is
read again over TCP. A reader never returns bytes of a reused slot. That argument
needs x86-64's ordering (Python has no memory barriers to give it elsewhere), so
on other CPUs (aarch64 reorders loads) the client does not map the arena.

The generation also changes when a block is deleted or evicted, and blocks never
change once written, so a location stays good for as long as its generation holds.
The client keeps the locations it read lately (:class:`KnownLocations`) and copies
a block it read before without asking the node again, checking the generation
before the copy (a block gone costs no copy) and after it, as above.

Where the node publishes its blocks' locations in shared memory (the published
index, :mod:`kvpool_client.core.wire.published`), a block the client never read is found
there the same way, lock-free, and each such read is marked for the node's eviction
order. A block missing from the table, or one whose entry is being rewritten, is
located by asking, as before. A table the node retired (it shut down) marks the
mapping stale, so the node's next arena is mapped; one whose heartbeat stopped (the
node was killed, or hangs) is not read: the client asks, and a restarted node's
answer names its new arena, which marks the mapping stale too.

A one-key get through the published index runs in one call of a compiled reader
(``_arena_reader.c``, :meth:`MappedArena.read_published`) where the package was built
with a C compiler; the Python reads here are its reference and its fallback.

Which transport a node gets is negotiated from its server info
(:func:`open_shared_arena`); puts, lookups and deletes always go over TCP.
"""

from __future__ import annotations

import mmap
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvpool_client.buffers import Regions, Target
from kvpool_client.buffers import checksum as checksum_of
from kvpool_client.core.channels.copy import address, copy_into
from kvpool_client.core.channels.copy import route as copy_route
from kvpool_client.core.control import SharedArenaInfo
from kvpool_client.core.errors import ErrorCode, KVPoolError, ProtocolError
from kvpool_client.core.wire.generations import HEADER_BYTES, GenerationsHeader, decode_header
from kvpool_client.core.wire.published import MARK_SHIFT, MarkWriter, PublishedReader

try:
    from kvpool_client.core.wire import _arena_reader
except ImportError:  # not compiled where this was installed: the pure-Python reads serve alone
    _arena_reader = None  # type: ignore[assignment]

_ORDERED_LOADS = ("x86_64", "amd64")  # CPUs that never reorder a load before an earlier one


class SharedArenaUnavailable(KVPoolError):
    """The node's arena cannot be mapped here (another host, no permission, gone)."""

    code = ErrorCode.UNAVAILABLE


class SlotLocation(NamedTuple):  # a tuple: made on every get, at a third of a dataclass's cost
    """Where one block lies in the arena, and its slot's generation when it was located."""

    offset: int
    length: int
    generation: int


KNOWN_LOCATIONS = 1 << 16  # locations a client keeps per node: 24 GiB of 384 KiB blocks
# (location, checksum) of a block found without asking the node, or None.
Finder = Callable[[str, bytes], "tuple[SlotLocation, int] | None"]


class KnownLocations:
    """Locations (and checksums) of blocks read from the arena lately, reused for ``ttl_s``.

    Reuse needs no time limit to be safe: the slot's generation, checked around each
    copy, says when a block is gone. The limit is for the node, which does not see
    these reads: a block read often is still located that often, which refreshes
    its place in the node's eviction order, and a node that restarted (a new arena;
    the old mapping's generations never move again) is noticed within it.
    ``ttl_s`` 0 asks the node on every get (the arena then passes no ``published``).

    Args:
        published: finds a block not known here (or known too long) in the node's
            published index; None: the node has none.
    """

    def __init__(
        self,
        ttl_s: float,
        capacity: int = KNOWN_LOCATIONS,
        clock: Callable[[], float] = time.monotonic,
        published: Finder | None = None,
    ) -> None:
        self._ttl = ttl_s
        self._capacity = capacity
        self._clock = clock
        self._published = published
        self._entries: dict[tuple[str, bytes], tuple[SlotLocation, int, float]] = {}

    def lookup(self, namespace: str, hashes: Sequence[bytes]) -> list[tuple[SlotLocation, int]] | None:
        """(location, checksum) of every block, if all are known and fresh or published; else None."""
        found = []
        for block in hashes:
            hit = self.find(namespace, block)
            if hit is None:
                return None
            found.append(hit)
        return found

    def find(self, namespace: str, block: bytes) -> tuple[SlotLocation, int] | None:
        """(location, checksum) of one block, if known and fresh or published; else None."""
        if self._ttl:
            known = self._entries.get((namespace, block))
            if known is not None and known[2] >= self._clock():
                return known[0], known[1]
        return None if self._published is None else self._published(namespace, block)

    def remember(
        self, namespace: str, block: bytes, location: SlotLocation, checksum: int, until: float | None = None
    ) -> None:
        """Keep a block's location for the ttl, or until ``until`` (seconds on the clock) if sooner."""
        if not self._ttl:
            return
        if len(self._entries) >= self._capacity:
            self._entries.clear()  # hints only: start over rather than track recency here
        expires = self._clock() + self._ttl
        self._entries[(namespace, block)] = (location, checksum, expires if until is None else min(expires, until))

    def forget(self, namespace: str, block: bytes) -> None:
        self._entries.pop((namespace, block), None)


class MappedArena:
    """A read-only mapping of a daemon's arena and of its slot generations.

    Args:
        info: the arena as the node's server info describes it.
        location_ttl_s: how long a block's location is reused without asking the
            node (see :class:`KnownLocations`); 0 also leaves the node's published
            index unread, so every get asks the node.

    Raises:
        SharedArenaUnavailable: a file is missing or unreadable, or it is not the
            arena ``info`` names (another daemon's file at the same path).
    """

    def __init__(self, info: SharedArenaInfo, location_ttl_s: float = 0.0) -> None:
        self.info = info
        try:
            self._map = _map_readonly(info.arena_path)
            self.header = _check_header(self._map, info)
        except (OSError, ValueError) as exc:
            raise SharedArenaUnavailable(f"cannot map the arena {info.arena_path}: {exc}") from exc
        self._view = memoryview(self._map)
        self._address = address(self._view)  # where block copies start from (copy_into's alignment check)
        start = info.generations_offset + HEADER_BYTES
        self._generations = self._view[start : info.generations_offset + self.header.nbytes].cast("Q")
        self.stale = False  # set when the node answered for another arena, or retired its index (it restarted)
        # ttl 0 asks the node on every get (a client that wants a hung node noticed at once)
        self.published = _open_published(self._view, info) if location_ttl_s else None
        self.known = KnownLocations(location_ttl_s, published=self._find if self.published is not None else None)
        self._compiled = _compiled_reader(self.published, self._generations, self.header.granule, self._view)
        self.compiled = self._compiled is not None  # reads through the published index run in the compiled reader

    @property
    def arena_id(self) -> int:
        return self.header.arena_id

    def copy_into(self, location: SlotLocation, target: Target) -> None:
        """Copy the located block into ``target`` (exactly its length; regions span by span).

        Raises:
            ProtocolError: the location lies outside the arena (the node lied).
        """
        end = location.offset + location.length
        if end > self.info.capacity_bytes or len(target) != location.length:
            raise ProtocolError(f"block at {location.offset}+{location.length} lies outside the arena")
        if not isinstance(target, Regions):
            copy_into(target, self._view[location.offset : end], self._address + location.offset)
            return
        at = location.offset
        for view in target.views:
            copy_into(view, self._view[at : at + len(view)], self._address + at)
            at += len(view)

    ready = True  # mapped: nothing to ask the node before a read (a remote arena's PEER)

    def copy_all(self, located: Sequence[tuple[SlotLocation, Target]]) -> None:
        """:meth:`copy_into` of each located block into its target."""
        for location, target in located:
            self.copy_into(location, target)

    @property
    def verify_checksums(self) -> bool:
        """The node checks each block it serves: the reads it does not see are checked here."""
        return self.info.verify_checksums

    def copy_held_all(self, located: Sequence[tuple[SlotLocation, Target]]) -> list[bool]:
        """:meth:`copy_held` of each located block."""
        return [self.copy_held(location, target) for location, target in located]

    def unchanged_all(self, locations: Sequence[SlotLocation]) -> list[bool]:
        """:meth:`unchanged` of each location, read after every copy before it."""
        return [self.unchanged(location) for location in locations]

    def copy_held(self, location: SlotLocation, target: Target) -> bool:
        """Copy the located block into ``target`` if its slot's generation holds before the copy
        and after it: whether it did (False: the block was removed or its slot reused, and
        ``target`` holds nothing usable).

        Raises:
            ProtocolError: the location is not a slot of the arena (the node lied).
        """
        generations, index = self._generations, self._slot_index(location.offset)
        if generations[index] != location.generation:
            return False  # gone already: no copy, the target as it was
        self.copy_into(location, target)
        return generations[index] == location.generation

    def trusted_now(self) -> int | None:
        """Now (monotonic nanoseconds) when the node's heartbeat vouches for its arena, which a read
        that takes no connection (and so no liveness check of one) needs; None: ask the node. A node
        killed or hung stops beating, and within the beat limit (1 s) its arena is read no more; one
        that shut down retired its table, which marks the mapping stale (its next arena is another
        file); without a published index, never."""
        if self.published is None:
            return None
        reader = self.published[0]
        if not reader.live:
            self.stale = True
            return None
        now = time.monotonic_ns()
        return now if now < reader.trusted_until() else None  # past it: killed or hung, its answer says more

    def read_published(self, namespace: str, block: bytes, target: Target, verify: bool, now: int) -> bool | None:
        """A block read through the published index in one compiled call, at ``now``
        (:meth:`trusted_now`): found, its generation checked before and after its copy into
        ``target``, its read marked. Whether it was copied (False: removed, its slot reused, or
        ``target`` not its length; ask the node); None: no compiled reader here, or the block is not
        in the table (try :attr:`known`, then the node).

        Raises:
            ProtocolError: the table names a place that is not a slot of the arena.
        """
        if self._compiled is None:
            return None
        assert self.published is not None  # a compiled reader reads a published table
        low, high = self.published[0].digest(namespace, block)
        spans = target.views if isinstance(target, Regions) else target  # regions: copied span by span
        try:
            found = self._compiled.read(low, high, spans, now >> MARK_SHIFT)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc
        if found is None:
            return None
        return found[5] and (not verify or checksum_of(target) == found[3])

    def _find(self, namespace: str, block: bytes) -> tuple[SlotLocation, int] | None:
        """The block's location in the node's published index, its read marked; None: ask the node."""
        assert self.published is not None
        reader, marks = self.published
        entry = reader.find(namespace, block)
        if entry is None:
            return None
        now = self.trusted_now()
        if now is None:
            return None
        index, offset, length, checksum, generation = entry
        marks.mark(index, now >> MARK_SHIFT)
        location = SlotLocation(offset, length, generation)
        # Kept like an answer of the node: re-reads within the ttl are cheaper still (the node hears of
        # them as of one read a ttl, as when it is asked once a ttl), but not past the table's trust.
        self.known.remember(namespace, block, location, checksum, until=reader.trusted_until() / 1e9)
        return location, checksum

    def unchanged(self, location: SlotLocation) -> bool:
        """Whether the block's slot is still in the generation it was located in."""
        return int(self._generations[self._slot_index(location.offset)]) == location.generation

    def _slot_index(self, offset: int) -> int:
        try:
            return self.header.index(offset)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc


def open_shared_arena(info: SharedArenaInfo | None, transport: str, location_ttl_s: float = 0.0) -> MappedArena | None:
    """The arena to read from under the ``transport`` setting; None: use tcp.

    ``auto`` maps the arena when the node offers one that is readable here, and
    quietly uses tcp otherwise; ``tcp`` never maps it.

    Raises:
        SharedArenaUnavailable: ``shm`` was required and the arena cannot be mapped.
    """
    if transport == "tcp":
        return None
    if platform.machine().lower() not in _ORDERED_LOADS:
        if transport == "shm":
            raise SharedArenaUnavailable(
                f"the shm transport needs x86-64's load ordering; this is {platform.machine()}"
            )
        return None
    if info is None:
        if transport == "shm":
            raise SharedArenaUnavailable("the node offers no shared arena (shm transport)")
        return None
    try:
        return MappedArena(info, location_ttl_s)
    except SharedArenaUnavailable:
        if transport == "shm":
            raise
        return None


def _open_published(arena: memoryview, info: SharedArenaInfo) -> tuple[PublishedReader, MarkWriter] | None:
    """The node's published index in the mapped arena and its hit marks mapped writable; None: not offered or unusable.

    Without the marks (no write permission, say) the table is not used either: reads
    through it would be lost to the node's eviction order.
    """
    if not info.index_offset or not info.hit_marks_path:
        return None
    try:
        reader = PublishedReader(arena[info.index_offset :])
        if reader.header.arena_id != info.arena_id or info.index_offset < info.capacity_bytes:
            return None
        fd = os.open(info.hit_marks_path, os.O_RDWR | os.O_CLOEXEC)
        try:
            marks = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return reader, MarkWriter(memoryview(marks), reader.header.entries)
    except (OSError, ValueError):
        return None


def _compiled_reader(
    published: tuple[PublishedReader, MarkWriter] | None,
    generations: memoryview,
    granule: int,
    arena: memoryview,
) -> _arena_reader.ArenaReader | None:
    """The compiled reader of the node's published index, where it was built."""
    if _arena_reader is None or published is None:
        return None
    reader, marks = published
    entries, probe_limit, vector = reader.header.entries, reader.header.probe_limit, copy_route() is not None
    return _arena_reader.ArenaReader(
        reader.words, generations, arena, marks.words, entries, probe_limit, granule, marks.first, marks.shift, vector
    )


def _map_readonly(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)  # the mapping keeps the memory; no descriptor stays open


def _check_header(arena: mmap.mmap, info: SharedArenaInfo) -> GenerationsHeader:
    """The generations header of the mapped file, checked against what the node announced.

    Raises:
        ValueError: the file is not the node's arena (another daemon's at the same
            path, e.g. on another host) or is too small for what was announced.
    """
    start = info.generations_offset
    if info.capacity_bytes > start or len(arena) < start + HEADER_BYTES:
        raise ValueError(f"{info.arena_path} has no slot generations at offset {start}")
    header = decode_header(arena[start : start + HEADER_BYTES])
    if header.arena_id != info.arena_id:
        raise ValueError(f"{info.arena_path} is arena {header.arena_id:#x}, not {info.arena_id:#x}")
    if len(arena) < start + header.nbytes or header.count * header.granule < info.capacity_bytes:
        raise ValueError(f"{info.arena_path} is too small for its slot generations")
    return header
