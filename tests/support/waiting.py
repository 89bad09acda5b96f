"""Waiting on a condition with a deadline, for tests: never a fixed sleep.

A failure names what was awaited and shows the last thing seen, so a slow or wrong
run reads as "waited 10 s for X; last saw Y" rather than a bare ``assert False``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

STEP_S = 0.02


def wait_until(read: Callable[[], T], done: Callable[[T], bool], what: str, timeout_s: float = 10.0) -> T:
    """Call ``read`` until ``done`` accepts its value; returns that value.

    Raises:
        AssertionError: ``timeout_s`` passed; the message names ``what`` and the last value read.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        seen = read()
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s} s for {what}; last saw {seen!r}")
        time.sleep(STEP_S)


async def until(read: Callable[[], T], done: Callable[[T], bool], what: str, timeout_s: float = 10.0) -> T:
    """:func:`wait_until` for a test on an event loop: polls without blocking the loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = read()
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s} s for {what}; last saw {seen!r}")
        await asyncio.sleep(STEP_S)
