"""The data-plane fuzzer: lanes of TCP connections, each playing cases one after another.

Most cases are followed by a PING sentinel and played until the sentinel is answered
(outcome ``ok`` or ``error_frame``) or the daemon closes the connection (``closed``);
some are cut by the client mid-frame (``client_closed``); some stop mid-frame and wait
for the daemon to drop them (``closed``). No answer and no close within the hang
timeout is a ``hang``; bytes that do not decode are a ``bad_response``.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import time
import traceback

from bench.robustness.fuzzing.cases import Case, CaseMaker
from bench.robustness.fuzzing.tally import Tally
from bench.robustness.fuzzing.target import IO_TIMEOUT_S, READ_LIMITS, SENTINEL_BASE
from kvpool_client.core.wire import (
    HEADER_SIZE,
    ErrorResponse,
    PingRequest,
    PingResponse,
    decode_header,
    decode_message,
    encode,
    payload_lengths,
)


class BadResponse(Exception):
    """The daemon sent bytes that do not decode as a frame: a daemon bug."""


async def read_frame(reader: asyncio.StreamReader, head: bytes) -> tuple[object, int]:
    """The rest of the frame whose header is ``head``: (message, request id)."""
    try:
        header = decode_header(head, READ_LIMITS)
        meta = await reader.readexactly(header.meta_len)
        message = decode_message(header, meta, READ_LIMITS)
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        raise
    except Exception as exc:
        raise BadResponse(f"{exc}: {head.hex()}") from exc
    await reader.readexactly(sum(payload_lengths(message)))
    return message, header.request_id


class Lane:
    """One connection's worth of cases, played one after another; reconnects after a close."""

    def __init__(self, host: str, port: int, hang_timeout: float, tally: Tally) -> None:
        self.host, self.port = host, port
        self.hang_timeout = hang_timeout
        self.tally = tally
        self.stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.sentinel = SENTINEL_BASE + random.getrandbits(32) * 1000

    async def play(self, case: Case) -> None:
        started = time.monotonic()
        try:
            outcome = await asyncio.wait_for(self._play(case), self.hang_timeout)
        except TimeoutError:
            outcome = "hang"
            self.tally.hangs.append(f"{case.kind} {case.mode} {case.data[:4096].hex()}")
            await self._drop()
        except BadResponse as exc:
            outcome = "bad_response"
            self.tally.bad_responses.append(f"{case.kind}: {exc} case={case.data[:4096].hex()}")
            await self._drop()
        except RuntimeError:  # uvloop: a write raced the daemon closing the connection
            outcome = "closed"
            await self._drop()
        self.tally.add(case.kind, outcome, time.monotonic() - started)

    async def _play(self, case: Case) -> str:
        if self.stream is None:
            self.stream = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.stream
        try:
            writer.write(case.data)
            if case.mode == "cut":
                await self._drop()
                return "client_closed"
            if case.mode == "answer":
                self._send_sentinel(writer)
            await writer.drain()
            return await self._await_outcome(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            await self._drop()
            return "closed"

    def _send_sentinel(self, writer: asyncio.StreamWriter) -> None:
        self.sentinel += 1
        writer.write(encode(PingRequest(self.sentinel)))

    async def _await_outcome(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
        """Frames until our sentinel PING is answered; the daemon closing ends it too (raises).

        A daemon waiting mid-frame must drop us after its stall timeout. One that is
        silent for three times that is therefore between frames: the case's bytes ended
        on a frame boundary, or a case length swallowed the sentinel. It is nudged with
        a fresh sentinel (at most three times); the caller's hang timeout bounds it all.
        """
        errored, nudges = False, 0
        while True:
            try:  # a wait cut short consumes nothing: readexactly takes bytes only once all are in
                head = await asyncio.wait_for(reader.readexactly(HEADER_SIZE), IO_TIMEOUT_S * 3)
            except TimeoutError:
                nudges += 1
                if nudges <= 3:
                    self._send_sentinel(writer)
                    await writer.drain()
                continue
            message, rid = await read_frame(reader, head)
            if isinstance(message, PingResponse) and rid == self.sentinel:
                outcome = "error_frame" if errored else "ok"
                return outcome + ("/nudged" if nudges else "")
            errored = errored or isinstance(message, ErrorResponse)

    async def _drop(self) -> None:
        if self.stream is not None:
            self.stream[1].close()
            self.stream = None


async def _run_lanes(address: str, cases: int, seconds: float, seed: int, lanes: int, hang_timeout: float) -> Tally:
    host, _, port = address.rpartition(":")
    tally, maker = Tally(), CaseMaker(random.Random(seed))
    deadline = time.monotonic() + seconds
    left = [cases]

    async def lane() -> None:
        runner = Lane(host, int(port), hang_timeout, tally)
        while left[0] > 0 and time.monotonic() < deadline:
            left[0] -= 1
            await runner.play(maker.next())
        await runner._drop()

    await asyncio.gather(*(lane() for _ in range(lanes)))
    return tally


def data_fuzzer(
    address: str, cases: int, seconds: float, seed: int, lanes: int, hang_timeout: float, out: mp.Queue
) -> None:
    """Process entry: play ``cases`` data-plane cases (or until ``seconds``); put the tally on ``out``."""
    import uvloop

    try:
        tally = uvloop.run(_run_lanes(address, cases, seconds, seed, lanes, hang_timeout))
        out.put(("data", tally.to_dict()))
    except Exception:
        out.put(("data", {"failed": traceback.format_exc()}))
