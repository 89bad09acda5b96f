"""Real daemons for tests: re-exported from the library's local launcher."""

from kvpool_server.local import DaemonProcess, LocalCluster, start_daemon

__all__ = ["DaemonProcess", "LocalCluster", "start_daemon"]
