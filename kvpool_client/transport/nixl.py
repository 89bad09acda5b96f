"""The ``nixl`` transport: a client reads and writes a node's arena one-sided, the node only allocates.

A node with ``nixl_enabled`` registered its whole arena file (blocks, then slot generations)
with a NIXL agent (:mod:`kvpool_server.data.nixl`). A client asks for that agent over its
data connection once (``PEER``, so only a client that proved the token learns it) and then:

- gets a batch with one LOCATE (offset, length, checksum, generation per block), one READ of
  every block into the caller's buffers, then one READ of the blocks' slot generations. A
  generation that changed means the slot was freed (and maybe reused) during the read: that
  block is read again over the wire, never returned torn. These are the same-node reader's
  rules (:mod:`kvpool_client.transport.shm`), with the arena read through NIXL instead of a
  mapping: the exchange that applies them (:func:`kvpool_client.exchange.locate_shared`) is
  one for both;
- puts a batch with one RESERVE (a slot per block under a lease), one WRITE of every block,
  then one COMMIT with the blocks' checksums (:mod:`kvpool_server.data.leases`).

A READ or WRITE needs this side's memory registered too. Buffers inside a region registered
with :meth:`LocalAgent.register` (an engine's KV cache, a staging area) are read and written
in place; others go through a registered staging buffer, one copy more. A node's answer
for another arena (it restarted) marks the arena stale: the client asks for the new agent.
"""

from __future__ import annotations

import itertools
import os
import threading
from bisect import bisect_right
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor

from kvpool_client.buffers import Regions, Target
from kvpool_client.core.channels.copy import address, copy_into
from kvpool_client.core.channels.nixl_agent import Agent, NixlUnavailable, Span
from kvpool_client.core.errors import NodeUnavailable, ProtocolError
from kvpool_client.core.wire import PeerResponse
from kvpool_client.core.wire.generations import HEADER_BYTES, GenerationsHeader, decode_header
from kvpool_client.transport.shm import KnownLocations, SlotLocation

_NAMES = itertools.count(1)
_STAGING_MIN = 4 << 20


class LocalAgent:
    """This client's NIXL agent, made at first use, the regions registered with it and its staging buffer.

    One per client, shared by every node; transfers are serialised (a NIXL agent is
    driven by one thread at a time). Regions may be registered before NIXL is used (or
    where it cannot be): they are registered with the agent once it is made.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.lock = threading.Lock()
        # Where an asyncio client's transfers run, off its event loop: one thread is enough,
        # as the lock lets one transfer run at a time.
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="kvpool-nixl")
        self._agent: Agent | None = None
        self._failure: NixlUnavailable | None = None
        self._regions: dict[int, tuple[int, int, memoryview, object]] = {}  # address -> (address, end, view, handle)
        self._starts: list[int] = []  # the regions' addresses, sorted: a span's region is found by bisection
        self._staging = memoryview(bytearray(0))
        self._staging_handle: object = None

    @property
    def agent(self) -> Agent:
        """The agent, made (and the regions registered) at first use.

        Raises:
            NixlUnavailable: NIXL cannot be used here (and will not be tried again).
        """
        agent = self._agent
        if agent is not None:
            return agent
        with self.lock:
            if self._failure is not None:
                raise self._failure
            if self._agent is None:
                try:
                    self._agent = Agent(f"kvpool-client-{os.getpid()}-{next(_NAMES)}")
                except NixlUnavailable as exc:
                    self._failure = exc
                    raise
                for start, end, view, _ in list(self._regions.values()):
                    self._regions[start] = (start, end, view, self._agent.register(start, end - start))
            return self._agent

    def available(self, required: bool) -> bool:
        """Whether NIXL can be used here; ``required`` raises instead of False.

        Raises:
            NixlUnavailable: ``required`` and NIXL cannot be used here.
        """
        try:
            return self.agent is not None
        except NixlUnavailable:
            if required:
                raise
            return False

    def register(self, buffer: memoryview) -> None:
        """Keep ``buffer`` registered (and alive) until :meth:`unregister`: gets and puts of
        blocks inside it move straight between it and the node."""
        start = address(buffer)
        with self.lock:
            if start not in self._regions:
                handle = None if self._agent is None else self._agent.register(start, buffer.nbytes)
                self._regions[start] = (start, start + buffer.nbytes, buffer, handle)
                self._starts = sorted(self._regions)

    def unregister(self, buffer: memoryview) -> None:
        with self.lock:
            region = self._regions.pop(address(buffer), None)
            self._starts = sorted(self._regions)
            if region is not None and self._agent is not None and region[3] is not None:
                self._agent.deregister(region[3])

    def registered(self, buffers: Sequence[Target]) -> list[Span] | None:
        """The spans of ``buffers``, in order, when every one lies inside a registered region; None otherwise."""
        starts, regions, spans = self._starts, self._regions, []
        for buffer in buffers:
            for view in buffer.views if isinstance(buffer, Regions) else (buffer,):
                start, length = address(view), view.nbytes
                at = bisect_right(starts, start)  # the last region starting at or before the span
                if not at or start + length > regions[starts[at - 1]][1]:
                    return None
                spans.append((start, length))
        return spans

    def close(self) -> None:
        """Let the transfer thread go once it is idle."""
        self.thread.shutdown(wait=False)

    def staging(self, nbytes: int) -> memoryview:
        """A registered buffer of at least ``nbytes`` (the lock held): for blocks outside every region."""
        agent = self._agent
        assert agent is not None  # a remote arena is connected through the agent first
        if len(self._staging) < nbytes:
            if self._staging_handle is not None:
                agent.deregister(self._staging_handle)
            self._staging = memoryview(bytearray(max(nbytes, _STAGING_MIN, 2 * len(self._staging))))
            self._staging_handle = agent.register(address(self._staging), len(self._staging))
        return self._staging


class RemoteArena:
    """A node's arena reached one-sided through NIXL: read and written by offset, checked by generation.

    Made without I/O; :attr:`ready` once :meth:`connect` took the node's PEER answer.
    """

    def __init__(self, local: LocalAgent, location_ttl_s: float = 0.0, verify_checksums: bool = False) -> None:
        self._local = local
        self.known = KnownLocations(location_ttl_s)  # places from the node's answers, reused for the ttl
        self.verify_checksums = verify_checksums  # the node checks blocks it serves: check the reads it does not see
        self.stale = False  # set when the node answered for another arena (it restarted) or a transfer failed
        self.ready = False
        self.arena_id = 0
        self._peer = ""
        self._base = 0
        self._blocks_end = 0  # blocks lie in [0, this) of the registered span
        self._generations_at = 0  # the first counter's address in the node's process
        self._header: GenerationsHeader | None = None

    @property
    def thread(self) -> Executor:
        """Where an asyncio client runs this arena's transfers."""
        return self._local.thread

    def connect(self, answer: PeerResponse) -> None:
        """Know the node's agent, then read and check its generations' header.

        Raises:
            NixlUnavailable: the node's metadata is not a NIXL agent's.
            ProtocolError: the registered span has no generations of ``answer``'s arena.
            NodeUnavailable: the header could not be read.
        """
        if answer.generations_offset + HEADER_BYTES > answer.size:
            raise ProtocolError("the node's registered arena has no room for its slot generations")
        agent = self._local.agent
        with self._local.lock:
            self._peer = agent.add_peer(answer.agent)
        self._base, self._blocks_end = answer.base, answer.generations_offset
        raw = bytearray(HEADER_BYTES)
        self._read([(answer.base + answer.generations_offset, HEADER_BYTES)], [memoryview(raw)])
        try:
            header = decode_header(bytes(raw))
        except ValueError as exc:
            raise ProtocolError(f"the node's registered arena: {exc}") from exc
        if header.arena_id != answer.arena_id or answer.generations_offset + header.nbytes > answer.size:
            raise ProtocolError(f"the node registered arena {header.arena_id:#x}, not {answer.arena_id:#x}")
        self._header, self.arena_id = header, answer.arena_id
        self._generations_at = answer.base + answer.generations_offset + HEADER_BYTES
        self.ready = True

    def close(self) -> None:
        """Forget the node's agent and what it said (it restarted, or the client closes)."""
        self.known = KnownLocations(0.0)
        if self._peer:
            agent = self._local.agent
            with self._local.lock:
                agent.remove_peer(self._peer)
            self._peer = ""
        self.ready = False

    def copy_all(self, located: Sequence[tuple[SlotLocation, Target]]) -> None:
        """Read each located block into its target: one READ for all of them.

        Raises:
            ProtocolError: a location lies outside the registered arena (the node lied).
            NodeUnavailable: the READ failed (the node is gone): the targets may hold part of it.
        """
        remote = [self._span(location.offset, location.length) for location, _ in located]
        self._read(remote, [target for _, target in located])

    def copy_held_all(self, located: Sequence[tuple[SlotLocation, Target]]) -> list[bool]:
        """Read blocks from known places: whether each was copied and its slot held meanwhile.

        Three READs: the generations (a block gone costs no copy: none is copied then, the
        targets stay as they were), the blocks, the generations again. A failed READ copies
        nothing usable: the node is asked next, and its connection tells what happened.
        """
        locations = [location for location, _ in located]
        try:
            if not all(self.unchanged_all(locations)):
                return [False] * len(located)
            self.copy_all(located)
            return self.unchanged_all(locations)
        except NodeUnavailable:
            self.stale = True
            return [False] * len(located)

    def unchanged_all(self, locations: Sequence[SlotLocation]) -> list[bool]:
        """Whether each block's slot is still in the generation it was located in: one READ of
        the counters (into the staging buffer), after every READ before it completed."""
        if not locations:
            return []
        remote = [(self._generations_at + 8 * self._slot_index(location.offset), 8) for location in locations]
        local = self._local
        with local.lock:
            staging = local.staging(8 * len(remote))
            local.agent.transfer(
                "READ", _runs(address(staging), [8] * len(remote)), remote, self._peer, local.timeout_s
            )
            with staging[: 8 * len(remote)].cast("Q") as now:
                return [now[i] == location.generation for i, location in enumerate(locations)]

    def write_all(self, placed: Sequence[tuple[int, Target]]) -> None:
        """Write each block into its reserved slot (offset): one WRITE for all of them.

        Raises:
            ProtocolError: an offset lies outside the registered arena (the node lied).
            NodeUnavailable: the WRITE failed (the node is gone).
        """
        self._move("WRITE", [self._span(offset, len(block)) for offset, block in placed], [b for _, b in placed])

    def _read(self, remote: list[Span], targets: Sequence[Target]) -> None:
        """READ ``remote`` spans (one per target, in order) into ``targets``."""
        self._move("READ", remote, targets)

    def _move(self, op: str, remote: list[Span], buffers: Sequence[Target]) -> None:
        """One transfer between ``buffers`` and ``remote`` spans (one per buffer, in order): in place
        when every buffer lies in registered memory, else through the staging buffer (copied into
        it before a WRITE, out of it after a READ)."""
        local = self._local
        with local.lock:
            spans = local.registered(buffers)
            if spans is not None:
                if any(isinstance(b, Regions) for b in buffers):  # one remote span per local one
                    remote = _split(remote, [list(b.views) if isinstance(b, Regions) else [b] for b in buffers])
                local.agent.transfer(op, spans, remote, self._peer, local.timeout_s)
                return
            staging = local.staging(sum(length for _, length in remote))
            pieces, at = [], 0
            for buffer in buffers:
                for view in buffer.views if isinstance(buffer, Regions) else (buffer,):
                    pieces.append((staging[at : at + view.nbytes], view))
                    at += view.nbytes
            if op == "WRITE":
                for staged, view in pieces:
                    copy_into(staged, view)
            local.agent.transfer(
                op, _runs(address(staging), [n for _, n in remote]), remote, self._peer, local.timeout_s
            )
            if op == "READ":
                for staged, view in pieces:
                    copy_into(view, staged)

    def _span(self, offset: int, length: int) -> Span:
        if offset < 0 or offset + length > self._blocks_end:
            raise ProtocolError(f"block at {offset}+{length} lies outside the arena")
        return self._base + offset, length

    def _slot_index(self, offset: int) -> int:
        assert self._header is not None
        try:
            return self._header.index(offset)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from exc


def _runs(start: int, lengths: Sequence[int]) -> list[Span]:
    """Consecutive spans of ``lengths`` from ``start``."""
    spans, at = [], start
    for length in lengths:
        spans.append((at, length))
        at += length
    return spans


def _split(remote: list[Span], views: list[list[memoryview]]) -> list[Span]:
    """Each remote span cut where its target's views are, so that local and remote spans pair up."""
    spans = []
    for (start, _), parts in zip(remote, views, strict=True):
        spans.extend(_runs(start, [part.nbytes for part in parts]))
    return spans
