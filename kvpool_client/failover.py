"""Reads that fall back from replica to replica: which node to ask next for each key.

Pure planning shared by the blocking and asyncio clients; they only run the jobs.

Each key walks its read order (see :class:`~kvpool_client.core.routing.KeyPlacement`).
A round asks, for every key still open, the first member not yet tried that the
circuit breaker lets through; keys are batched per node as usual. An answer that
another replica may improve on (the node is down or slow, lacks the block, or sent
corrupt bytes) moves the key to its next member for the next round; any other
answer is final. A key whose order runs out gets the most telling answer it saw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvpool_client.batching import Job, group
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import Member
from kvpool_client.results import most_telling, to_codes

Usable = Callable[[str], bool]  # node id -> may a request go there now (a breaker gate)

RETRY_ELSEWHERE = frozenset(
    {ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT, ErrorCode.NOT_FOUND, ErrorCode.CHECKSUM_MISMATCH}
)


@dataclass(slots=True)
class _KeyRead:
    order: Sequence[Member]
    next: int = 0  # index in order of the member to ask next
    seen: list[int] = field(default_factory=list)  # answers that sent the key on
    final: int | None = None
    served_by: str = ""


class ReadPlan:
    """The rounds of one get, exists or lookup.

    Args:
        keys: the batch.
        orders: each key's read order, by batch index.
        prefix: a lookup: only the leading run of hits matters, so once a key is
            missing everywhere the keys after it are settled as NOT_FOUND unasked.
    """

    def __init__(self, keys: Sequence[BlockKey], orders: Sequence[Sequence[Member]], *, prefix: bool = False) -> None:
        self._keys = keys
        self._reads = [_KeyRead(order) for order in orders]
        self._prefix = prefix

    def next_round(self, usable: Usable) -> list[Job]:
        """Jobs to send now (none: every key is settled)."""
        self._cut_after_first_miss()
        pairs: list[tuple[int, Member]] = []
        for index, read in enumerate(self._reads):
            if read.final is not None:
                continue
            member = self._next_usable(read, usable)
            if member is not None:
                pairs.append((index, member))
                continue
            read.final = most_telling(read.seen)
            if self._prefix:  # missing everywhere: later keys do not count
                self._cut_after_first_miss()
                break
        return group(self._keys, pairs)

    def record(self, job: Job, codes: Sequence[int]) -> None:
        """The statuses ``job.member`` answered for ``job``'s keys."""
        for index, code in zip(job.indices, codes, strict=True):
            read = self._reads[index]
            if code in RETRY_ELSEWHERE:
                read.seen.append(code)
                read.next += 1
            else:
                read.final, read.served_by = code, job.member.node_id

    def settled(self, index: int) -> bool:
        """Whether key ``index`` has its final answer."""
        return self._reads[index].final is not None

    def statuses(self) -> tuple[ErrorCode, ...]:
        """Per key: the final answer (INTERNAL for a key never settled: a bug)."""
        return to_codes([ErrorCode.INTERNAL if r.final is None else r.final for r in self._reads])

    def served_by(self) -> tuple[str, ...]:
        """Per key, the id of the node whose answer was final ('' if none was)."""
        return tuple(r.served_by for r in self._reads)

    def _next_usable(self, read: _KeyRead, usable: Usable) -> Member | None:
        while read.next < len(read.order):
            member = read.order[read.next]
            if usable(member.node_id):
                return member
            read.seen.append(ErrorCode.UNAVAILABLE)
            read.next += 1
        return None

    def _cut_after_first_miss(self) -> None:
        if not self._prefix:
            return
        miss = next((i for i, r in enumerate(self._reads) if r.final is not None and r.final != ErrorCode.OK), None)
        if miss is None:
            return
        for read in self._reads[miss + 1 :]:
            if read.final is None:
                read.final = ErrorCode.NOT_FOUND
