"""Stopping a process a test started, and knowing it has stopped."""

from __future__ import annotations

import signal
import subprocess
import time


def pause(process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_s: float = 10.0) -> None:
    """SIGSTOP ``process`` and wait until it is stopped.

    kill() returns before a busy machine gets round to stopping the process, and a
    request sent meanwhile is still answered; a test of a hung node must not race that.
    """
    process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while _state(process.pid) not in ("T", "t"):
        assert time.monotonic() < deadline, f"process {process.pid} not stopped after {timeout_s} s"
        time.sleep(0.001)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]
