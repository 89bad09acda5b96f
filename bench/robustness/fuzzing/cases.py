"""Data-plane cases: raw bytes, random headers, valid requests and their mutations.

A case is bytes to play on a connection and how to play them. ``CaseMaker`` draws
them from a seeded RNG, one generator per kind of case, weighted; the mutations (bit
flips, header and meta fields at and over the daemon's limits, huge counts, wrong
ops, truncation, junk, splices) are applied to valid frames.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from bench.robustness.fuzzing.target import HEADER, LIMITS, MAX_FRAME, MAX_KEYS, SLAB
from kvpool_client.core import wire
from kvpool_client.core.wire import (
    HEADER_SIZE,
    DeleteRequest,
    ErrorResponse,
    ExistsRequest,
    GetRequest,
    GetResponse,
    Op,
    PingRequest,
    PingResponse,
    PutRequest,
    StatusResponse,
    encode,
)

LocateRequest = getattr(wire, "LocateRequest", None)  # same-node LOCATE, where the wire has it


@dataclass(frozen=True, slots=True)
class Case:
    """Bytes to play and how: ``answer`` (then a sentinel PING), ``cut`` (client closes) or ``stall``."""

    kind: str
    data: bytes
    mode: str = "answer"


def _interesting(limit: int, actual: int) -> list[int]:
    return [0, 1, actual, max(0, actual - 1), actual + 1, limit, limit + 1, limit * 2]


class CaseMaker:
    """Draws data-plane cases from a seeded RNG: one generator per kind of case, weighted."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._stored: list[tuple[str, bytes]] = []  # (ns, hash) of fuzz puts, so gets may hit
        self._makers: list[tuple[int, Callable[[], tuple[str, bytes]]]] = [
            (8, self.raw_bytes), (10, self.random_header), (20, self.valid), (40, self.mutated),
            (6, self.response_as_request), (6, self.pipeline), (1, self.at_limits),
        ]  # fmt: skip
        self._weights = [w for w, _ in self._makers]

    def next(self) -> Case:
        (make,) = self.rng.choices([m for _, m in self._makers], self._weights)
        kind, data = make()
        roll = self.rng.random()
        if roll < 0.05 and len(data) > 1:
            return Case(kind + "/cut", data[: self.rng.randrange(1, len(data))], "cut")
        if roll < 0.06 and len(data) > 1:
            return Case(kind + "/stall", data[: self.rng.randrange(1, len(data))], "stall")
        return Case(kind, data)

    # -- pieces --

    def namespace(self) -> str:
        r = self.rng.random()
        if r < 0.5:
            return "fuzz@u8@raw@tp0of1"
        if r < 0.7:
            return "".join(chr(self.rng.randrange(32, 0x2FFF)) for _ in range(self.rng.randrange(1, 60)))[:80]
        if r < 0.85:
            return "n" * 255
        return "é" * 127  # 254 bytes of two-byte characters

    def hashes(self, count: int) -> list[bytes]:
        size = self.rng.choice((1, 16, 32, 32, 32, 64))
        if self._stored and self.rng.random() < 0.3:
            picks = [h for _, h in self.rng.sample(self._stored, min(count, len(self._stored)))]
            if len({len(h) for h in picks}) == 1 and picks:
                return picks
        hashes = [self.rng.randbytes(size) for _ in range(count)]
        if count > 1 and self.rng.random() < 0.1:
            hashes[-1] = hashes[0]  # a duplicate key inside one request
        return hashes

    def count(self) -> int:
        return self.rng.choice((0, 1, 1, 2, 3, 8, MAX_KEYS))

    def request(self) -> tuple[str, object, bytes]:
        """A valid request (name, message, payload)."""
        op = self.rng.choice(("put", "put", "get", "get", "exists", "delete", "ping", "locate"))
        ns, rid = self.namespace(), self.rng.getrandbits(64)
        if op == "ping":
            return op, PingRequest(rid), b""
        hashes = self.hashes(self.count())
        if op == "put":
            sizes = (1, 7, 512, 4096, 65536, 0) if len(hashes) <= 2 else (1, 7, 512, 4096, 0)
            lengths = [self.rng.choice(sizes) for _ in hashes]
            depths = [self.rng.randrange(0, 1 << 32) for _ in hashes] if self.rng.random() < 0.3 else None
            self._stored.extend((ns, h) for h in hashes[:4])
            del self._stored[:-256]
            return op, PutRequest(rid, ns, hashes, lengths, depths), self.rng.randbytes(sum(lengths))
        if op == "exists":
            return op, ExistsRequest(rid, ns, hashes, prefix=self.rng.random() < 0.5), b""
        kind = {"get": GetRequest, "locate": LocateRequest or GetRequest}.get(op, DeleteRequest)
        return op, kind(rid, ns, hashes), b""

    def frame(self) -> tuple[str, bytes]:
        name, message, payload = self.request()
        return name, encode(message) + payload  # type: ignore[arg-type]

    # -- generators --

    def raw_bytes(self) -> tuple[str, bytes]:
        data = self.rng.randbytes(self.rng.choice((0, 1, 5, 27, 28, 29, 64, 200, 1000)))
        if self.rng.random() < 0.5 and len(data) >= 3:  # get past the magic check sometimes
            data = b"KV\x01" + data[3:]
        return "raw", data

    def random_header(self) -> tuple[str, bytes]:
        op = self.rng.choice((0, 1, 2, 3, 4, 5, 6, 0x7F, 0x81, 0x82, 0x85, 0xFF, self.rng.randrange(256)))
        meta_len = self.rng.choice([*_interesting(LIMITS.max_meta, self.rng.randrange(0, 300)), 2**32 - 1])
        payload_len = self.rng.choice([*_interesting(MAX_FRAME, self.rng.randrange(0, 300)), 2**64 - 1, 2**63])
        version = self.rng.choice((1, 1, 1, 0, 2, 255))
        header = HEADER.pack(b"KV", version, op, self.rng.choice((0, 0, 1, 0xFFFF)), 0,
                              self.rng.getrandbits(64), meta_len, payload_len)  # fmt: skip
        return "header", header + self.rng.randbytes(min(meta_len + min(payload_len, 512), 600))

    def valid(self) -> tuple[str, bytes]:
        name, data = self.frame()
        return "valid/" + name, data

    def mutated(self) -> tuple[str, bytes]:
        name, data = self.frame()
        buf = bytearray(data)
        applied = []
        for _ in range(self.rng.choice((1, 1, 2, 3))):
            mutation = self.rng.choice(_MUTATIONS)
            buf = mutation(self, buf)
            applied.append(mutation.__name__.lstrip("_"))
        return f"mutated/{name}/{'+'.join(applied)}", bytes(buf)

    def response_as_request(self) -> tuple[str, bytes]:
        rid = self.rng.getrandbits(64)
        choice = self.rng.randrange(4)
        if choice == 0:
            return "response", encode(StatusResponse(rid, self.rng.choice((Op.PUT, Op.EXISTS, Op.DELETE)), [0, 1, 2]))
        if choice == 1:
            return "response", encode(GetResponse(rid, [0, 1], [100, 0], [7, 0])) + bytes(100)
        if choice == 2:
            return "response", encode(ErrorResponse(rid, self.rng.choice(list(Op)), 10, "x" * 50))
        return "response", encode(PingResponse(rid))

    def pipeline(self) -> tuple[str, bytes]:
        return "pipeline", b"".join(self.frame()[1] for _ in range(self.rng.randrange(2, 6)))

    def at_limits(self) -> tuple[str, bytes]:
        """Requests exactly at, and one over, the daemon's limits."""
        rid, ns = self.rng.getrandbits(64), "fuzz@u8@raw@tp0of1"
        pick = self.rng.randrange(4)
        if pick == 0:
            return "limit/block", encode(PutRequest(rid, ns, [self.rng.randbytes(32)], [SLAB])) + bytes(SLAB)
        if pick == 1:
            return "limit/block+1", encode(PutRequest(rid, ns, [self.rng.randbytes(32)], [SLAB + 1])) + bytes(SLAB + 1)
        keys = MAX_KEYS + (pick == 3)
        return f"limit/keys{keys}", encode(GetRequest(rid, ns, [self.rng.randbytes(64) for _ in range(keys)]))


def _meta_offset(buf: bytearray) -> int:
    """Offset of ns_len in a request frame (EXISTS has a prefix byte first)."""
    return HEADER_SIZE + (1 if len(buf) > 3 and buf[3] == Op.EXISTS else 0)


def _bitflip(m: CaseMaker, buf: bytearray) -> bytearray:
    for _ in range(m.rng.choice((1, 1, 2, 8))):
        if buf:
            buf[m.rng.randrange(len(buf))] ^= 1 << m.rng.randrange(8)
    return buf


def _header_field(m: CaseMaker, buf: bytearray) -> bytearray:
    if len(buf) < HEADER_SIZE:
        return buf
    magic, version, op, status, reserved, rid, meta_len, payload_len = HEADER.unpack(buf[:HEADER_SIZE])
    which = m.rng.randrange(6)
    if which == 0:
        op = m.rng.choice((op | 0x80, (op % 5) + 1, 0, 6, m.rng.randrange(256)))
    elif which == 1:
        meta_len = m.rng.choice([*_interesting(LIMITS.max_meta, meta_len), 2**32 - 1])
    elif which == 2:
        payload_len = m.rng.choice([*_interesting(MAX_FRAME, payload_len), 2**64 - 1])
    elif which == 3:
        version = m.rng.choice((0, 2, 255))
    elif which == 4:
        status, reserved = m.rng.choice(((1, 0), (0, 0xFFFF), (0xFFFF, 1)))
    else:
        magic = m.rng.choice((b"kv", b"VK", b"\x00\x00"))
    meta_len, payload_len = meta_len & 0xFFFF_FFFF, payload_len & 0xFFFF_FFFF_FFFF_FFFF
    buf[:HEADER_SIZE] = HEADER.pack(magic, version, op, status, reserved, rid, meta_len, payload_len)
    return buf


def _meta_field(m: CaseMaker, buf: bytearray) -> bytearray:
    at = _meta_offset(buf)
    if len(buf) <= at + 1:
        return buf
    ns_len = buf[at]
    which = m.rng.randrange(3)
    if which == 0:
        buf[at] = m.rng.choice((0, 255, min(255, ns_len + 1), max(0, ns_len - 1)))
    elif which == 1 and len(buf) > at + 1 + ns_len:
        buf[at + 1 + ns_len] = m.rng.choice((0, 65, 255, 1))  # hash size
    elif len(buf) >= at + 6 + ns_len:
        count = m.rng.choice((MAX_KEYS, MAX_KEYS + 1, 2**32 - 1, 2**31, 0, 1000))
        buf[at + 2 + ns_len : at + 6 + ns_len] = count.to_bytes(4, "little")
    return buf


def _truncate(m: CaseMaker, buf: bytearray) -> bytearray:
    return buf[: m.rng.randrange(0, len(buf) + 1)]


def _junk(m: CaseMaker, buf: bytearray) -> bytearray:
    at = m.rng.randrange(0, len(buf) + 1)
    return buf[:at] + m.rng.randbytes(m.rng.choice((1, 4, 28, 100))) + buf[at:]


def _cut_out(m: CaseMaker, buf: bytearray) -> bytearray:
    if len(buf) < 2:
        return buf
    at = m.rng.randrange(len(buf) - 1)
    return buf[:at] + buf[at + m.rng.randrange(1, min(64, len(buf) - at) + 1) :]


def _splice(m: CaseMaker, buf: bytearray) -> bytearray:
    other = m.frame()[1]
    return buf[: m.rng.randrange(len(buf) + 1)] + other[m.rng.randrange(len(other) + 1) :]


_MUTATIONS = (_bitflip, _bitflip, _header_field, _header_field, _meta_field, _meta_field,
              _truncate, _junk, _cut_out, _splice)  # fmt: skip
