"""Child processes that Ctrl-C cannot kill half-way through start-up.

The terminal sends SIGINT to the whole process group. The benchmark's own children
must not die of it (least of all while still importing): the parent catches it and
shuts them down in order. So SIGINT is blocked while a child starts, and the child
ignores it before unblocking.
"""

from __future__ import annotations

import signal
from multiprocessing.process import BaseProcess

_SIGINT = {signal.SIGINT}


def start_shielded(process: BaseProcess) -> None:
    """Start ``process`` with SIGINT blocked; it inherits the mask across exec."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_sigint() -> None:
    """In a child started by :func:`start_shielded`: ignore SIGINT from now on, unblock it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGINT)
