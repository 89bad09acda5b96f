"""The bulk record parse finds exactly what the record-by-record walk finds, on sound and damaged runs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_server.tiers.record_columns import scan_columns
from kvpool_server.tiers.records import (
    RecordFlags,
    WalkResult,
    encode_record_header,
    payload_checksum,
    walk_records,
)


def record(namespace: bytes, block_hash: bytes, payload: bytes, tombstone: bool = False) -> bytes:
    flags = RecordFlags.TOMBSTONE if tombstone else RecordFlags.NONE
    header = encode_record_header(namespace, block_hash, len(payload), payload_checksum(payload), flags)
    return header + namespace + block_hash + payload


def walked(buf: bytes) -> tuple[list[tuple[int, bytes, bytes, int, bool]], WalkResult]:
    result = WalkResult()
    found = [
        (f.offset, f.namespace, f.hash, f.header.payload_len, f.header.flags == RecordFlags.TOMBSTONE)
        for f in walk_records(lambda at, n: buf[at : at + n], len(buf), False, result)
    ]
    return found, result


def scanned(buf: bytes) -> tuple[list[tuple[int, bytes, bytes, int, bool]], WalkResult]:
    result = WalkResult()
    columns = scan_columns(buf, len(buf), result)
    found = []
    for i in range(len(columns)):
        namespace = columns.namespaces[columns.namespace_ids[i]]
        block_hash = columns.hashes[i, : columns.hash_lens[i]].tobytes()
        found.append(
            (int(columns.offsets[i]), namespace, block_hash, int(columns.payload_lens[i]), bool(columns.tombstones[i]))
        )
    return found, result


records = st.lists(
    st.tuples(
        st.sampled_from([b"", b"a", b"model@bf16", b"a\0"]),
        st.binary(min_size=1, max_size=40),
        st.binary(max_size=80),
        st.booleans(),
    ),
    max_size=12,
)
damage = st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3)


@given(records, damage, st.integers(0, 200), st.binary(max_size=60))
@settings(max_examples=300, deadline=None)
def test_bulk_parse_agrees_with_the_walk(
    parts: list[tuple[bytes, bytes, bytes, bool]], flips: list[tuple[int, int]], cut: int, tail: bytes
) -> None:
    buf = bytearray(b"".join(record(ns, h, b"" if tomb else p, tomb) for ns, h, p, tomb in parts) + tail)
    for at, bits in flips:
        if buf:
            buf[at % len(buf)] ^= bits
    data = bytes(buf[: max(0, len(buf) - cut)] if cut < 100 else buf)
    expected, walk = walked(data)
    got, result = scanned(data)
    assert got == expected, f"bulk parse found {got}, the walk {expected}"
    assert result == walk, f"bulk parse ended {result}, the walk {walk}"


def test_bulk_parse_of_many_uniform_records_keeps_every_field() -> None:
    buf = b"".join(record(b"ns", i.to_bytes(32, "little"), bytes([i % 251]) * 16) for i in range(70_000))
    found, result = scanned(buf)
    assert len(found) == 70_000 and result.good_end == len(buf), result
    assert found[69_999][2] == (69_999).to_bytes(32, "little") and found[5][1] == b"ns"
