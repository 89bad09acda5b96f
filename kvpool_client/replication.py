"""Writes to several owners: who gets each key, and whether enough of them stored it.

Pure planning shared by the blocking and asyncio clients; they only run the jobs.

A put writes each key to its ``R`` write owners in parallel. A key succeeds when at
least ``write_quorum`` owners answered OK, ALREADY_EXISTS or BUSY (each leaves the
block in the pool). An owner that is skipped (its circuit is open) or fails counts
against the quorum; an owner that answers DRAINING (the client's membership is
stale) is replaced by the next active node in rendezvous order, the owner a fresher
router would have picked. A delete goes to every member of each key's read order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvpool_client.batching import Job, group
from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import KeyPlacement, Member
from kvpool_client.results import PUT_SUCCESS, most_telling

Usable = Callable[[str], bool]  # node id -> may a request go there now (a breaker gate)


def quorum_for(write_quorum: int, owners: int) -> int:
    """Owners that must store a key: ``write_quorum``, at most the owners placed (>= 1).

    A cluster with fewer active nodes than ``R`` places fewer owners; the quorum
    shrinks with them rather than refusing every write.
    """
    return max(1, min(write_quorum, owners))


@dataclass(slots=True)
class _KeyWrite:
    """One key's writes: the candidates in rank order, how far we went, and the answers."""

    candidates: tuple[Member, ...]  # write owners, then spares
    next: int  # index of the first candidate not yet tried
    answers: dict[str, int] = field(default_factory=dict)  # node id -> status
    substitutes: int = 0  # DRAINING answers not yet replaced


class WritePlan:
    """The rounds of one put (or any write that needs a quorum of owners).

    Round one sends each key to its write owners; each later round sends keys that an
    owner refused with DRAINING to the next spare. :meth:`next_round` returns no job
    when there is nothing left to send.

    Args:
        keys: the batch.
        placements: each key's placement, by batch index.
        write_quorum: configured owners that must store a key (clamped per key by
            :func:`quorum_for`).
    """

    def __init__(self, keys: Sequence[BlockKey], placements: Sequence[KeyPlacement], write_quorum: int) -> None:
        self._keys = keys
        self._quorum = write_quorum
        self._owners = [len(p.write_owners) for p in placements]
        self._writes = [_KeyWrite(p.write_owners + p.spares, len(p.write_owners)) for p in placements]
        self._started = False

    def next_round(self, usable: Usable) -> list[Job]:
        """Jobs to send now; an owner ``usable`` refuses is recorded as UNAVAILABLE instead."""
        pairs: list[tuple[int, Member]] = []
        for index, write in enumerate(self._writes):
            for member in self._targets(write):
                if usable(member.node_id):
                    pairs.append((index, member))
                else:
                    write.answers[member.node_id] = ErrorCode.UNAVAILABLE
        self._started = True
        return group(self._keys, pairs)

    def record(self, job: Job, codes: Sequence[int]) -> None:
        """The statuses ``job.member`` answered for ``job``'s keys."""
        for index, code in zip(job.indices, codes, strict=True):
            write = self._writes[index]
            write.answers[job.member.node_id] = code
            if code == ErrorCode.DRAINING:
                write.substitutes += 1

    def statuses(self) -> list[ErrorCode]:
        """Per key: OK, ALREADY_EXISTS or BUSY if the quorum stored it, else the most telling failure."""
        return [self._status(i) for i in range(len(self._writes))]

    def stored_on(self) -> tuple[tuple[str, ...], ...]:
        """Per key, the control addresses of the nodes that hold it, in rank order.

        Addresses rather than node ids: a static node list has no ids, and an address
        is what kvpoolctl and ``ClientConfig.nodes`` take, with etcd as without.
        """
        return tuple(
            tuple(m.address for m in w.candidates if w.answers.get(m.node_id) in PUT_SUCCESS) for w in self._writes
        )

    def _targets(self, write: _KeyWrite) -> list[Member]:
        if not self._started:
            return list(write.candidates[: write.next])
        count = min(write.substitutes, len(write.candidates) - write.next)
        targets = list(write.candidates[write.next : write.next + count])
        write.next += count
        write.substitutes = 0
        return targets

    def _status(self, index: int) -> ErrorCode:
        write = self._writes[index]
        answers = [write.answers[m.node_id] for m in write.candidates if m.node_id in write.answers]
        stored = [ErrorCode(a) for a in answers if a in PUT_SUCCESS]
        if self._owners[index] and len(stored) >= quorum_for(self._quorum, self._owners[index]):
            for code in (ErrorCode.OK, ErrorCode.ALREADY_EXISTS):
                if code in stored:
                    return code
            return ErrorCode.BUSY
        return most_telling([a for a in answers if a not in PUT_SUCCESS])


def fan_out(keys: Sequence[BlockKey], orders: Sequence[Sequence[Member]], usable: Usable) -> list[Job]:
    """Jobs sending each key to every member of its order that ``usable`` allows."""
    pairs = [(i, m) for i, order in enumerate(orders) for m in order if usable(m.node_id)]
    return group(keys, pairs)


@dataclass(slots=True)
class DeleteTally:
    """Answers of a delete fanned out to every reader of each key.

    A key counts as deleted when any node removed it. A key no node answered for
    (all skipped or failed) is *unreached*: the caller reports that as an error.
    """

    count: int
    removed: list[bool] = field(init=False)
    answered: list[bool] = field(init=False)
    denied: bool = False  # a node refused some key: this token's tenant may not delete there

    def __post_init__(self) -> None:
        self.removed = [False] * self.count
        self.answered = [False] * self.count

    def record(self, job: Job, codes: Sequence[int] | None) -> None:
        """``codes`` per key of ``job``, or None when its node failed."""
        if codes is None:
            return
        for index, code in zip(job.indices, codes, strict=True):
            self.answered[index] = True
            self.removed[index] = self.removed[index] or code == ErrorCode.OK
            self.denied = self.denied or code == ErrorCode.PERMISSION_DENIED

    def unreached(self) -> list[int]:
        """Batch indices of the keys no node answered for."""
        return [i for i, answered in enumerate(self.answered) if not answered]
