"""Where each field of a frame lies: the byte layouts every encoder and decoder shares.

Little endian::

    header  magic "KV" | version u8 | op u8 | status u16 | reserved u16 |
            request_id u64 | meta_len u32 | payload_len u64
    keys    ns_len u8 | namespace utf-8 | hash_size u8 | count u32 | count*hash_size

What the values in these fields may be is :mod:`~kvpool_client.core.wire.rules`' business.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

from kvpool_client.core.errors import ProtocolError
from kvpool_client.core.wire.frames import MAX_HASH_BYTES, MAX_NAMESPACE_BYTES

HEADER = struct.Struct("<2sBBHHQIQ")
HEADER_SIZE = HEADER.size
U32 = struct.Struct("<I")
KEYS_TAIL = struct.Struct("<BI")  # hash_size u8 | count u32, after the namespace


def pack(layout: struct.Struct, *values: object) -> bytes:
    """``layout.pack(*values)``, a value out of its field's range being a :class:`ProtocolError`."""
    try:
        return layout.pack(*values)
    except struct.error as exc:
        raise ProtocolError(f"value out of range for the wire: {exc}") from exc


def keys_field(namespace: str, hashes: Sequence[bytes]) -> bytes:
    """The keys section of a keyed request.

    Raises:
        ProtocolError: the namespace cannot be represented, or the hashes do not share one size
            in 1..MAX_HASH_BYTES.
    """
    size = len(hashes[0]) if hashes else 1
    if not 0 < size <= MAX_HASH_BYTES or (len(hashes) > 1 and set(map(len, hashes)) != {size}):
        raise ProtocolError(f"hashes of one frame must share one size in 1..{MAX_HASH_BYTES}")
    return b"".join([_namespace_field(namespace), KEYS_TAIL.pack(size, len(hashes)), *hashes])


@functools.lru_cache(maxsize=1024)
def _namespace_field(namespace: str) -> bytes:
    """ns_len u8 | namespace utf-8, checked (a client uses few namespaces: each is encoded once)."""
    try:
        ns = namespace.encode()
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"namespace is not encodable as UTF-8: {exc}") from exc
    if not 0 < len(ns) <= MAX_NAMESPACE_BYTES:
        raise ProtocolError(f"namespace must be 1..{MAX_NAMESPACE_BYTES} bytes, got {len(ns)}")
    return bytes([len(ns)]) + ns


# A response's fields after its count, packed and unpacked in one call.
@functools.lru_cache(maxsize=64)
def get_response_layout(count: int) -> struct.Struct:
    """statuses | lengths u32 | checksums u64, ``count`` of each."""
    return struct.Struct(f"<{count}s{count}I{count}Q")


@functools.lru_cache(maxsize=64)
def locate_response_layout(count: int) -> struct.Struct:
    """arena_id u64 | statuses | offsets u64 | lengths u32 | checksums u64 | generations u64."""
    return struct.Struct(f"<Q{count}s{count}Q{count}I{count}Q{count}Q")


PEER_RESPONSE = struct.Struct("<QQQQ")  # arena_id | base | size | generations_offset, then the agent's metadata
COMMIT_HEAD = struct.Struct("<QI")  # lease | count, then count*u64 checksums


@functools.lru_cache(maxsize=64)
def reserve_response_layout(count: int) -> struct.Struct:
    """arena_id u64 | lease u64 | statuses | offsets u64."""
    return struct.Struct(f"<QQ{count}s{count}Q")
