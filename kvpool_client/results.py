"""What batched calls return: one status per key, in the caller's order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpool_client.buffers import Target
from kvpool_client.core.errors import ErrorCode, KVPoolError, error_for_code

# A put that finds the block stored, or being stored by another writer, counts as success (see PutResult).
PUT_SUCCESS = frozenset({ErrorCode.OK, ErrorCode.ALREADY_EXISTS, ErrorCode.BUSY})
# Failures that say only that a node could not be asked, least telling last.
_VAGUE = (ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE, ErrorCode.DRAINING)


# Results are not frozen: one is made per call, and a frozen dataclass sets each field through
# object.__setattr__. Their fields are tuples; nothing in the client changes a result it returned.
@dataclass(slots=True)
class BatchResult:
    """One status per key, and why nodes failed.

    Attributes:
        statuses: per key, in the caller's order.
        causes: one line per node that failed the call and how, naming the node
            (``node-1 (10.0.0.5:7700): UNAVAILABLE: ...``); empty when every node answered.
    """

    statuses: tuple[ErrorCode, ...]
    causes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.statuses)

    @property
    def hits(self) -> int:
        """Keys whose status is OK."""
        return sum(s is ErrorCode.OK for s in self.statuses)

    @property
    def prefix_hits(self) -> int:
        """Leading keys whose status is OK: the reusable prefix."""
        for i, status in enumerate(self.statuses):
            if status is not ErrorCode.OK:
                return i
        return len(self.statuses)

    def failures(self) -> list[tuple[int, ErrorCode]]:
        """(index, status) of each key that did not succeed."""
        return [(i, s) for i, s in enumerate(self.statuses) if not self._succeeded(s)]

    @property
    def ok(self) -> bool:
        return not self.failures()

    def raise_for_errors(self) -> None:
        """Raise the typed exception of the first failure, if any, with the nodes' failures."""
        failed = self.failures()
        if failed:
            index, status = failed[0]
            why = f" ({'; '.join(self.causes)})" if self.causes else ""
            raise error_for_code(status, f"{len(failed)} of {len(self)} keys failed; key {index}: {status.name}{why}")

    def _succeeded(self, status: ErrorCode) -> bool:
        return status is ErrorCode.OK


@dataclass(slots=True)
class PutResult(BatchResult):
    """Per-key outcome of a put: OK (stored now), ALREADY_EXISTS, or BUSY.

    BUSY means another writer was storing the same block at that moment. It counts
    as success, because keys are content addresses and the other writer sends the same
    bytes. If that writer fails, the block is simply missing later: a miss, never
    wrong bytes.

    With replication a key succeeds when its write quorum of owners stored it; its
    status is then OK if any owner stored it now, else ALREADY_EXISTS or BUSY. Below
    quorum it is the most telling failure among the owners' answers.

    Attributes:
        stored_on: per key, the control addresses (``host:port``) of the nodes that
            hold it after this put (they answered OK, ALREADY_EXISTS or BUSY),
            best-ranked first; the same form with a static node list and with etcd, and
            what ``kvpoolctl stats``/``drain`` and ``ClientConfig.nodes`` take (``kvpoolctl
            status`` maps addresses to node ids). Empty tuples when the result was
            built without that knowledge.
    """

    stored_on: tuple[tuple[str, ...], ...] = ()

    @property
    def stored(self) -> int:
        return sum(s is ErrorCode.OK for s in self.statuses)

    def _succeeded(self, status: ErrorCode) -> bool:
        return status in PUT_SUCCESS


@dataclass(slots=True)
class GetResult(BatchResult):
    """Per-key outcome of a get; ``buffers[i]`` holds block ``i`` when its status is OK, else None.

    NOT_FOUND is a miss, not an error: :attr:`ok` is True only if every key hit.
    """

    buffers: tuple[Target | None, ...] = ()


_CODES = {int(code): code for code in ErrorCode}  # a lookup: ErrorCode(s) costs a microsecond a key
_ONE_OK, _HIT = [int(ErrorCode.OK)], (ErrorCode.OK,)


def to_codes(statuses: Sequence[int]) -> tuple[ErrorCode, ...]:
    """Wire statuses as ErrorCodes; a code this client does not know is INTERNAL."""
    if statuses == _ONE_OK:  # a one-key get that hit, the commonest answer
        return _HIT
    return tuple([_CODES.get(s, ErrorCode.INTERNAL) for s in statuses])


def failure_code(exc: BaseException) -> ErrorCode:
    """The per-key status for keys whose node failed with ``exc``."""
    return exc.code if isinstance(exc, KVPoolError) else ErrorCode.INTERNAL


def most_telling(codes: Sequence[int]) -> ErrorCode:
    """The failure to report for a key from several nodes' answers.

    A node's own verdict (OUT_OF_SPACE, CHECKSUM_MISMATCH, NOT_FOUND, ...) says more
    than TIMEOUT, which says more than UNAVAILABLE, which says more than DRAINING.
    Among the node verdicts the first one wins. No answer at all is UNAVAILABLE.
    """
    found = to_codes(codes)
    for code in found:
        if code not in _VAGUE and code is not ErrorCode.OK:
            return code
    for vague in _VAGUE:
        if vague in found:
            return vague
    return ErrorCode.UNAVAILABLE
