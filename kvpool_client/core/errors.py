"""Error codes and exceptions shared by the client, the daemon and the wire.

Every error that crosses a process boundary carries a stable numeric code from
:class:`ErrorCode`: in a data-plane frame header, in a per-key status, or in the
details of a gRPC status. Codes are never renumbered; new ones are appended.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Stable numeric codes. ``OK`` is the only success code."""

    OK = 0
    NOT_FOUND = 1
    ALREADY_EXISTS = 2  # put-if-absent found a complete block: not a failure
    BLOCK_TOO_LARGE = 3
    SIZE_MISMATCH = 4  # stored length differs from the caller's buffer
    OUT_OF_SPACE = 5  # no room even after eviction (all candidates pinned)
    BUSY = 6  # the block is being written by another request
    DRAINING = 7  # the node is draining: it serves reads, takes no writes
    NOT_IN_ARENA = 8  # LOCATE: stored, but not in the shared arena (read it with GET)
    QUOTA_EXCEEDED = 9  # the namespace holds its quota here and none of its blocks can go
    PROTOCOL = 10  # malformed frame: bad magic, lengths, counts, encoding
    UNSUPPORTED_VERSION = 11
    LIMIT_EXCEEDED = 12  # too many keys, frame or meta too large
    INVALID_ARGUMENT = 13
    CHECKSUM_MISMATCH = 14
    UNAUTHENTICATED = 15  # the connection or call did not prove the cluster's token
    OVERLOADED = 16  # the node is at an admission limit (put bytes in flight): retry later
    PERMISSION_DENIED = 17  # the token's tenant may not do this (write, delete, admin) in this namespace
    UNAVAILABLE = 20  # node unreachable, connection lost
    TIMEOUT = 21
    SHUTTING_DOWN = 22
    INTERNAL = 30


class KVPoolError(Exception):
    """Base of every kvpool exception; ``code`` says which failure it is."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"[{self.code.name}] {self.args[0]}"


class ProtocolError(KVPoolError):
    """The peer sent bytes that break the wire protocol."""

    code = ErrorCode.PROTOCOL


class LimitExceeded(ProtocolError):
    """A frame asks for more keys, bytes or meta than the limits allow."""

    code = ErrorCode.LIMIT_EXCEEDED


class UsageError(KVPoolError):
    """The caller passed something unusable (wrong type, non-contiguous buffer)."""

    code = ErrorCode.INVALID_ARGUMENT


class NodeUnavailable(KVPoolError):
    """The node could not be reached or dropped the connection."""

    code = ErrorCode.UNAVAILABLE


class RequestTimeout(KVPoolError):
    """The node did not answer within the request timeout."""

    code = ErrorCode.TIMEOUT


class AuthenticationError(KVPoolError):
    """The node requires the cluster's token and this client did not prove it."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDenied(KVPoolError):
    """The token proved a tenant that may not do this (write, delete, administer) here."""

    code = ErrorCode.PERMISSION_DENIED


class ServerError(KVPoolError):
    """The node answered a whole request with an error code."""


def error_for_code(code: int, message: str) -> KVPoolError:
    """Build the exception a client raises for an error frame from a node."""
    try:
        known = ErrorCode(code)
    except ValueError:
        return ServerError(f"unknown error code {code}: {message}", ErrorCode.INTERNAL)
    by_code: dict[ErrorCode, type[KVPoolError]] = {
        ErrorCode.PROTOCOL: ProtocolError,
        ErrorCode.UNSUPPORTED_VERSION: ProtocolError,
        ErrorCode.LIMIT_EXCEEDED: LimitExceeded,
        ErrorCode.INVALID_ARGUMENT: UsageError,
        ErrorCode.UNAVAILABLE: NodeUnavailable,
        ErrorCode.SHUTTING_DOWN: NodeUnavailable,
        ErrorCode.TIMEOUT: RequestTimeout,
        ErrorCode.UNAUTHENTICATED: AuthenticationError,
        ErrorCode.PERMISSION_DENIED: PermissionDenied,
    }
    return by_code.get(known, ServerError)(message, known)
