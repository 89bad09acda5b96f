"""Errors of the membership layer, in one place.

Two families, as elsewhere in kvpool: etcd failed us (:class:`EtcdError` and its
subclasses: unreachable, lease gone, watch history compacted), or a record in
etcd breaks the schema (:class:`RecordError`: someone wrote a bad value).
None of these cross a process boundary; the codes only group them with the rest
of :class:`~kvpool_client.core.errors.KVPoolError`.
"""

from __future__ import annotations

from kvpool_client.core.errors import ErrorCode, KVPoolError


class EtcdError(KVPoolError):
    """etcd refused or failed a request for a reason other than those below."""

    code = ErrorCode.INTERNAL


class EtcdUnavailable(EtcdError):
    """etcd could not be reached, or did not answer within the timeout; retry later."""

    code = ErrorCode.UNAVAILABLE


class LeaseLost(EtcdError):
    """The lease expired or was revoked; its keys are gone. Register again with a new lease."""

    code = ErrorCode.NOT_FOUND

    def __init__(self, lease_id: int, message: str = "") -> None:
        super().__init__(message or f"lease {lease_id:x} is gone (expired or revoked)")
        self.lease_id = lease_id


class WatchCompacted(EtcdError):
    """The watch's start revision was compacted away; re-read the prefix and watch again."""

    code = ErrorCode.UNAVAILABLE

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"watch history compacted up to revision {compact_revision}")
        self.compact_revision = compact_revision


class RecordError(KVPoolError):
    """A value in etcd is not a valid record (bad JSON, missing field, wrong type or range)."""

    code = ErrorCode.PROTOCOL
