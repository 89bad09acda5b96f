"""What a well-formed frame is: each rule on a field's value, written once.

Every decoder applies these and no rule of its own. The general decoder
(:mod:`~kvpool_client.core.wire.codec`) lets the error a rule raises propagate; a one-key
decoder (:mod:`~kvpool_client.core.wire.one_key`) turns it into None, so that the general
decoder reads the same bytes and says what is wrong. A decoder itself only knows where the
fields lie (:mod:`~kvpool_client.core.wire.layout`); so a one-key decoder cannot accept a frame
that the general one refuses, whatever the rules become.

Raises (every check):
    ProtocolError: the value breaks the protocol.
    LimitExceeded: the value is well-formed but larger than the limits allow.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool_client.core.errors import ErrorCode, LimitExceeded, ProtocolError
from kvpool_client.core.wire.frames import (
    MAGIC,
    MAX_HASH_BYTES,
    MAX_TOKEN_BYTES,
    PROTOCOL_VERSION,
    RESPONSE_BIT,
    Op,
    WireLimits,
)

VALID_OPS = frozenset(int(op) for op in Op)
_OK = int(ErrorCode.OK)  # a module constant: an enum member's lookup costs a decode more than its rules


def check_header(magic: bytes, version: int, op: int, meta_len: int, payload_len: int, limits: WireLimits) -> None:
    """A header's fields: ours, an op we know, sizes within ``limits``."""
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version}", ErrorCode.UNSUPPORTED_VERSION)
    if op & ~RESPONSE_BIT not in VALID_OPS:
        raise ProtocolError(f"unknown op {op}")
    if meta_len > limits.max_meta:
        raise LimitExceeded(f"meta of {meta_len} bytes exceeds {limits.max_meta}")
    if payload_len > limits.max_payload:
        raise LimitExceeded(f"payload of {payload_len} bytes exceeds {limits.max_payload}")


def check_count(count: int, limits: WireLimits) -> None:
    """Keys (or answers) in one frame."""
    if count > limits.max_keys:
        raise LimitExceeded(f"{count} keys exceed the limit of {limits.max_keys} per request")


def keys_namespace(namespace: bytes | bytearray | memoryview, hash_size: int, count: int, limits: WireLimits) -> str:
    """A keyed request's keys section (namespace, hash size, count): its namespace, decoded.

    The namespace is not empty and UTF-8; the hashes are 1..MAX_HASH_BYTES long; the count
    is within ``limits``.
    """
    if not namespace:
        raise ProtocolError("empty namespace")
    try:
        text = str(namespace, "utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"namespace is not UTF-8: {exc}") from exc
    if not 0 < hash_size <= MAX_HASH_BYTES:
        raise ProtocolError(f"hash size {hash_size} outside 1..{MAX_HASH_BYTES}")
    check_count(count, limits)
    return text


def check_block_length(length: int, limits: WireLimits) -> None:
    if length > limits.max_block_size:
        raise LimitExceeded(f"a block exceeds the {limits.max_block_size}-byte block limit")


def check_block_lengths(lengths: Sequence[int], limits: WireLimits) -> None:
    if lengths:
        check_block_length(max(lengths), limits)


def depths_flag(flag: int) -> bool:
    """Whether a PUT carries chain depths (its has_depths byte)."""
    if flag > 1:
        raise ProtocolError(f"has_depths must be 0 or 1, not {flag}")
    return bool(flag)


def check_token_size(size: int) -> None:
    if size > MAX_TOKEN_BYTES:
        raise LimitExceeded(f"a token is at most {MAX_TOKEN_BYTES} bytes")


def check_payload(announced: int, payload_len: int) -> None:
    """The meta's block lengths add up to the header's payload length."""
    if announced != payload_len:
        raise ProtocolError(f"blocks add up to {announced} bytes, header says {payload_len}")


def check_nothing_when_not_ok(what: str, statuses: Sequence[int], *columns: Sequence[int]) -> None:
    """A key that is not OK has zeros in every one of ``columns`` (no bytes, no location)."""
    if statuses.count(_OK) == len(statuses):  # the usual answer: every key found
        return
    if any(s != _OK and any(values) for s, *values in zip(statuses, *columns, strict=True)):
        raise ProtocolError(f"a key that is not OK carries {what}")
