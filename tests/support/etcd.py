"""A real etcd for tests: the library's local launcher, a context manager and a fixture.

``local_etcd()`` (and the ``etcd`` fixture built on it) runs a fresh single-member etcd
on free loopback ports in a temp dir; ``stop()`` / ``start()`` restart it on the same
ports and data (an outage), ``pause()`` / ``resume()`` hang it. Its process is always
killed and its directory removed at exit. To share the fixture, import it in
``conftest.py``: ``from tests.support.etcd import etcd``.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

import pytest

from bench.local.etcd import DEFAULT_BINARY, EtcdStartError, LocalEtcd, free_port

__all__ = ["DEFAULT_BINARY", "EtcdStartError", "LocalEtcd", "etcd", "free_port", "local_etcd", "requires_etcd"]

requires_etcd = pytest.mark.skipif(
    shutil.which(DEFAULT_BINARY) is None and shutil.which("etcd") is None,
    reason="etcd binary not installed (apt-get install etcd-server)",
)


@contextlib.contextmanager
def local_etcd() -> Iterator[LocalEtcd]:
    """A running throwaway etcd; killed and its directory removed on exit, whatever happens."""
    server = LocalEtcd()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def etcd() -> Iterator[LocalEtcd]:
    """A running throwaway etcd per test (see :func:`local_etcd`)."""
    with local_etcd() as server:
        yield server
