"""What every test package shares: real daemons in separate processes, hypothesis's profiles."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import settings

from tests.support.daemon import DaemonProcess, start_daemon

# Engine suites import their engine, so they run in its own environment (tests/environments.py).
collect_ignore = [] if os.environ.get("KVPOOL_TEST_ENVIRONMENT") else ["engines"]

# Property tests draw from a fixed seed in CI, so a clean clone runs the same examples every time,
# and at random elsewhere (KVPOOL_HYPOTHESIS=random|ci chooses), which finds what the seed misses.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("random", print_blob=True)
settings.load_profile(os.environ.get("KVPOOL_HYPOTHESIS") or ("ci" if os.environ.get("CI") else "random"))


@pytest.hookimpl(trylast=True)  # after -m and -k chose theirs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the one-sided data plane's tests out of a run that has others: NIXL's UCX and ucxx's
    cannot share a process, so they run on their own (``-m nixl``, as deploy/dev.sh does)."""
    nixl = [item for item in items if item.get_closest_marker("nixl")]
    if nixl and len(nixl) < len(items):
        config.hook.pytest_deselected(items=nixl)
        items[:] = [item for item in items if not item.get_closest_marker("nixl")]


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
