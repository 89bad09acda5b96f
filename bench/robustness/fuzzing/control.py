"""The gRPC fuzzer: typed-but-hostile and raw-byte messages to every method of ``kvpool.v1.KVPool``.

Also an unknown method, oversized messages, bad states for SetState (a drain is
always undone at once) and junk straight at the gRPC port.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing as mp
import random
import socket
import time
import traceback

import grpc

from bench.robustness.fuzzing.tally import Tally
from bench.robustness.fuzzing.target import MAX_KEYS, SERVICE
from kvpool_client.core.proto import kvpool_pb2 as pb

_METHODS = ("GetServerInfo", "Exists", "Lookup", "Delete", "GetStats", "SetState")


class GrpcFuzzer:
    """Typed-but-hostile and raw-byte messages to every control method; drains are undone at once."""

    def __init__(self, address: str, rng: random.Random, hang_timeout: float) -> None:
        self.address = address
        self.rng = rng
        self.timeout = hang_timeout
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
        self.calls = {m: self.channel.unary_unary(SERVICE + m) for m in (*_METHODS, "NoSuchMethod")}
        self.tally = Tally()

    def run(self, cases: int, deadline: float) -> Tally:
        makers = [(self.keys_request, 40), (self.raw_message, 30), (self.set_state, 6),
                  (self.no_fields, 10), (self.oversized, 1), (self.tcp_junk, 3)]  # fmt: skip
        while self.tally.sent < cases and time.monotonic() < deadline:
            (make,) = self.rng.choices([m for m, _ in makers], [w for _, w in makers])
            make()
        self.channel.close()
        return self.tally

    def call(self, kind: str, method: str, body: bytes) -> grpc.StatusCode:
        started = time.monotonic()
        try:
            self.calls[method](body, timeout=self.timeout)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
        outcome = "hang" if code is grpc.StatusCode.DEADLINE_EXCEEDED else code.name.lower()
        if outcome == "hang":
            self.tally.hangs.append(f"grpc {method} {body[:256].hex()}")
        self.tally.add(f"{kind}.{method}", outcome, time.monotonic() - started)
        return code

    def keys_request(self) -> None:
        ns = self.rng.choice(("fuzz@u8@raw@tp0of1", "", "n" * 255, "n" * 256, "é" * 128, "x" * 100_000, "\x00"))
        count = self.rng.choice((0, 1, 5, MAX_KEYS, MAX_KEYS + 1, 5_000, 100_000))
        size = self.rng.choice((0, 1, 32, 64, 65, 1000))
        count = min(count, (1 << 20) // max(size, 1))  # up to 1 MiB; see oversized() for more
        hashes = [self.rng.randbytes(size) for _ in range(min(count, 50))] * (count // 50 + 1)
        message = pb.KeysRequest(namespace=ns, hashes=hashes[:count])
        self.call("keys", self.rng.choice(("Exists", "Lookup", "Delete")), message.SerializeToString())

    def raw_message(self) -> None:
        valid = pb.KeysRequest(namespace="fuzz@u8@raw@tp0of1", hashes=[self.rng.randbytes(32)] * 3).SerializeToString()
        pick = self.rng.randrange(5)
        if pick == 0:
            body = self.rng.randbytes(self.rng.choice((1, 8, 100, 1000)))
        elif pick == 1:  # bit flips of a valid message
            body = bytearray(valid)
            body[self.rng.randrange(len(body))] ^= 1 << self.rng.randrange(8)
            body = bytes(body)
        elif pick == 2:  # a length prefix far beyond the message
            body = b"\x0a\xff\xff\xff\xff\x0f" + b"abc"
        elif pick == 3:  # invalid UTF-8 in the namespace string
            body = b"\x0a\x02\xff\xfe\x12\x01\x01"
        else:
            body = valid[: self.rng.randrange(len(valid))]
        self.call("raw", self.rng.choice((*_METHODS[:5], "NoSuchMethod")), body)

    def set_state(self) -> None:
        state = self.rng.choice(("", "DRAINING", "drain", "joining", "active", "x" * 10_000, "draining"))
        message = pb.SetStateRequest(state=state, handoff=self.rng.random() < 0.5)
        code = self.call("state", "SetState", message.SerializeToString())
        if state == "draining" and code is grpc.StatusCode.OK:  # never leave the node drained
            self.call("state", "SetState", pb.SetStateRequest(state="active").SerializeToString())

    def no_fields(self) -> None:
        method = self.rng.choice(("GetServerInfo", "GetStats"))
        self.call("info", method, self.rng.choice((b"", b"\x08\x01", b"\xfa\x01\x03abc")))

    def oversized(self) -> None:
        body = pb.KeysRequest(namespace="fuzz", hashes=[b"\x01" * 64] * 90_000).SerializeToString()  # ~5.9 MB
        self.call("oversized", self.rng.choice(("Exists", "Lookup", "Delete")), body)

    def tcp_junk(self) -> None:
        """Junk (or an HTTP/2 preface then junk) straight at the gRPC port; the server may keep it open."""
        host, _, port = self.address.rpartition(":")
        started = time.monotonic()
        try:
            with socket.create_connection((host, int(port)), timeout=1.0) as sock:
                preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" if self.rng.random() < 0.5 else b""
                sock.sendall(preface + self.rng.randbytes(self.rng.choice((1, 9, 100, 4000))))
                sock.settimeout(0.2)
                outcome = "closed" if not sock.recv(1 << 16) else "answered"
        except TimeoutError:
            outcome = "kept_open"
        except OSError:
            outcome = "closed"
        self.tally.add("tcp_junk.grpc_port", outcome, time.monotonic() - started)


def grpc_fuzzer(address: str, cases: int, seconds: float, seed: int, hang_timeout: float, out: mp.Queue) -> None:
    """Process entry: play gRPC cases; put the tally on ``out``."""
    try:
        deadline, threads = time.monotonic() + seconds, 4
        fuzzers = [GrpcFuzzer(address, random.Random(seed * 100 + i), hang_timeout) for i in range(threads)]
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            tallies = list(pool.map(lambda f: f.run(cases // threads, deadline).to_dict(), fuzzers))
        total = Tally()
        for tally in tallies:
            total.merge(tally)
        out.put(("grpc", total.to_dict()))
    except Exception:
        out.put(("grpc", {"failed": traceback.format_exc()}))
