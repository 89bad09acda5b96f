"""The well-behaved client: uses the daemon while it is fuzzed, and must see every byte right."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from dataclasses import dataclass, field

from bench.robustness.fuzzing.target import GOOD_NS
from kvpool_client import BlockKey, ClientConfig, ErrorCode, KVPoolClient


@dataclass
class GoodTally:
    """What the good client saw; any error, wrong byte or unexpected status is a finding."""

    puts: int = 0
    gets: int = 0
    bytes_verified: int = 0
    wrong_bytes: int = 0
    misses: int = 0
    refused_draining: int = 0  # puts answered DRAINING while the gRPC fuzzer had the node drained
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)


class GoodClient(threading.Thread):
    """Puts blocks keyed by the blake2b of their bytes and reads them back, checking each one."""

    def __init__(self, address: str, seed: int) -> None:
        super().__init__(name="good-client", daemon=True)
        self.address = address
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.tally = GoodTally()
        self.live: list[BlockKey] = []

    def run(self) -> None:
        config = ClientConfig(nodes=(self.address,), request_timeout_s=5.0)
        with KVPoolClient(config=config) as client:
            while not self.stop_event.is_set():
                try:
                    self._step(client)
                    time.sleep(0.002)  # a steady user, not a load generator: the CPUs are for the fuzzers
                except Exception as exc:  # any raise is an error the client should not see
                    self._error(f"{type(exc).__name__}: {exc}")

    def _step(self, client: KVPoolClient) -> None:
        if len(self.live) < 48 or self.rng.random() < 0.3:
            data = self.rng.randbytes(self.rng.choice((4096, 16384, 65536)))
            key = BlockKey(GOOD_NS, hashlib.blake2b(data, digest_size=32).digest())
            status = client.put([key], [data]).statuses[0]
            self.tally.puts += 1
            if status in (ErrorCode.OK, ErrorCode.ALREADY_EXISTS):
                self.live = [*self.live[-63:], key]
            elif status is ErrorCode.DRAINING:
                self.tally.refused_draining += 1
            else:
                self._error(f"put {key}: {status.name}")
            return
        keys = self.rng.sample(self.live, 4)
        got = client.get(keys)
        self.tally.gets += 1
        for key, status, buf in zip(keys, got.statuses, got.buffers, strict=True):
            self._check(key, status, buf)

    def _check(self, key: BlockKey, status: ErrorCode, buf: memoryview | None) -> None:
        if status is ErrorCode.NOT_FOUND:
            self.tally.misses += 1
        elif status is not ErrorCode.OK or buf is None:
            self._error(f"get {key}: {status.name}")
        elif hashlib.blake2b(buf, digest_size=32).digest() != key.hash:
            self.tally.wrong_bytes += 1
            self._error(f"get {key}: wrong bytes")
        else:
            self.tally.bytes_verified += len(buf)

    def _error(self, text: str) -> None:
        self.tally.errors += 1
        if len(self.tally.error_samples) < 20:
            self.tally.error_samples.append(text)
