"""Page allocation and the local prefix cache, in vLLM v1's block-pool style.

Every page is either in use (reference count > 0) or in the free queue. The free
queue is in eviction order: blank pages first, then cached pages least recently
released first. A cached page keeps its block hash while it waits in the queue, so
a later request with the same prefix takes it back (a hit); allocation pops from the
head, and a popped cached page is evicted: its hash leaves the cache and the caller
gets it back as an :class:`Evicted` record (to save it to the pool first, say).

With ``enabled=False`` nothing is ever cached: the no-prefix-cache baseline.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Evicted:
    """A cached block whose page was just taken for something else."""

    page: int
    block_hash: bytes
    in_pool: bool  # already stored in the pool: no need to save it


@dataclass(frozen=True, slots=True)
class Allocation:
    pages: list[int]
    evicted: list[Evicted]


class OutOfPages(Exception):
    """Fewer free pages than asked for; nothing was allocated."""


class PrefixCache:
    """``num_pages`` pages, their reference counts and the hash -> page map of cached blocks.

    Args:
        num_pages: the page budget.
        enabled: cache blocks by hash (False: plain allocation, no reuse).
    """

    def __init__(self, num_pages: int, enabled: bool = True) -> None:
        self.num_pages = num_pages
        self.enabled = enabled
        self._refs = [0] * num_pages
        self._hash: list[bytes | None] = [None] * num_pages
        self._in_pool = [False] * num_pages
        self._cached: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_pages))

    @property
    def free_pages(self) -> int:
        """Pages an allocation can take now (blank or cached but unused)."""
        return len(self._free)

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)

    def match(self, hashes: Sequence[bytes]) -> list[int]:
        """Pages of the leading ``hashes`` that are cached (no reference taken)."""
        pages: list[int] = []
        if not self.enabled:
            return pages
        for block_hash in hashes:
            page = self._cached.get(block_hash)
            if page is None:
                break
            pages.append(page)
        return pages

    def acquire(self, pages: Iterable[int]) -> None:
        """Take a reference on cached pages (a hit); they leave the free queue."""
        for page in pages:
            if self._refs[page] == 0:
                del self._free[page]
            self._refs[page] += 1

    def allocate(self, count: int) -> Allocation:
        """Take ``count`` pages from the head of the free queue, evicting the blocks they cached.

        Raises:
            OutOfPages: fewer than ``count`` free pages.
        """
        if count > len(self._free):
            raise OutOfPages(f"asked for {count} pages, {len(self._free)} free")
        pages: list[int] = []
        evicted: list[Evicted] = []
        for _ in range(count):
            page, _ = self._free.popitem(last=False)
            block_hash = self._hash[page]
            if block_hash is not None:
                del self._cached[block_hash]
                evicted.append(Evicted(page, block_hash, self._in_pool[page]))
                self._hash[page] = None
            self._in_pool[page] = False
            self._refs[page] = 1
            pages.append(page)
        return Allocation(pages, evicted)

    def register(self, page: int, block_hash: bytes, in_pool: bool = False) -> bool:
        """Record that in-use ``page`` holds the block ``block_hash``; False if another page already does."""
        if not self.enabled or block_hash in self._cached or self._hash[page] is not None:
            return False
        self._cached[block_hash] = page
        self._hash[page] = block_hash
        self._in_pool[page] = in_pool
        return True

    def mark_in_pool(self, pages: Iterable[int]) -> None:
        """The blocks in ``pages`` are now stored in the pool."""
        for page in pages:
            self._in_pool[page] = True

    def block_hash(self, page: int) -> bytes | None:
        return self._hash[page]

    def in_pool(self, page: int) -> bool:
        return self._in_pool[page]

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference on each of ``pages``, given head first.

        Pages are queued tail first so a chain's tail is evicted before its head
        (a head without its tail is still useful). Blank pages go to the queue's
        head: they are reused before any cached block is evicted.
        """
        for page in reversed(pages):
            self._refs[page] -= 1
            if self._refs[page] > 0:
                continue
            self._free[page] = None
            if self._hash[page] is None:
                self._free.move_to_end(page, last=False)

    def evict_all(self) -> list[Evicted]:
        """Evict every cached block not in use (what memory pressure would do eventually)."""
        victims = [page for page in self._free if self._hash[page] is not None]
        out: list[Evicted] = []
        for page in victims:
            block_hash = self._hash[page]
            assert block_hash is not None
            del self._cached[block_hash]
            out.append(Evicted(page, block_hash, self._in_pool[page]))
            self._hash[page] = None
            self._in_pool[page] = False
            self._free.move_to_end(page, last=False)
        return out

    def check_idle(self) -> None:
        """Assert no page is in use and the queue holds every page (the end-of-test leak check)."""
        leaked = [p for p, r in enumerate(self._refs) if r]
        if leaked or len(self._free) != self.num_pages:
            raise AssertionError(f"pages still referenced: {leaked[:10]} ({len(self._free)} free)")
