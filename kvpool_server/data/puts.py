"""What the daemon does with a put's blocks: a slot each within the admission budget, the commit, the reply.

A block takes its slot only once its first bytes are here (the session waits for them) and
only while the slots of blocks still arriving, over every connection, stay under the
admission budget: past it the block is refused ``OVERLOADED`` and its bytes go to the shared
sink. Its budget comes back once its bytes are in, or are not coming. Nothing here touches a
socket, so the session's readiness callback and its coroutine store puts alike, as
:mod:`kvpool_server.data.answers` answers reads.
"""

from __future__ import annotations

from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.wire import Op, PutRequest, StatusResponse, encode
from kvpool_client.core.wire.one_key import encode_put_one_answer
from kvpool_server.data.admission import Admission
from kvpool_server.data.answers import Reply
from kvpool_server.index import BlockEntry, StoreKey
from kvpool_server.stats import Counters
from kvpool_server.tiers.store import BlockStore

Outcome = BlockEntry | ErrorCode  # a block's reserved slot, or why it has none


class Puts:
    """Stores the blocks of one connection's puts in a :class:`BlockStore`'s DRAM tier."""

    def __init__(self, store: BlockStore, admission: Admission, counters: Counters) -> None:
        self._store = store
        self._tier = store.dram  # writes go to DRAM
        self._admission = admission
        self._counters = counters

    @property
    def write_through(self) -> bool:
        """A put is acknowledged only once its blocks are on SSD (see :meth:`BlockStore.persist`)."""
        return self._store.write_through

    def sink(self, nbytes: int) -> list[memoryview]:
        """Where ``nbytes`` of refused payload are received and dropped, piece by piece: the one
        sink every connection shares."""
        sink = self._admission.sink
        return [sink[: min(len(sink), nbytes - start)] for start in range(0, nbytes, len(sink))]

    def admit(self, key: StoreKey, length: int, depth: int) -> Outcome:
        """A slot for one block whose bytes are next on the wire, taken from the admission budget."""
        slot = self._tier.slot_size(length)
        if slot is None:
            return self._tier.reserve(key, length, depth)  # refused whatever the budget: says why
        if not self._admission.take(slot):
            return ErrorCode.OVERLOADED
        outcome = self._tier.reserve(key, length, depth)
        if not isinstance(outcome, BlockEntry):
            self._admission.give(slot)
        return outcome

    def slot(self, entry: BlockEntry) -> memoryview:
        """The reserved slot a block's bytes go into."""
        return self._tier.view(entry)

    def received(self, entry: BlockEntry) -> None:
        """The block's bytes are in, or will not come: its budget goes back."""
        self._admission.give(entry.slot_size)

    def commit(self, outcomes: list[Outcome]) -> list[BlockEntry]:
        """Make a put's stored blocks readable (still pinned for a write-through); returns them.

        The chain's tail goes first: LRU then evicts tails before heads (a head without
        its tail is still a usable prefix; a tail without its head is not).
        """
        stored = [o for o in reversed(outcomes) if isinstance(o, BlockEntry)]
        for entry in stored:
            self._tier.commit(entry, keep_pin=self._store.write_through)
        return stored

    async def persist(self, stored: list[BlockEntry]) -> None:
        """Write committed blocks through to SSD (a write-through node), then unpin them."""
        await self._store.persist(stored)

    def abort(self, outcomes: list[Outcome]) -> None:
        """Free the slots of a put that ended before its blocks were committed."""
        for outcome in outcomes:
            if isinstance(outcome, BlockEntry):
                self._tier.abort(outcome)

    def reply(self, request: PutRequest, outcomes: list[Outcome]) -> Reply:
        """The put's answer: OK for each block stored, else why not."""
        statuses = [int(ErrorCode.OK if isinstance(o, BlockEntry) else o) for o in outcomes]
        self._counters.add("bytes_in", sum(request.lengths))
        if ErrorCode.ALREADY_EXISTS in outcomes:  # put-if-absent: received, and dropped
            self._counters.add("puts_duplicate", outcomes.count(ErrorCode.ALREADY_EXISTS))
        if len(statuses) == 1:
            return [encode_put_one_answer(request.request_id, statuses[0])]
        return [encode(StatusResponse(request.request_id, Op.PUT, statuses))]


def depths(request: PutRequest) -> list[int]:
    """Each block's chain depth; 0 where the client did not say."""
    return request.depths or [0] * len(request.hashes)
