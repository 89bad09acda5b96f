"""The daemon under fuzz: its limits and flags, and probes of its liveness and memory.

Its limits are small (64 keys per request, 1 MiB blocks, 8 MiB frames, a 0.25 s stall
timeout) so that cases can reach every one of them cheaply.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import grpc

from kvpool_client.core.wire import HEADER_SIZE, PingRequest, WireLimits, encode
from tests.support.daemon import DaemonProcess

MAX_KEYS = 64
SLAB = 1 << 20
MAX_FRAME = 8 << 20
IO_TIMEOUT_S = 0.25
LIMITS = WireLimits(max_keys=MAX_KEYS, max_block_size=SLAB, max_payload=MAX_FRAME)
READ_LIMITS = WireLimits(max_keys=1 << 20, max_block_size=1 << 30, max_payload=1 << 40)
DAEMON_FLAGS = (
    "--dram-capacity", "128MiB", "--slab-size", "1MiB", "--no-prefault-arena",
    "--max-keys-per-request", str(MAX_KEYS), "--max-frame-bytes", "8MiB",
    "--io-timeout-s", str(IO_TIMEOUT_S), "--log-level", "error", "--metrics-port", "-1",
)  # fmt: skip
GOOD_NS = "fuzz-good@u8@raw@tp0of1"
SENTINEL_BASE = 0xF0F0_0000_0000_0000
HEADER = struct.Struct("<2sBBHHQIQ")
SERVICE = "/kvpool.v1.KVPool/"


@dataclass
class Memory:
    """The daemon's resident memory in KiB (/proc/PID/status); anon is the heap, shmem the arena."""

    rss_kib: int = 0
    anon_kib: int = 0
    shmem_kib: int = 0

    @classmethod
    def of(cls, pid: int) -> Memory:
        fields = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            fields[name] = int(value.split()[0]) if value.strip().endswith("kB") else 0
        return cls(fields.get("VmRSS", 0), fields.get("RssAnon", 0), fields.get("RssShmem", 0))


def answers_both_planes(daemon: DaemonProcess) -> bool:
    """The daemon answers a data-plane PING and GetServerInfo within 3 s."""
    if daemon.process.poll() is not None:
        return False
    try:
        with socket.create_connection(("127.0.0.1", daemon.data_port), timeout=3.0) as sock:
            sock.sendall(encode(PingRequest(7)))
            if len(sock.recv(HEADER_SIZE)) == 0:
                return False
        with grpc.insecure_channel(daemon.address) as channel:
            channel.unary_unary(SERVICE + "GetServerInfo")(b"", timeout=3.0)
        return True
    except (OSError, grpc.RpcError):
        return False
