"""The daemon's side of a data-plane connection as a state machine without I/O (h11's shape).

The transport feeds received bytes in with :meth:`ServerConnection.receive_data` and asks
:meth:`~ServerConnection.next_event` what they hold: :data:`NEED_DATA`, a request, or a
:class:`Refusal` to answer. The machine knows the protocol's rules, so the daemon's session
does not: HELLO first when the node requires a token (a transition, checked once), the
frame limits, which bad frames lose the stream (close) and which only themselves (their
payload is dropped and the connection goes on), and where one frame's payload ends.

A put's payload is block bytes that should land in arena slots without a detour, so the
machine does not hand payload out as events: it gives back the few payload bytes that
arrived with the head (:meth:`~ServerConnection.take_payload`), and the transport receives
the rest straight into the slots and says so (:meth:`~ServerConnection.payload_received`).

States::

    HELLO --HELLO with the token--> READY --PUT (or a refused frame with payload)--> PAYLOAD
      |                               ^                                                |
      +--anything else: CLOSED        +------------- the payload is all in ------------+

A connection without a required token starts READY; a bad header moves any state to CLOSED.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from kvpool_client.core.errors import AuthenticationError, KVPoolError, ProtocolError
from kvpool_client.core.wire.codec import decode_header, decode_message, header_identity
from kvpool_client.core.wire.frames import (
    MAX_TOKEN_BYTES,
    CommitRequest,
    DeleteRequest,
    ExistsRequest,
    FrameHeader,
    GetRequest,
    HelloRequest,
    LocateRequest,
    Op,
    PeerRequest,
    PingRequest,
    PutRequest,
    ReserveRequest,
    WireLimits,
)
from kvpool_client.core.wire.layout import HEADER_SIZE
from kvpool_client.core.wire.one_key import decode_get_one_request, decode_put_one_request

NEEDS_TOKEN = (
    "this node requires the cluster's token: send HELLO first (ClientConfig.auth_token, KVPOOL_AUTH_TOKEN_FILE)"
)

# a request without payload
Request = (
    GetRequest
    | LocateRequest
    | ExistsRequest
    | DeleteRequest
    | PingRequest
    | PeerRequest
    | ReserveRequest
    | CommitRequest
)


class State(enum.Enum):
    HELLO = "waiting for a HELLO with the token"
    READY = "between frames"
    PAYLOAD = "inside a frame's payload"
    CLOSED = "closed: the stream cannot be trusted any more"


class NeedData:
    """The buffered bytes end mid-head: receive more."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()


class GetOne(NamedTuple):
    """A GET of one key, read in place: most requests are this, so it skips the general decode."""

    request_id: int
    namespace: str
    block: bytes


@dataclass(frozen=True, slots=True)
class Hello:
    """A HELLO that proved a token (or none was required): answer it with a HelloResponse.

    ``identity``: what the token proved (the daemon's tenant), as the machine's ``verify`` said;
    ``token``: the token itself, for the daemon to check again later (empty: none was required).
    """

    request_id: int
    identity: object = None
    token: bytes = field(default=b"", repr=False)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A frame the daemon answers with an error.

    ``close``: the stream is lost (a header that cannot be trusted, a peer without the
    token); send the error and close. Otherwise the frame's payload
    (:attr:`ServerConnection.payload_left`) is received and dropped, and the connection goes on.
    """

    request_id: int
    op: Op
    error: KVPoolError
    close: bool


Event = NeedData | GetOne | Request | PutRequest | Hello | Refusal
_READY = State.READY  # a module constant: an enum member's lookup costs as much as the rest of a get's test
_make_tuple = tuple.__new__


class LocalProtocolError(RuntimeError):
    """The daemon used the machine out of order (a bug in the session, not the peer's fault)."""


Verify = Callable[[bytes], object | None]
"""Who a presented token proves to be; None: nobody (the HELLO is refused)."""


class ServerConnection:
    """The protocol state of one client connection, fed bytes by its transport.

    Args:
        verify: checks the token of the HELLO that must come first; None: no token is required.
    """

    def __init__(self, limits: WireLimits, verify: Verify | None = None) -> None:
        self._limits = limits
        self._verify = verify
        self._buffer = bytearray()
        self._payload_left = 0
        self.state = State.READY if verify is None else State.HELLO

    # -- bytes in -------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes the transport received, in order."""
        self._buffer += data

    def receive_get_one(self, data: bytes | bytearray | memoryview) -> GetOne | None:
        """:meth:`receive_data`, and when ``data`` is one whole one-key GET and nothing else (a
        connection's usual request), that GET: what :meth:`next_event` would return, without
        buffering its bytes. None: ``data`` was buffered; :meth:`next_event` reads it."""
        if not self._buffer and self.state is _READY:
            one = decode_get_one_request(data, self._limits)
            if one is not None and one[3] == len(data):
                return _make_tuple(GetOne, one[:3])
        self._buffer += data
        return None

    @property
    def buffered(self) -> int:
        """Bytes received and not consumed yet (a payload's, then the next frames')."""
        return len(self._buffer)

    @property
    def head_size(self) -> int:
        """Bytes of the next frame's head (header and meta), as far as is known yet."""
        if len(self._buffer) < HEADER_SIZE:
            return HEADER_SIZE
        try:
            return HEADER_SIZE + decode_header(self._buffer[:HEADER_SIZE], self._limits).meta_len
        except ProtocolError:
            return HEADER_SIZE  # next_event refuses it

    # -- events -----------------------------------------------------------------

    def next_event(self) -> Event:
        """The next thing the peer asked for, or :data:`NEED_DATA`; consumes the frame's head."""
        if self.state is _READY:
            one = decode_get_one_request(self._buffer, self._limits)
            if one is not None:  # the usual single-block get; made without GetOne's Python-level __new__
                del self._buffer[: one[3]]
                return _make_tuple(GetOne, one[:3])
            put = decode_put_one_request(self._buffer, self._limits)
            if put is not None:  # the usual single-block put
                del self._buffer[: put[1]]
                self._start_payload(put[0].lengths[0])
                return put[0]
        elif self.state is not State.HELLO:
            raise LocalProtocolError(f"next_event while {self.state.value}")
        if len(self._buffer) < HEADER_SIZE:
            return NEED_DATA
        raw = bytes(self._buffer[:HEADER_SIZE])
        try:
            header = decode_header(raw, self._limits)
        except ProtocolError as exc:
            return self._refuse_stream(*header_identity(raw), exc)
        if self.state is State.HELLO and header.op != Op.HELLO:  # nothing more is read from an unproven peer
            return self._refuse_stream(header.request_id, header.request_op, AuthenticationError(NEEDS_TOKEN))
        if header.op == Op.HELLO and (header.meta_len > MAX_TOKEN_BYTES or header.payload_len):
            return self._refuse_stream(header.request_id, Op.HELLO, ProtocolError("a HELLO holds only a token"))
        end = HEADER_SIZE + header.meta_len
        if len(self._buffer) < end:
            return NEED_DATA
        meta = bytes(self._buffer[HEADER_SIZE:end])
        del self._buffer[:end]
        return self._decoded(header, meta)

    def _decoded(self, header: FrameHeader, meta: bytes) -> Event:
        try:
            if header.is_response:
                raise ProtocolError("a client sent a response frame")
            message = decode_message(header, meta, self._limits)
        except ProtocolError as exc:
            if self.state is State.HELLO:  # an unproven peer gets no second frame
                return self._refuse_stream(header.request_id, header.request_op, exc)
            self._start_payload(header.payload_len)
            return Refusal(header.request_id, header.request_op, exc, close=False)
        if isinstance(message, HelloRequest):
            return self._hello(message)
        if isinstance(message, PutRequest):
            self._start_payload(header.payload_len)
            return message
        assert isinstance(message, Request), message  # decode_message makes only requests of a request op
        return message

    def _hello(self, hello: HelloRequest) -> Hello | Refusal:
        identity = None if self._verify is None else self._verify(hello.token)
        if self._verify is not None and identity is None:
            return self._refuse_stream(hello.request_id, Op.HELLO, AuthenticationError("wrong token"))
        self.state = State.READY
        return Hello(hello.request_id, identity, hello.token if self._verify is not None else b"")

    def _refuse_stream(self, request_id: int, op: Op, error: KVPoolError) -> Refusal:
        self.state = State.CLOSED
        return Refusal(request_id, op, error, close=True)

    # -- a frame's payload -------------------------------------------------------

    def _start_payload(self, nbytes: int) -> None:
        self._payload_left = nbytes
        self.state = State.PAYLOAD if nbytes else State.READY

    @property
    def payload_left(self) -> int:
        """Payload bytes of the current frame not consumed yet (buffered or still on the way)."""
        return self._payload_left

    @property
    def payload_buffered(self) -> int:
        """Payload bytes of the current frame already buffered here."""
        return min(len(self._buffer), self._payload_left)

    def take_payload(self, target: memoryview) -> int:
        """Copy buffered payload bytes into ``target`` (up to its length); returns how many."""
        count = min(len(target), self.payload_buffered)
        if count:
            target[:count] = self._buffer[:count]
            del self._buffer[:count]
            self._consumed(count)
        return count

    def payload_received(self, nbytes: int) -> None:
        """The transport received ``nbytes`` of the payload itself, past this buffer."""
        if self._buffer and nbytes:
            raise LocalProtocolError("payload received around buffered payload bytes: take_payload first")
        if nbytes > self._payload_left:
            raise LocalProtocolError(f"{nbytes} payload bytes received, {self._payload_left} expected")
        self._consumed(nbytes)

    def _consumed(self, nbytes: int) -> None:
        if self.state is not State.PAYLOAD:
            raise LocalProtocolError(f"payload consumed while {self.state.value}")
        self._payload_left -= nbytes
        if not self._payload_left:
            self.state = State.READY
