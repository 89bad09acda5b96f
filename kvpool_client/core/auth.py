"""How a client proves itself to nodes and trusts them: the shared token and TLS.

One token per cluster, in a file (a Kubernetes Secret mounted read-only, for
example). Data connections prove it in a HELLO frame, gRPC calls in the
``authorization`` metadata; the daemon compares in constant time. The gRPC
control plane may also run over TLS, with client certificates (mTLS).
"""

from __future__ import annotations

import collections
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kvpool_client.core.errors import UsageError
from kvpool_client.core.wire.frames import MAX_TOKEN_BYTES

MIN_TOKEN_BYTES = 16
METADATA_KEY = "authorization"
_SCHEME = "Bearer "


def read_token(path: str | Path) -> bytes:
    """The token in ``path``, without surrounding whitespace.

    Raises:
        UsageError: the file cannot be read, or the token is not 16..1024 bytes
            of printable ASCII.
    """
    try:
        token = Path(path).read_bytes().strip()
    except OSError as exc:
        raise UsageError(f"cannot read the token file {path}: {exc.strerror}") from None
    if not MIN_TOKEN_BYTES <= len(token) <= MAX_TOKEN_BYTES:
        raise UsageError(f"the token in {path} must be {MIN_TOKEN_BYTES}..{MAX_TOKEN_BYTES} bytes, not {len(token)}")
    if not all(32 < byte < 127 for byte in token):  # it travels as gRPC metadata too
        raise UsageError(f"the token in {path} must be printable ASCII without spaces")
    return token


def call_metadata(token: bytes | None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata proving ``token`` (none without a token)."""
    if token is None:
        return ()
    return ((METADATA_KEY, _SCHEME + token.decode("latin-1")),)


def token_in(metadata: tuple[tuple[str, str | bytes], ...] | None) -> bytes | None:
    """The token a call's metadata carries, if any."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and value.startswith(_SCHEME):
            return value[len(_SCHEME) :].encode("latin-1")
    return None


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    """A call's details with the token added (grpc wants a ClientCallDetails instance)."""


class TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the token to every call of a blocking channel."""

    def __init__(self, token: bytes) -> None:
        self._metadata = call_metadata(token)

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = (*(details.metadata or ()), *self._metadata)
        return _CallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready, details.compression
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._with_token(client_call_details), request)


class AsyncTokenInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds the token to every unary call of an asyncio channel."""

    def __init__(self, token: bytes) -> None:
        self._metadata = call_metadata(token)

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        details = client_call_details
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        with_token = grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )
        return await continuation(with_token, request)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for TLS to a gRPC server: a node's control port, or etcd.

    ``ca_file`` verifies the server's certificate (whose names must include the
    address dialled; empty: the system's roots); ``cert_file`` and ``key_file``
    are this client's, for servers that require client certificates (mTLS).
    """

    ca_file: str
    cert_file: str = ""
    key_file: str = ""

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Raises UsageError: a file cannot be read, or only one of cert and key is given."""
        if bool(self.cert_file) != bool(self.key_file):
            raise UsageError("a client certificate needs both cert_file and key_file")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file) if self.ca_file else None,
            private_key=_read(self.key_file) if self.key_file else None,
            certificate_chain=_read(self.cert_file) if self.cert_file else None,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A client context for a node's TLS data plane, from the same files.

        Raises:
            UsageError: a file cannot be read or does not hold what it should.
        """
        if bool(self.cert_file) != bool(self.key_file):
            raise UsageError("a client certificate needs both cert_file and key_file")
        try:
            context = ssl.create_default_context(cafile=self.ca_file or None)
            if self.cert_file:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"cannot load the TLS files {self}: {exc}") from None
        return context


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client presents to nodes: the shared token, TLS, both or neither."""

    token: bytes | None = field(default=None, repr=False)
    tls: TlsFiles | None = None


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def open_channel(address: str, credentials: Credentials) -> grpc.Channel:
    """A blocking gRPC channel to a node, over TLS and carrying the token as configured."""
    if credentials.tls is not None:
        channel = grpc.secure_channel(address, credentials.tls.channel_credentials())
    else:
        channel = grpc.insecure_channel(address)
    if credentials.token is None:
        return channel
    return grpc.intercept_channel(channel, TokenInterceptor(credentials.token))


def open_aio_channel(address: str, credentials: Credentials) -> grpc.aio.Channel:
    """An asyncio gRPC channel to a node, over TLS and carrying the token as configured."""
    interceptors = [AsyncTokenInterceptor(credentials.token)] if credentials.token is not None else None
    if credentials.tls is not None:
        return grpc.aio.secure_channel(address, credentials.tls.channel_credentials(), interceptors=interceptors)
    return grpc.aio.insecure_channel(address, interceptors=interceptors)
