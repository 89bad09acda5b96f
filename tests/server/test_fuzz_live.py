"""A live daemon under fuzzed input on both planes (a short run of ``bench/robustness/fuzz.py``), and
frames drawn by hypothesis at a live data socket.

Invariants: the daemon neither crashes nor hangs on any case, answers only frames that
decode, logs no unhandled exception, keeps its memory bounded, and a well-behaved
client using it at the same time sees every byte right and no error.
"""

from __future__ import annotations

import shutil
import socket
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.robustness.fuzzing.run import FuzzSettings, run_fuzz
from bench.robustness.fuzzing.target import DAEMON_FLAGS, IO_TIMEOUT_S, MAX_KEYS, READ_LIMITS
from kvpool_client.core.wire import HEADER_SIZE, Op, PingRequest, PingResponse, decode_header, decode_message, encode
from tests.support.daemon import DaemonProcess, start_daemon

pytestmark = pytest.mark.integration

HEAP_GROWTH_LIMIT_KIB = 256 << 10  # the daemon's heap may grow this much over a run, not more
QUIET_S = IO_TIMEOUT_S * 4  # longer than the daemon waits for a stalled peer mid-frame


def test_short_fuzz_run_keeps_every_invariant() -> None:
    report = run_fuzz(FuzzSettings(cases=3000, seconds=20, lanes=64, grpc_share=0.15))
    detail = "\n".join(report.fuzzer_failures + report.hang_samples + report.bad_responses)
    assert not report.fuzzer_failures, detail
    assert report.cases_sent >= 2500, f"only {report.cases_sent} cases ran: {report.outcomes}"
    assert report.daemon_crashes == 0, f"daemon exited {report.daemon_exit}"
    assert report.hangs == 0, detail
    assert not report.bad_responses, detail
    assert report.handler_exceptions == 0, "unhandled exceptions in the daemon's log"
    assert report.grpc_handler_errors == 0, report.grpc["kinds"]
    assert report.alive_after
    outcomes = report.data_plane["outcomes"]
    assert outcomes.get("closed", 0) and outcomes.get("error_frame", 0) and outcomes.get("ok", 0), outcomes
    growth = report.memory_after["anon_kib"] - report.memory_before["anon_kib"]
    assert growth < HEAP_GROWTH_LIMIT_KIB, f"heap grew by {growth} KiB: {report.memory_after}"
    good = report.good_client
    assert good["puts"] > 0 and good["gets"] > 0 and good["bytes_verified"] > 0, good
    assert good["wrong_bytes"] == 0 and good["errors"] == 0, good["error_samples"]


# -- hypothesis at a live socket -----------------------------------------------------------------


@pytest.fixture(scope="module")
def node() -> Iterator[DaemonProcess]:
    shm = Path(tempfile.mkdtemp(prefix="kvfuzz-", dir="/dev/shm"))
    try:
        daemon = start_daemon(*DAEMON_FLAGS, "--shm-dir", str(shm))
        try:
            yield daemon
        finally:
            daemon.stop()
            daemon.remove_files()
    finally:
        shutil.rmtree(shm, ignore_errors=True)


_HEADER = struct.Struct("<2sBBHHQIQ")
ops = st.sampled_from([*[int(op) for op in Op], 0, 0x7F, *[int(op) | 0x80 for op in Op], 0xFF])
lengths = st.one_of(st.integers(0, 300), st.sampled_from([2**32 - 1, 1 << 20, (8 << 20) + 1, 2**64 - 1]))


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A header with hostile fields and a meta section of keys, counts and junk."""
    ns = draw(st.text(min_size=0, max_size=40)).encode()[:255]
    size = draw(st.integers(0, 70))
    count = draw(st.one_of(st.integers(0, 4), st.sampled_from([MAX_KEYS, MAX_KEYS + 1, 2**32 - 1])))
    body = bytes([len(ns)]) + ns + bytes([min(size, 255)]) + count.to_bytes(4, "little")
    body += draw(st.binary(max_size=min(count, 4) * size + 40))
    meta_len = draw(st.one_of(st.just(len(body)), lengths.filter(lambda n: n < 2**32)))
    payload_len = draw(st.one_of(st.just(0), lengths))
    header = _HEADER.pack(b"KV", draw(st.sampled_from([1, 1, 1, 0, 2])), draw(ops), draw(st.integers(0, 2)), 0,
                          draw(st.integers(0, 2**64 - 1)), meta_len, payload_len)  # fmt: skip
    return header + body[: draw(st.integers(0, len(body)))] if draw(st.booleans()) else header + body


def _read_until_sentinel_or_close(sock: socket.socket, sentinel: int) -> str:
    """'answered' when the sentinel PING comes back, 'closed' when the daemon closes first."""
    buffer = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionError:
            return "closed"
        if not chunk:
            return "closed"
        buffer += chunk
        while len(buffer) >= HEADER_SIZE:
            header = decode_header(buffer[:HEADER_SIZE], READ_LIMITS)  # a frame the daemon sent must decode
            end = HEADER_SIZE + header.meta_len
            if len(buffer) < end:
                break
            message = decode_message(header, buffer[HEADER_SIZE:end], READ_LIMITS)
            if len(buffer) < end + header.payload_len:
                break
            buffer = buffer[end + header.payload_len :]
            if isinstance(message, PingResponse) and message.request_id == sentinel:
                return "answered"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=frames())
def test_hypothesis_frames_are_answered_or_dropped(node: DaemonProcess, frame: bytes) -> None:
    """Any frame then a PING: the PING is answered, or the daemon closes within its stall timeout."""
    sentinel = 0xABCDEF
    with socket.create_connection(("127.0.0.1", node.data_port), timeout=QUIET_S) as sock:
        sock.sendall(frame)
        for _ in range(4):
            sock.sendall(encode(PingRequest(sentinel)))
            try:
                outcome = _read_until_sentinel_or_close(sock, sentinel)
                break
            except TimeoutError:
                # Silence is allowed only between frames (a length swallowed the sentinel
                # whole): mid-frame, the daemon drops a stalled peer after IO_TIMEOUT_S.
                continue
        else:
            pytest.fail(f"no answer and no close: {frame.hex()}")
    assert outcome in ("answered", "closed")
    assert node.process.poll() is None, node.log()
    with socket.create_connection(("127.0.0.1", node.data_port), timeout=5.0) as other:
        other.sendall(encode(PingRequest(1)))
        assert _read_until_sentinel_or_close(other, 1) == "answered", "another client stopped being served"
