"""Fixtures shared by the integration tests: real daemons in separate processes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from tests.support.daemon import DaemonProcess, start_daemon

# Engine suites import their engine, so they run in its own environment (tests/environments.py).
collect_ignore = [] if os.environ.get("KVPOOL_TEST_ENVIRONMENT") else ["engines"]


@pytest.fixture
def daemon_factory() -> Iterator[Callable[..., DaemonProcess]]:
    """Start daemons with extra flags; all are stopped (and killed if stuck) at teardown."""
    started: list[DaemonProcess] = []

    def start(*args: str, **kwargs: object) -> DaemonProcess:
        daemon = start_daemon(*args, **kwargs)  # type: ignore[arg-type]
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()
        daemon.remove_files()


@pytest.fixture
def daemon(daemon_factory: Callable[..., DaemonProcess]) -> DaemonProcess:
    """One small daemon: 64 MiB arena in 1 MiB slabs."""
    return daemon_factory("--dram-capacity", "64MiB", "--slab-size", "1MiB")
