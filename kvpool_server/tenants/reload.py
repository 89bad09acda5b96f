"""The credentials file as the daemon holds it: read again when it changes, the last good one kept.

Rotating a token or adding a tenant is writing the file (a Kubernetes Secret update swaps it
in place): a daemon reads it again at most every ``recheck_s`` when asked for the credentials,
and compares the bytes, not the modification time (a Secret's swap keeps neither size nor time
meaningful). A new version that does not parse is logged, once per version, and the
credentials loaded before stay in force: a typo never locks every tenant out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvpool_server.tenants.credentials import Credentials, CredentialsError, decode_credentials, read_file

log = logging.getLogger("kvpool.server")


class CredentialsFile:
    """The credentials in ``path``, reloaded on change.

    Args:
        cluster_token: the cluster's own token, a tenant with every right; None: none.
        recheck_s: most often the file is read again.

    Raises:
        CredentialsError: (at construction) the file cannot be read or parsed: the daemon does not start.
    """

    def __init__(
        self,
        path: str | Path,
        cluster_token: bytes | None,
        recheck_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self._cluster_token = cluster_token
        self._recheck_s = recheck_s
        self._clock = clock
        self._lock = threading.Lock()
        self._raw = self._read()
        self._credentials = self._parse(self._raw)
        self._refused: bytes | str | None = None  # the version last refused, or "unreadable": said once
        self._checked = clock()
        self.version = 1  # counts the versions loaded

    @property
    def loaded(self) -> Credentials:
        """The credentials in force, without looking at the file (for callers that must not wait on it)."""
        return self._credentials

    def current(self) -> Credentials:
        """The credentials in force, the file read again first when ``recheck_s`` passed."""
        with self._lock:
            now = self._clock()
            if now - self._checked >= self._recheck_s:
                self._checked = now
                self._reload()
            return self._credentials

    def _reload(self) -> None:
        try:
            raw = self._read()
        except CredentialsError as exc:
            self._refuse("unreadable", exc)
            return
        if raw == self._raw or raw == self._refused:
            return
        try:
            credentials = self._parse(raw)
        except CredentialsError as exc:
            self._refuse(raw, exc)
            return
        self._raw, self._credentials, self._refused = raw, credentials, None
        self.version += 1
        log.info("credentials reloaded", extra={"path": str(self.path), "tenants": len(credentials.tenants)})

    def _refuse(self, version: bytes | str, exc: CredentialsError) -> None:
        if version == self._refused:
            return
        self._refused = version
        log.error("the credentials file was refused; the loaded one stays in force", extra={"error": str(exc)})

    def _read(self) -> bytes:
        return read_file(self.path)

    def _parse(self, raw: bytes) -> Credentials:
        return decode_credentials(raw, self._cluster_token, str(self.path))
