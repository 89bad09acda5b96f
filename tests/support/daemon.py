"""Real daemons for tests: re-exported from the library's local launcher."""

from collections.abc import Iterator
from contextlib import contextmanager

from bench.local.daemons import DaemonProcess, LocalCluster, start_daemon

__all__ = ["DaemonProcess", "LocalCluster", "running_daemon", "start_daemon"]


@contextmanager
def running_daemon(*args: str) -> Iterator[DaemonProcess]:
    """A daemon for the ``with`` block (a module's fixture): stopped, and its files removed, at its end."""
    daemon = start_daemon(*args)
    try:
        yield daemon
    finally:
        daemon.stop()
        daemon.remove_files()
