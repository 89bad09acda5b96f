"""Data-plane worker loops: several uvloop event loops, one thread each.

Moving block bytes is kernel copying inside ``sendmsg``/``recvmsg_into``, which
releases the GIL. With one loop, one core copies while the other waits; with a
loop per core, connections on different loops copy in parallel. Each connection
lives on one worker loop for its whole life, so a session never crosses threads;
only the DRAM tier is shared, and it locks its own bookkeeping.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterable
from typing import Any

import uvloop


async def cancel_and_wait(connections: Iterable[concurrent.futures.Future[None]], timeout: float) -> None:
    """Cancel connections served on worker loops and wait, off this loop, at most ``timeout`` for them to end."""
    pending = list(connections)
    for future in pending:
        future.cancel()
    if pending:
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: concurrent.futures.wait(pending, timeout=timeout)
        )


class LoopThread:
    """An event loop running on its own thread until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        """Run ``coro`` on this loop; the future can be cancelled from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float) -> None:
        """Stop the loop and join its thread; give up waiting after ``timeout`` seconds."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
