"""The node's one-sided peer: its arena registered with a NIXL agent, which clients read and write.

At start the whole arena file's mapping (the blocks, then the slot generations) is registered
once with an agent named after the arena (a restarted node's arena, and agent, is a new one).
A client that proved the cluster's token asks for the agent's metadata and where the arena lies
(the ``PEER`` op); from then on it moves block bytes itself: LOCATE then READ for a get,
RESERVE then WRITE then COMMIT for a put (:mod:`kvpool_server.data.leases`). The node's CPU
allocates, publishes and checks generations; it does not touch the bytes.

The agent runs without NIXL's progress thread (which spins a core); one thread of ours
progresses it instead, often for a while after a client announced itself or reserved slots
(UCX needs the target's progress to set up a connection, and to serve reads it emulates over
plain TCP), and rarely otherwise: an idle node costs next to nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from kvpool_client.core.channels.copy import address
from kvpool_client.core.channels.nixl_agent import Agent
from kvpool_client.core.wire import PeerResponse

log = logging.getLogger("kvpool.data")

_BUSY_INTERVAL_S = 0.001  # progress this often while transfers are expected
_IDLE_INTERVAL_S = 0.05  # and this often otherwise
_BUSY_FOR_S = 0.2  # how long a client's request keeps the progress busy


@dataclass(frozen=True, slots=True)
class RegisteredArena:
    """The arena's mapping as registered: ``size`` bytes from ``base`` in this process."""

    arena_id: int
    base: int
    size: int
    generations_offset: int


class NixlPeer:
    """The node's NIXL agent, its registered arena and the thread that progresses it.

    Args:
        mapping: the arena file's whole mapping (blocks, then generations), writable.
        arena_id, generations_offset: as the shared arena's info says.

    Raises:
        NixlUnavailable: (from :meth:`start`) NIXL is missing here or cannot register the arena.
    """

    def __init__(self, mapping: memoryview, arena_id: int, generations_offset: int) -> None:
        self.agent_name = f"kvpool-arena-{arena_id:016x}"
        self.arena = RegisteredArena(arena_id, address(mapping), len(mapping), generations_offset)
        self._agent: Agent | None = None
        self._metadata = b""
        self._busy_until = 0.0  # monotonic; written by any session, read by the progress thread
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._progress, name="kvpool-nixl", daemon=True)

    def start(self) -> None:
        """Make the agent, register the arena and start progressing."""
        agent = self._agent = Agent(self.agent_name)
        agent.register(self.arena.base, self.arena.size)
        self._metadata = agent.metadata()
        self._thread.start()
        log.info("nixl peer ready", extra={"agent": self.agent_name, "registered_bytes": self.arena.size})

    def answer(self, request_id: int) -> PeerResponse:
        """The PEER answer: the agent's metadata and the registered arena; progress often for a while."""
        self.expect_transfers()
        a = self.arena
        return PeerResponse(request_id, a.arena_id, a.base, a.size, a.generations_offset, self._metadata)

    def expect_transfers(self) -> None:
        """A client is about to read or write: progress often for a while."""
        self._busy_until = time.monotonic() + _BUSY_FOR_S

    def stop(self, timeout: float) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _progress(self) -> None:
        agent = self._agent
        assert agent is not None
        while True:
            busy = time.monotonic() < self._busy_until
            if self._stopping.wait(_BUSY_INTERVAL_S if busy else _IDLE_INTERVAL_S):
                return
            try:
                agent.progress()
            except Exception:  # a bug or a broken backend: say so, keep the node serving
                log.exception("nixl progress failed")
                self._stopping.wait(1.0)
