"""TLS for the gRPC control plane and the TCP data plane, with certificates reloaded when their files change.

gRPC asks :meth:`CertificateFiles.fetch` at each new handshake, and the data plane
asks :meth:`CertificateFiles.server_context` at each new connection; both re-read
the files only when one of them changed (a Kubernetes Secret update swaps them), so
certificates rotate without a restart. A rotation caught half-way (a key that
does not match its certificate yet) keeps the previous pair until the next try.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from pathlib import Path

import grpc

log = logging.getLogger("kvpool.control.tls")

_Stamp = tuple[tuple[int, int], ...]


class CertificateFiles:
    """The server's certificate chain and key, and for mTLS the CA that signs client certificates.

    Raises:
        OSError: a file cannot be read at start.
    """

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str = "") -> None:
        self._paths = tuple(Path(p) for p in (cert_file, key_file, client_ca_file) if p)
        self._cert, self._key = Path(cert_file), Path(key_file)
        self._client_ca = Path(client_ca_file) if client_ca_file else None
        self._lock = threading.Lock()
        self._stamp = self._current_stamp()
        self._initial = self._configuration()
        self._context_stamp = self._stamp
        self._context = self._ssl_context()

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial,
            self.fetch,  # type: ignore[arg-type]  # types-grpcio omits the fetcher's None: "keep the current"
            require_client_authentication=self._client_ca is not None,
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """A new configuration if a file changed since the last one; None keeps the current."""
        with self._lock:
            try:
                stamp = self._current_stamp()
                if stamp == self._stamp:
                    return None
                configuration = self._configuration()
            except OSError as exc:
                log.error("cannot reload the TLS files; keeping the current ones", extra={"error": str(exc)})
                return None
            self._stamp = stamp
        log.info("TLS certificate reloaded", extra={"cert": str(self._cert)})
        return configuration

    def server_context(self) -> ssl.SSLContext:
        """The data plane's server context, rebuilt if a file changed since the last call."""
        with self._lock:
            try:
                stamp = self._current_stamp()
                if stamp != self._context_stamp:
                    self._context, self._context_stamp = self._ssl_context(), stamp
                    log.info("data-plane TLS certificate reloaded", extra={"cert": str(self._cert)})
            except (OSError, ssl.SSLError) as exc:
                log.error("cannot reload the TLS files; keeping the current ones", extra={"error": str(exc)})
            return self._context

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._cert, self._key)
        context.num_tickets = 0  # no resumption: a ticket arriving after the handshake would sit in a pooled socket
        if self._client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self._client_ca)
        return context

    def _current_stamp(self) -> _Stamp:
        return tuple((s.st_mtime_ns, s.st_size) for s in (os.stat(p) for p in self._paths))

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        pair = (self._key.read_bytes(), self._cert.read_bytes())
        roots = self._client_ca.read_bytes() if self._client_ca is not None else None
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=roots)
