"""Exit codes of kvpoolctl and the one-line errors that carry them."""

from __future__ import annotations

import enum

from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable, RequestTimeout, UsageError


class ExitCode(enum.IntEnum):
    """Stable process exit codes; scripts branch on them."""

    OK = 0
    ERROR = 1  # unexpected: a bug, or a node failure with no better code
    USAGE = 2  # bad arguments or unreadable input (argparse exits 2 as well)
    UNREACHABLE = 3  # a node refused, dropped or did not answer in time
    NOT_FOUND = 4  # no such block or node
    TIMED_OUT = 5  # a wait (drain --wait, watch --count) ran out of time


class CliError(Exception):
    """A failure to report as one line on stderr, then exit with ``code``.

    Attributes:
        refused: who refused the token (an address, or "a node"), for errors of a node that
            wants the cluster's token: the message then depends on whether one was sent.
    """

    def __init__(self, code: ExitCode, message: str, refused: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.refused = refused

    def with_token_sent(self, token_file: str) -> CliError:
        """This error when the token of ``token_file`` was sent: it was rejected, not missing."""
        if self.refused is None:
            return self
        return CliError(
            ExitCode.USAGE,
            f"{self.refused} rejected the token in {token_file}: "
            "it is not this cluster's token (check the file the daemons read)",
        )


_TOKEN_HINT = "requires the cluster's token: pass --auth-token-file PATH or set KVPOOL_AUTH_TOKEN_FILE"
_UNREACHABLE_HINT = "is kvpool-server running? set --nodes or KVPOOL_NODES"
_ETCD_HINT = "is etcd running? set --etcd or KVPOOL_ETCD_ENDPOINTS"
_UNREACHABLE_CODES = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.SHUTTING_DOWN, ErrorCode.TIMEOUT})
_USAGE_CODES = frozenset({ErrorCode.INVALID_ARGUMENT, ErrorCode.BLOCK_TOO_LARGE})


def unreachable(address: str, exc: KVPoolError) -> CliError:
    """The error for a node that failed a control call (``exc``) at ``address``."""
    if isinstance(exc, RequestTimeout) or exc.code is ErrorCode.TIMEOUT:
        return CliError(ExitCode.UNREACHABLE, f"{address} did not answer in time: raise --timeout or check the node")
    if exc.code is ErrorCode.SHUTTING_DOWN:
        return CliError(ExitCode.UNREACHABLE, f"{address} is shutting down: use another node in --nodes")
    if exc.code is ErrorCode.UNAUTHENTICATED:
        return CliError(ExitCode.USAGE, f"{address} {_TOKEN_HINT}", refused=address)
    if exc.code is ErrorCode.PERMISSION_DENIED:  # a tenant's token: the node says which right it lacks
        return CliError(ExitCode.USAGE, f"refused: {exc.args[0] if exc.args else exc}")
    return CliError(ExitCode.UNREACHABLE, f"cannot reach {address}: {_UNREACHABLE_HINT}")


def etcd_unreachable(endpoints: str) -> CliError:
    """The error for an etcd that refused or did not answer."""
    return CliError(ExitCode.UNREACHABLE, f"cannot reach etcd at {endpoints}: {_ETCD_HINT}")


def from_kvpool_error(exc: KVPoolError) -> CliError:
    """The error for an SDK exception that names no address we can trust."""
    message = str(exc.args[0]) if exc.args else str(exc)
    if exc.code is ErrorCode.UNAUTHENTICATED:
        return CliError(ExitCode.USAGE, f"a node {_TOKEN_HINT}", refused="a node")
    if exc.code is ErrorCode.PERMISSION_DENIED:
        return CliError(ExitCode.USAGE, f"refused: {message}")
    if isinstance(exc, (NodeUnavailable, RequestTimeout)) or exc.code in _UNREACHABLE_CODES:
        return CliError(ExitCode.UNREACHABLE, f"{message}: {_UNREACHABLE_HINT}")
    if isinstance(exc, UsageError) or exc.code in _USAGE_CODES:
        return CliError(ExitCode.USAGE, message)
    return CliError(ExitCode.ERROR, f"{exc}")


def from_status(status: ErrorCode, key: str, node: str) -> CliError:
    """The error for a per-key ``status`` that is not a success.

    Args:
        key: the key as ``namespace/hexhash``.
        node: the address of the node that owns the key.
    """
    if status is ErrorCode.NOT_FOUND:
        return CliError(ExitCode.NOT_FOUND, f"no block {key} on {node}: check --namespace and --key")
    if status in _UNREACHABLE_CODES:
        return CliError(ExitCode.UNREACHABLE, f"{node} failed on {key} ({status.name}): {_UNREACHABLE_HINT}")
    if status is ErrorCode.OUT_OF_SPACE:
        return CliError(ExitCode.ERROR, f"{node} is out of space (every block is in use): retry later")
    if status in _USAGE_CODES:
        return CliError(ExitCode.USAGE, f"{node} rejected {key} ({status.name})")
    return CliError(ExitCode.ERROR, f"{node} failed on {key} ({status.name}): see its log")
