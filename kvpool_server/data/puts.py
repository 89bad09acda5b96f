"""What the daemon does with a put's blocks: a slot each within the admission budget, the commit, the reply.

A block takes its slot only once its first bytes are here (the session waits for them) and
only while the slots of blocks still arriving, over every connection, stay under the
admission budget: past it the block is refused ``OVERLOADED`` and its bytes go to the shared
sink. Its budget comes back once its bytes are in, or are not coming. Nothing here touches a
socket: :meth:`Puts.store` is one procedure that yields what it waits for, and the session's
readiness callback and its coroutine both drive it, as both take their answers to reads from
:mod:`kvpool_server.data.answers`.
"""

from __future__ import annotations

from collections.abc import Generator

from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.wire import Op, PutRequest, ReserveRequest, StatusResponse, encode
from kvpool_client.core.wire.one_key import encode_put_one_answer
from kvpool_server.data.admission import Admission
from kvpool_server.data.answers import Reply
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.store import BlockStore

Outcome = BlockEntry | ErrorCode  # a block's reserved slot, or why it has none
# A block takes its slot once this many of its first bytes are here (all of a smaller one): a
# peer that announces more than it sends evicts nothing for what it did not send, and one
# trickling a byte at a time reaches its deadline first.
FIRST_BYTES = 512


class Puts:
    """Stores the blocks of one connection's puts in a :class:`BlockStore`."""

    def __init__(self, store: BlockStore, admission: Admission, counters: Counters) -> None:
        self._store = store
        self._admission = admission
        self._counters = counters
        self.tenant = ""  # the connection's tenant, when its rights are limited: it holds a share of the budget

    @property
    def write_through(self) -> bool:
        """A put is acknowledged only once its blocks are on SSD (see :meth:`BlockStore.persist`)."""
        return self._store.write_through

    def store(
        self, request: PutRequest, refusal: ErrorCode | None, outcomes: list[Outcome], *, arrived: bool = False
    ) -> Generator[int | memoryview, None, None]:
        """Store a put's blocks as their bytes arrive, whichever driver moves the bytes.

        Yields what it waits for, in order: a count (wait until that many payload bytes are
        buffered: a block takes its slot only once its first bytes are here), or a buffer to
        fill with the next payload bytes (a block's slot, or a piece of the shared sink for a
        block refused). Appends each block's outcome to ``outcomes``; when it ends, the stored
        blocks are committed (and, on a write-through node, still pinned for :meth:`persist`).
        A put cut short, by an error thrown in or by closing the generator, aborts its
        reservations: nothing half-written ever becomes readable.

        Args:
            request: the put, its head read.
            refusal: why every block is refused (``DRAINING`` while the node drains,
                ``PERMISSION_DENIED`` for another tenant's namespace); None: they are stored.
            outcomes: an empty list, filled as the blocks are taken.
            arrived: the whole payload is buffered already: no count is yielded.
        """
        try:
            for h, length, depth in zip(request.hashes, request.lengths, depths(request), strict=True):
                if refusal is None and length > 0 and not arrived:
                    yield min(length, FIRST_BYTES)
                outcome = self.admit((request.namespace, h), length, depth) if refusal is None else refusal
                outcomes.append(outcome)
                if not isinstance(outcome, BlockEntry):
                    yield from self.sink(length)
                    continue
                try:
                    yield self._store.slot(outcome)
                finally:
                    self.admitted(outcome)  # its bytes are in, or not coming
        except BaseException:
            for outcome in outcomes:
                if isinstance(outcome, BlockEntry):
                    self._store.abort(outcome)
            raise
        # The chain's tail goes first: LRU then evicts tails before heads (a head without its
        # tail is still a usable prefix; a tail without its head is not).
        for outcome in reversed(outcomes):
            if isinstance(outcome, BlockEntry):
                self._store.commit(outcome)

    async def persist(self, outcomes: list[Outcome]) -> None:
        """Write a put's committed blocks through to SSD (a write-through node), then unpin them."""
        stored = [o for o in outcomes if isinstance(o, BlockEntry)]
        if stored:
            await self._store.persist(stored)

    def sink(self, nbytes: int) -> list[memoryview]:
        """Where ``nbytes`` of refused payload are received and dropped, piece by piece: the one
        sink every connection shares."""
        sink = self._admission.sink
        return [sink[: min(len(sink), nbytes - start)] for start in range(0, nbytes, len(sink))]

    def admit(self, key: StoreKey, length: int, depth: int) -> Outcome:
        """A slot for one block whose bytes are on their way, taken from the admission budget
        until :meth:`admitted`."""
        slot = self._store.slot_size(length)
        if slot is None:
            return self._store.reserve(key, length, depth)  # refused whatever the budget: says why
        if not self._admission.take(slot, self.tenant):
            return ErrorCode.OVERLOADED
        outcome = self._store.reserve(key, length, depth)
        if not isinstance(outcome, BlockEntry):
            self._admission.give(slot, self.tenant)
        return outcome

    def admitted(self, entry: BlockEntry) -> None:
        """A reserved block's bytes are in, or not coming: its slot leaves the admission budget."""
        self._admission.give(entry.slot_size, self.tenant)

    def reply(self, request: PutRequest, outcomes: list[Outcome]) -> Reply:
        """The put's answer: OK for each block stored, else why not."""
        statuses = [int(ErrorCode.OK if isinstance(o, BlockEntry) else o) for o in outcomes]
        self._counters.add("bytes_in", sum(request.lengths))
        if ErrorCode.ALREADY_EXISTS in outcomes:  # put-if-absent: received, and dropped
            self._counters.add("puts_duplicate", outcomes.count(ErrorCode.ALREADY_EXISTS))
        if len(statuses) == 1:
            return [encode_put_one_answer(request.request_id, statuses[0])]
        return [encode(StatusResponse(request.request_id, Op.PUT, statuses))]


def depths(request: PutRequest | ReserveRequest) -> list[int]:
    """Each block's chain depth; 0 where the client did not say."""
    return request.depths or [0] * len(request.hashes)
