"""Typed messages of the data-plane protocol.

A frame is a fixed 28-byte header, a meta section (keys, lengths, statuses) and a
payload section (block bytes, back to back). The messages below describe header
and meta; payload bytes never live in a message: the transport moves them
straight between the socket and the caller's (or the arena's) buffers.

Every request is answered by exactly one response with the same ``request_id``
and the request's op with :data:`RESPONSE_BIT` set, or by an :class:`ErrorResponse`
for that op when the whole request failed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

PROTOCOL_VERSION = 1
MAGIC = b"KV"
RESPONSE_BIT = 0x80
MAX_NAMESPACE_BYTES = 255
MAX_HASH_BYTES = 64
MAX_TOKEN_BYTES = 1024


class Op(enum.IntEnum):
    PUT = 1
    GET = 2
    EXISTS = 3
    DELETE = 4
    PING = 5
    LOCATE = 6  # where blocks lie in the node's shared arena (same-node readers)
    HELLO = 7  # the first frame on a connection to a node that requires a token
    PEER = 8  # the node's one-sided peer: its NIXL agent and where its arena is registered
    RESERVE = 9  # slots for a put's blocks under a lease: the client writes them one-sided
    COMMIT = 10  # a lease's blocks written: publish them (or, with no checksums, give the slots back)


@dataclass(frozen=True, slots=True)
class WireLimits:
    """Bounds a decoder enforces before it allocates or reads anything.

    Both ends agree on these: the daemon announces its own in server info.
    """

    max_keys: int = 4096
    max_block_size: int = 16 << 20
    max_payload: int = 1 << 30
    max_meta: int = field(init=False, repr=False, compare=False)  # derived; read on every frame

    def __post_init__(self) -> None:
        # Namespace + per-key hash and the widest per-key record, with slack.
        object.__setattr__(self, "max_meta", 1024 + self.max_keys * (MAX_HASH_BYTES + 16))


_OP_BY_CODE = {int(op): op for op in Op}  # Op(code) runs the enum's lookup machinery on every frame


class FrameHeader(NamedTuple):
    """A decoded header (a tuple: one is made per frame, and a frozen dataclass sets each field
    through object.__setattr__)."""

    op: int
    status: int
    request_id: int
    meta_len: int
    payload_len: int

    @property
    def is_response(self) -> bool:
        return bool(self.op & RESPONSE_BIT)

    @property
    def request_op(self) -> Op:
        """The op this frame requests or answers (a decoded header's op is a known one)."""
        return _OP_BY_CODE[self.op & ~RESPONSE_BIT]


@dataclass(slots=True)
class PutRequest:
    """Store blocks if absent; ``lengths[i]`` bytes of payload belong to ``hashes[i]``.

    ``depths``, when given, is each block's position in its prefix chain (0: the
    head): a hint for prefix-aware eviction.
    """

    request_id: int
    namespace: str
    hashes: list[bytes]
    lengths: list[int]
    depths: list[int] | None = None


@dataclass(slots=True)
class GetRequest:
    request_id: int
    namespace: str
    hashes: list[bytes]


@dataclass(slots=True)
class ExistsRequest:
    """With ``prefix`` set the node may stop at the first miss (longest-prefix lookup)."""

    request_id: int
    namespace: str
    hashes: list[bytes]
    prefix: bool = False


@dataclass(slots=True)
class DeleteRequest:
    request_id: int
    namespace: str
    hashes: list[bytes]


@dataclass(slots=True)
class LocateRequest:
    """Ask where each block lies in the node's shared-memory arena (no payload moves)."""

    request_id: int
    namespace: str
    hashes: list[bytes]


@dataclass(slots=True)
class PingRequest:
    request_id: int


@dataclass(slots=True)
class PeerRequest:
    """Ask for the node's one-sided peer (:class:`PeerResponse`); only a proven connection gets it."""

    request_id: int


@dataclass(slots=True)
class ReserveRequest:
    """A put whose blocks the client writes itself: a slot per block, held under a lease.

    The fields mean what a :class:`PutRequest`'s do; no payload follows.
    """

    request_id: int
    namespace: str
    hashes: list[bytes]
    lengths: list[int]
    depths: list[int] | None = None


@dataclass(slots=True)
class CommitRequest:
    """The blocks of ``lease`` are written: publish each with its checksum, in the reservation's
    order. No checksums at all gives the lease's slots back unpublished (the writes failed)."""

    request_id: int
    lease: int
    checksums: list[int]


@dataclass(slots=True)
class HelloRequest:
    """Proves the cluster's shared token; a node with a token requires it first on every connection."""

    request_id: int
    token: bytes = field(repr=False)  # never in logs or reprs


@dataclass(slots=True)
class StatusResponse:
    """Per-key status codes; answers PUT, EXISTS, DELETE and COMMIT (see ``op``)."""

    request_id: int
    op: Op
    statuses: list[int]


@dataclass(slots=True)
class GetResponse:
    """Per-key status, stored length and checksum.

    The payload holds the bytes of the keys whose status is OK, in key order;
    ``lengths[i]`` is 0 for a key that is not OK.
    """

    request_id: int
    statuses: list[int]
    lengths: list[int]
    checksums: list[int]


@dataclass(slots=True)
class LocateResponse:
    """Per key: status, and for an OK key where its bytes lie in the arena ``arena_id``.

    ``generations[i]`` is the slot's generation while the block was held; a reader
    that copied the bytes and then still sees it knows the slot was not reused.
    Every field of a key that is not OK is 0. No payload follows.
    """

    request_id: int
    arena_id: int
    statuses: list[int]
    offsets: list[int]
    lengths: list[int]
    checksums: list[int]
    generations: list[int]


@dataclass(slots=True)
class PeerResponse:
    """The node's one-sided peer: its agent's metadata (opaque, NIXL's) and the span of its
    process's memory registered with it, ``size`` bytes from ``base``: the arena's blocks, then
    its slot generations (their header at ``generations_offset`` from ``base``)."""

    request_id: int
    arena_id: int
    base: int
    size: int
    generations_offset: int
    agent: bytes = field(repr=False)


@dataclass(slots=True)
class ReserveResponse:
    """Per key: status, and for an OK key the offset of its slot in the arena ``arena_id``,
    held under ``lease`` until committed or expired (then freed, nothing published)."""

    request_id: int
    arena_id: int
    lease: int
    statuses: list[int]
    offsets: list[int]


@dataclass(slots=True)
class PingResponse:
    request_id: int


@dataclass(slots=True)
class HelloResponse:
    request_id: int


@dataclass(slots=True)
class ErrorResponse:
    """The whole request failed; ``code`` is an :class:`~kvpool_client.core.errors.ErrorCode`."""

    request_id: int
    op: Op
    code: int
    message: str


Request = (
    PutRequest
    | GetRequest
    | ExistsRequest
    | DeleteRequest
    | PingRequest
    | LocateRequest
    | HelloRequest
    | PeerRequest
    | ReserveRequest
    | CommitRequest
)
Response = (
    StatusResponse
    | GetResponse
    | PingResponse
    | ErrorResponse
    | LocateResponse
    | HelloResponse
    | PeerResponse
    | ReserveResponse
)
Message = Request | Response
