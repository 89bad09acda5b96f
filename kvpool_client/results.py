"""What batched calls return: one status per key, in the caller's order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpool_client.errors import ErrorCode, KVPoolError, error_for_code

# A put that finds the block stored, or being stored by someone else, still leaves it in the pool.
_PUT_SUCCESS = frozenset({ErrorCode.OK, ErrorCode.ALREADY_EXISTS, ErrorCode.BUSY})


@dataclass(frozen=True, slots=True)
class BatchResult:
    statuses: tuple[ErrorCode, ...]

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
        """Raise the typed exception of the first failure, if any."""
        failed = self.failures()
        if failed:
            index, status = failed[0]
            raise error_for_code(status, f"{len(failed)} of {len(self)} keys failed; key {index}: {status.name}")

    def _succeeded(self, status: ErrorCode) -> bool:
        return status is ErrorCode.OK


@dataclass(frozen=True, slots=True)
class PutResult(BatchResult):
    """Per-key outcome of a put: OK (stored now), ALREADY_EXISTS or BUSY (stored by another writer)."""

    @property
    def stored(self) -> int:
        return sum(s is ErrorCode.OK for s in self.statuses)

    def _succeeded(self, status: ErrorCode) -> bool:
        return status in _PUT_SUCCESS


@dataclass(frozen=True, slots=True)
class GetResult(BatchResult):
    """Per-key outcome of a get; ``buffers[i]`` holds block ``i`` when its status is OK.

    NOT_FOUND is a miss, not an error: :attr:`ok` is True only if every key hit.
    """

    buffers: tuple[memoryview | None, ...] = ()


def to_codes(statuses: Sequence[int]) -> tuple[ErrorCode, ...]:
    return tuple(_code(s) for s in statuses)


def _code(status: int) -> ErrorCode:
    try:
        return ErrorCode(status)
    except ValueError:
        return ErrorCode.INTERNAL


def failure_code(exc: BaseException) -> ErrorCode:
    """The per-key status for keys whose node failed with ``exc``."""
    return exc.code if isinstance(exc, KVPoolError) else ErrorCode.INTERNAL
