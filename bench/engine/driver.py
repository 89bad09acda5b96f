"""Closed-loop users driving engine worker processes.

``concurrency`` users each play conversations from one shared queue, turn after
turn: a user sends its next turn the moment its previous answer is complete, so
exactly ``concurrency`` requests are in flight while conversations remain.

One worker serves a request whole; or, disaggregated, a prefill worker computes the
prompt and the first token and writes the prompt's blocks to the pool, then a decode
worker loads them, computes only the unblocked tail and generates the rest. TTFT is
measured from submission to the first token's sampling (both on ``time.monotonic``,
which all processes of a machine share).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from typing import Any

from bench.engine.request import Finished, FirstToken
from bench.engine.worker import (
    Collect,
    Configure,
    EngineSpec,
    EvictAll,
    Evicted,
    Ready,
    Stop,
    Submit,
    WorkerReport,
    serve,
)
from bench.engine.workload import Conversation, Workload
from bench.harness.procs import start_shielded

REPLY_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One completed request: its timings and what it reused."""

    conversation: int
    turn: int
    prompt_tokens: int
    output: tuple[int, ...]
    submitted: float
    first_token: float
    finished: float
    local_hit_tokens: int
    pool_hit_tokens: int
    loaded_bytes: int

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.submitted


@dataclass(slots=True)
class _InFlight:
    conversation: Conversation
    turn: int
    prompt: list[int]
    submitted: float
    first_token: float | None = None
    prefill: Finished | None = None  # the prefill worker's part, when disaggregated


class Workers:
    """Engine worker processes (spawned) sharing one reply queue; a context manager.

    Args:
        names: one worker per name.
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        ctx = mp.get_context("spawn")
        self.replies: Queue[Any] = ctx.Queue()
        self.inboxes: dict[str, Queue[Any]] = {n: ctx.Queue() for n in names}
        self._procs: list[SpawnProcess] = []
        for name in names:
            proc = ctx.Process(target=serve, args=(name, self.inboxes[name], self.replies), name=f"engine-{name}")
            start_shielded(proc)
            self._procs.append(proc)

    def send(self, name: str, message: Any) -> None:
        self.inboxes[name].put(message)

    def receive(self) -> tuple[str, Any]:
        """The next reply as (worker name, payload).

        Raises:
            RuntimeError: a worker died, or nothing came for :data:`REPLY_TIMEOUT_S`.
        """
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                return self.replies.get(timeout=1.0)  # type: ignore[no-any-return]
            except queue.Empty:  # check the workers are alive
                dead = [p.name for p in self._procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"engine worker(s) died: {dead}") from None
        raise RuntimeError("no reply from the engine workers in time")

    def call(self, name: str, message: Any, expect: type) -> Any:
        """Send ``message`` to an idle worker and return its reply of type ``expect``."""
        self.send(name, message)
        who, payload = self.receive()
        if who != name or not isinstance(payload, expect):
            raise RuntimeError(f"expected {expect.__name__} from {name}, got {payload!r} from {who}")
        return payload

    def configure(self, name: str, spec: EngineSpec) -> None:
        self.call(name, Configure(spec), Ready)

    def collect(self, name: str) -> WorkerReport:
        return self.call(name, Collect(), WorkerReport)  # type: ignore[no-any-return]

    def evict_all(self, name: str) -> int:
        return self.call(name, EvictAll(), Evicted).blocks  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the workers (idempotent); a worker that does not exit in 15 s is killed."""
        for proc, inbox in zip(self._procs, self.inboxes.values(), strict=True):
            if proc.is_alive():
                inbox.put(Stop())
        for proc in self._procs:
            proc.join(15)
            if proc.is_alive():
                proc.kill()
                proc.join(5)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class ClosedLoop:
    """The users of one run.

    Args:
        workload: the conversations.
        concurrency: users.
        workers: the engine processes.
        prefill: the worker that receives new requests.
        decode: the decode worker when disaggregated, else None.
    """

    workload: Workload
    concurrency: int
    workers: Workers
    prefill: str
    decode: str | None = None
    records: list[RequestRecord] = field(default_factory=list)
    _queue: deque[Conversation] = field(default_factory=deque)
    _flight: dict[str, _InFlight] = field(default_factory=dict)

    def run(self) -> list[RequestRecord]:
        """Play every conversation; returns one record per request, in completion order."""
        self._queue = deque(self.workload.conversations)
        for _ in range(min(self.concurrency, len(self._queue))):
            self._start_conversation()
        while self._flight:
            who, payload = self.workers.receive()
            if not isinstance(payload, list):
                raise RuntimeError(f"unexpected reply from {who}: {payload!r}")
            for event in payload:
                self._on_event(who, event)
        return self.records

    def _start_conversation(self) -> None:
        conversation = self._queue.popleft()
        self._start(conversation, 0, self.workload.first_prompt(conversation))

    def _start(self, conversation: Conversation, turn: int, prompt: list[int]) -> None:
        rid = f"{conversation.cid}.{turn}"
        now = time.monotonic()
        self._flight[rid] = _InFlight(conversation, turn, prompt, now)
        tokens = 1 if self.decode is not None else self.workload.spec.output_tokens
        self.workers.send(self.prefill, Submit(rid, prompt, tokens, now))

    def _on_event(self, who: str, event: FirstToken | Finished) -> None:
        flight = self._flight[event.rid]
        if isinstance(event, FirstToken):
            flight.first_token = flight.first_token or event.at
        elif self.decode is not None and who == self.prefill:
            flight.prefill = event
            rest = self.workload.spec.output_tokens - len(event.output)
            self.workers.send(self.decode, Submit(event.rid, flight.prompt + list(event.output), rest, event.at))
        else:
            self._complete(event.rid, flight, event)

    def _complete(self, rid: str, flight: _InFlight, last: Finished) -> None:
        del self._flight[rid]
        parts = [p for p in (flight.prefill, last) if p is not None]
        first = parts[0]  # the stage that saw the user's prompt: its hits decide the TTFT
        output = tuple(t for p in parts for t in p.output)
        assert flight.first_token is not None
        self.records.append(
            RequestRecord(
                flight.conversation.cid,
                flight.turn,
                len(flight.prompt),
                output,
                flight.submitted,
                flight.first_token,
                last.at,
                first.local_hit_tokens,
                first.pool_hit_tokens,
                sum(p.loaded_bytes for p in parts),
            )
        )
        conversation, turn = flight.conversation, flight.turn + 1
        if turn < len(conversation.messages):
            prompt = Workload.next_prompt(conversation, turn, flight.prompt, output)
            self._start(conversation, turn, prompt)
        elif self._queue:
            self._start_conversation()
