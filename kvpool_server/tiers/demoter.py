"""Copies cold DRAM blocks to SSD before DRAM evicts them; writes SSD tombstones.

Eviction happens inside a put, under the DRAM tier's lock: there is no time to
write a block to disk then. So one background thread keeps the coldest share of
every DRAM size class already on SSD (a copy, the block stays in DRAM and is
readable all along); evicting such a block drops only the DRAM copy. A block
evicted before the demoter reached it is counted as ``dram_evictions_lost``.

The same thread writes the tombstones of deleted keys, so every SSD write comes
from one thread in order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from kvpool_server.index import StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.ssd import SsdTier
from kvpool_server.tiers.store import BlockStore

log = logging.getLogger("kvpool.ssd")

_BATCH = 16  # blocks pinned per pass: bounds what a pass holds back from eviction
_FLUSH_BATCH = 256


def count_lost_evictions(ssd: SsdTier, counters: Counters) -> Callable[[StoreKey], None]:
    """The DRAM tier's ``on_evict`` hook: counts ``dram_evictions_lost``.

    A block evicted from DRAM that SSD does not hold is gone from this node: the
    demoter had not reached it. Called under the DRAM tier's lock, so it does one
    dictionary read and no I/O.
    """

    def on_evict(key: StoreKey) -> None:
        if not ssd.contains(key):
            counters.add("dram_evictions_lost")

    return on_evict


class Demoter:
    """The SSD writer thread of a :class:`BlockStore` that has an SSD tier.

    Args:
        store: the store; ``store.ssd`` must be set.
        share: the coldest fraction of each DRAM size class to keep on SSD.
        idle_s: how long to sleep when a pass found nothing to do.
    """

    def __init__(self, store: BlockStore, share: float, idle_s: float = 0.05) -> None:
        if store.ssd is None:
            raise ValueError("the store has no SSD tier")
        self._store = store
        self._share = share
        self._idle_s = idle_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvpool-demoter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, flush_within_s: float = 0.0) -> int:
        """Stop the thread; with ``flush_within_s`` > 0, first write every DRAM block down.

        A flush lets a restart start warm. It writes the coldest blocks first, so
        the hottest are the most recent on SSD, and stops at the deadline.

        Returns:
            Blocks written by the flush.
        """
        self._stop.set()
        if self._thread.is_alive():  # a pass in flight finishes first: at most _BATCH writes
            self._thread.join()
        deadline = time.monotonic() + flush_within_s
        flushed = 0
        while time.monotonic() < deadline:
            written = self._pass(1.0, _FLUSH_BATCH)
            if not written:
                break
            flushed += written
        self._bury_graves()
        if flush_within_s > 0:
            log.info("DRAM flushed to SSD", extra={"blocks": flushed})
        return flushed

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self._bury_graves() + self._pass(self._share, _BATCH)
            except Exception:  # the thread must outlive any one bad pass
                log.exception("demotion pass failed")
                worked = 0
            if not worked:
                self._stop.wait(self._idle_s)

    def _pass(self, share: float, limit: int) -> int:
        """Copy up to ``limit`` cold blocks that SSD lacks; returns how many were written."""
        ssd, dram = self._store.ssd, self._store.dram
        assert ssd is not None
        if ssd.failure() is not None:
            return 0
        entries = dram.pin_coldest(share, ssd.contains, limit)
        try:
            return sum(self._store.write_down(entry) for entry in entries)
        finally:
            for entry in entries:
                dram.release(entry)

    def _bury_graves(self) -> int:
        ssd = self._store.ssd
        assert ssd is not None
        buried = 0
        while True:
            try:
                key = self._store.graves.get_nowait()
            except queue.Empty:
                return buried
            ssd.bury(key)
            buried += 1
