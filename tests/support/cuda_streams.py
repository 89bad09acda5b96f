"""A recording double of ``torch.cuda``'s stream and event API, for ordering tests without a GPU.

It keeps what the real API keeps (each thread's current stream, which event a stream waits
for) and logs every call with the thread that made it, so a test can check that a copy was
issued on a stream that first waited for an event recorded on the engine's stream. A
stream's ``synchronize`` can be held, as a busy device holds it, to see what waits for it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Call:
    """One logged call: what, on which stream, the event involved, and the calling thread."""

    what: str
    stream: str
    event: int | None
    thread: str


class RecordingCuda:
    """The part of ``torch.cuda`` that :class:`~kvpool_client.integrations.vllm.streams.CudaOrder` uses."""

    def __init__(self) -> None:
        self.log: list[Call] = []
        self._changed = threading.Condition()
        self._local = threading.local()
        self._ids = itertools.count()
        self._held: dict[str, threading.Event] = {}  # thread-name prefix -> released when set
        recorder = self

        class Stream:
            def __init__(self, device: object = None, name: str | None = None) -> None:
                self.name = name or f"stream-{next(recorder._ids)}"

            def wait_event(self, event: Event) -> None:
                recorder._add("wait_event", self.name, event.id)

            def synchronize(self) -> None:
                recorder._add("synchronize", self.name, None)
                thread = threading.current_thread().name
                for prefix, released in list(recorder._held.items()):
                    if thread.startswith(prefix):
                        released.wait()

        class Event:
            def __init__(self) -> None:
                self.id = next(recorder._ids)

            def record(self, stream: Stream) -> None:
                recorder._add("record", stream.name, self.id)

        self.Stream = Stream
        self.Event = Event
        self.default = Stream(name="default")

    def current_stream(self, device: object = None) -> object:
        return getattr(self._local, "stream", self.default)

    @contextmanager
    def stream(self, stream: object) -> Iterator[None]:
        before = self.current_stream()
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = before

    def current_name(self) -> str:
        return str(self.current_stream().name)  # type: ignore[attr-defined]

    def hold(self, thread_prefix: str) -> threading.Event:
        """Make ``synchronize`` on threads named ``thread_prefix...`` wait until the returned event is set."""
        released = self._held[thread_prefix] = threading.Event()
        return released

    def note(self, what: str) -> None:
        """Log a copy (or anything else) issued now, on the calling thread's current stream."""
        self._add(what, self.current_name(), None)

    def wait_for(self, what: str, timeout: float = 10.0) -> None:
        """Block until a call named ``what`` was logged."""
        with self._changed:
            if not self._changed.wait_for(lambda: any(c.what == what for c in self.log), timeout):
                raise TimeoutError(f"no {what} within {timeout} s; log: {self.log}")

    def _add(self, what: str, stream: str, event: int | None) -> None:
        with self._changed:
            self.log.append(Call(what, stream, event, threading.current_thread().name))
            self._changed.notify_all()
