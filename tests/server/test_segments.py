"""The SSD tier's record codec and segment log, on real files in tmp_path."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvpool_server.tiers.segments as segments_module
from kvpool_server.tiers.records import (
    HEADER_SIZE,
    MAX_HASH_LEN,
    MAX_NAMESPACE_LEN,
    MAX_PAYLOAD_LEN,
    CorruptRecord,
    WalkResult,
    WalkStop,
    decode_record_header,
    encode_record_header,
    key_checksum,
    payload_checksum,
    split_key,
    walk_records,
)
from kvpool_server.tiers.segment_files import segment_name
from kvpool_server.tiers.segments import SegmentLog, SegmentMissing
from kvpool_server.tiers.spans import RecordAddress, chunk_span, plan_spans

# -- codec --------------------------------------------------------------------

namespaces = st.binary(min_size=0, max_size=MAX_NAMESPACE_LEN)
hashes = st.binary(min_size=1, max_size=MAX_HASH_LEN)
payload_lens = st.integers(0, MAX_PAYLOAD_LEN)
checksums = st.integers(0, (1 << 64) - 1)


@given(namespaces, hashes, payload_lens, checksums)
def test_header_round_trip(ns: bytes, hash_: bytes, length: int, checksum: int) -> None:
    raw = encode_record_header(ns, hash_, length, checksum)
    assert len(raw) == HEADER_SIZE
    header = decode_record_header(raw + b"trailing bytes are ignored")
    assert (header.namespace_len, header.hash_len) == (len(ns), len(hash_))
    assert (header.payload_len, header.payload_checksum) == (length, checksum)
    assert header.record_len == HEADER_SIZE + len(ns) + len(hash_) + length
    assert split_key(header, ns + hash_) == (ns, hash_)


@given(st.binary(max_size=HEADER_SIZE * 2))
def test_random_bytes_decode_only_to_corrupt_record(raw: bytes) -> None:
    with contextlib.suppress(CorruptRecord):
        decode_record_header(raw)


@given(namespaces, hashes, payload_lens, st.data())
def test_truncated_or_flipped_header_is_corrupt(ns: bytes, hash_: bytes, length: int, data: st.DataObject) -> None:
    raw = bytearray(encode_record_header(ns, hash_, length, 7))
    cut = data.draw(st.integers(0, HEADER_SIZE - 1))
    with pytest.raises(CorruptRecord):
        decode_record_header(raw[:cut])
    position = data.draw(st.integers(0, HEADER_SIZE - 1))
    raw[position] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(CorruptRecord):
        decode_record_header(raw)


@given(namespaces, hashes, st.data())
def test_flipped_key_byte_fails_key_checksum(ns: bytes, hash_: bytes, data: st.DataObject) -> None:
    header = decode_record_header(encode_record_header(ns, hash_, 0, 0))
    key = bytearray(ns + hash_)
    key[data.draw(st.integers(0, len(key) - 1))] ^= 0x80
    with pytest.raises(CorruptRecord):
        split_key(header, key)
    with pytest.raises(CorruptRecord):
        split_key(header, (ns + hash_)[:-1])


@pytest.mark.parametrize(
    ("ns_len", "hash_len", "payload_len"),
    [(MAX_NAMESPACE_LEN + 1, 1, 0), (0, 0, 0), (0, MAX_HASH_LEN + 1, 0), (0, 1, MAX_PAYLOAD_LEN + 1), (0, 1, -1)],
)
def test_encode_rejects_out_of_bounds(ns_len: int, hash_len: int, payload_len: int) -> None:
    with pytest.raises(ValueError):
        encode_record_header(b"n" * ns_len, b"h" * hash_len, payload_len, 0)


def test_checksums_are_stable() -> None:
    # The on-disk format depends on these exact functions: pin them.
    assert payload_checksum(b"") == 0x2D06800538D394C2
    assert key_checksum(b"ns", b"h") == key_checksum(b"n", b"sh")


# -- segment log ----------------------------------------------------------------


def _payload(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def _read(log: SegmentLog, location: RecordAddress, size: int) -> bytes:
    target = bytearray(size)
    log.read_into(location, memoryview(target))
    return bytes(target)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("fsync", [False, True])
def test_append_read_round_trip_several_sizes(tmp_path: Path, fsync: bool) -> None:
    sizes = [0, 1, 7, 4096, 65537, 1 << 20]
    with SegmentLog(tmp_path, 4 << 20, fsync=fsync) as log:
        locations = [log.append("ns", f"h{i}".encode(), memoryview(_payload(i, n))) for i, n in enumerate(sizes)]
        for i, (n, loc) in enumerate(zip(sizes, locations, strict=True)):
            assert _read(log, loc, n) == _payload(i, n)
        target = bytearray(sizes[3])
        log.read_into(locations[3], memoryview(target), key=("ns", b"h3"))
        with pytest.raises(CorruptRecord):
            log.read_into(locations[3], memoryview(target), key=("ns", b"other"))
        with pytest.raises(ValueError):
            log.read_into(locations[3], memoryview(bytearray(sizes[3] + 100)))


def test_segment_rolls_over_when_full(tmp_path: Path) -> None:
    record = HEADER_SIZE + 2 + 2 + 1000
    with SegmentLog(tmp_path, record * 3, fsync=False) as log:
        locations = [log.append("ns", b"h%d" % i, _payload(i, 1000)) for i in range(7)]
        assert [loc.segment_id for loc in locations] == [1, 1, 1, 2, 2, 2, 3]
        assert [loc.offset for loc in locations[:4]] == [0, record, 2 * record, 0]
        assert sorted(p.name for p in tmp_path.iterdir()) == [segment_name(i) for i in (1, 2, 3)]
        assert segment_name(2) == "000000000002.seg"
        assert log.stats().segments == 3 and log.stats().bytes == 7 * record
        with pytest.raises(ValueError):
            log.append("ns", b"h", bytes(record * 3))


def test_scan_after_reopen_returns_every_record(tmp_path: Path) -> None:
    expected = {}
    with SegmentLog(tmp_path, 64 << 10, fsync=False) as log:
        for i in range(60):
            payload = _payload(i, 100 * i)
            loc = log.append(f"ns{i % 3}", b"hash-%d" % i, payload)
            expected[(f"ns{i % 3}", b"hash-%d" % i)] = (loc, payload)
    with SegmentLog(tmp_path, 64 << 10, fsync=False) as log:
        for verify in (False, True):
            entries = list(log.scan(verify=verify))
            assert [e.key for e in entries] == list(expected)
            for entry in entries:
                loc, payload = expected[entry.key]
                assert entry.location == loc and entry.payload_len == len(payload)
                assert entry.checksum == payload_checksum(payload)
                assert _read(log, entry.location, entry.payload_len) == payload
        assert log.stats().corrupt_records == 0 and log.stats().truncated_bytes == 0
        # Appends resume in the last segment, after its last record.
        last = entries[-1].location
        assert log.append("ns", b"more", b"x").segment_id == last.segment_id


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE + 3, 500])
def test_torn_tail_is_dropped_and_truncated(tmp_path: Path, cut: int) -> None:
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        kept = [log.append("ns", b"k%d" % i, _payload(i, 1000)) for i in range(3)]
        torn = log.append("ns", b"torn", _payload(9, 1000))
    path = tmp_path / segment_name(torn.segment_id)
    os.truncate(path, torn.offset + cut)
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        assert path.stat().st_size == torn.offset
        assert log.stats().truncated_bytes == cut
        assert [e.location for e in log.scan()] == kept
        new = log.append("ns", b"after", b"fresh")
        assert new.offset == torn.offset
        assert [e.key[1] for e in log.scan()] == [b"k0", b"k1", b"k2", b"after"]
        assert log.stats().corrupt_records == 0


def test_zero_filled_tail_is_torn_not_corrupt(tmp_path: Path) -> None:
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        loc = log.append("ns", b"k", b"payload")
    path = tmp_path / segment_name(loc.segment_id)
    with open(path, "ab") as f:
        f.write(bytes(5000))
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        assert path.stat().st_size == loc.length
        assert [e.location for e in log.scan()] == [loc]
        assert log.stats().corrupt_records == 0


def test_flipped_payload_byte_is_never_served(tmp_path: Path) -> None:
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        good = log.append("ns", b"good", _payload(1, 4096))
        bad = log.append("ns", b"bad", _payload(2, 4096))
        after = log.append("ns", b"after", _payload(3, 4096))
        _flip(tmp_path / segment_name(bad.segment_id), bad.offset + bad.length - 10)
        with pytest.raises(CorruptRecord):
            _read(log, bad, 4096)
        assert _read(log, good, 4096) == _payload(1, 4096)
        # Headers are intact: a plain scan lists it, a verifying scan skips and counts it.
        assert [e.key[1] for e in log.scan()] == [b"good", b"bad", b"after"]
        assert log.stats().corrupt_records == 0
        assert [e.location for e in log.scan(verify=True)] == [good, after]
        assert log.stats().corrupt_records == 1


def test_flipped_key_byte_skips_only_that_record(tmp_path: Path) -> None:
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        locs = [log.append("ns", b"k%d" % i, _payload(i, 100)) for i in range(3)]
        _flip(tmp_path / segment_name(1), locs[1].offset + HEADER_SIZE + 1)
        assert [e.location for e in log.scan()] == [locs[0], locs[2]]
        assert log.stats().corrupt_records == 1
        with pytest.raises(CorruptRecord):
            _read(log, locs[1], 100)


def test_flipped_header_byte_loses_rest_of_segment_only(tmp_path: Path) -> None:
    record = HEADER_SIZE + 2 + 2 + 100
    with SegmentLog(tmp_path, record * 4, fsync=False) as log:
        locs = [log.append("ns", b"k%d" % i, _payload(i, 100)) for i in range(8)]
    assert {loc.segment_id for loc in locs} == {1, 2}
    _flip(tmp_path / segment_name(1), locs[1].offset + 12)  # payload length field
    with SegmentLog(tmp_path, record * 4, fsync=False) as log:
        assert [e.location for e in log.scan()] == [locs[0], *locs[4:]]
        stats = log.stats()
        assert (stats.corrupt_records, stats.lost_bytes) == (1, 3 * record)
        # Records after the bad header are intact, only unfindable by a scan.
        assert _read(log, locs[2], 100) == _payload(2, 100)


def test_corrupt_header_at_tail_starts_new_segment(tmp_path: Path) -> None:
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        locs = [log.append("ns", b"k%d" % i, b"v" * 50) for i in range(2)]
    _flip(tmp_path / segment_name(1), locs[1].offset)
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        assert log.active_segment_id == 2
        assert (tmp_path / segment_name(1)).stat().st_size == 2 * locs[0].length  # not truncated
        new = log.append("ns", b"new", b"w")
        assert [e.location for e in log.scan()] == [locs[0], new]
        assert log.stats().corrupt_records == 1


def test_delete_segment(tmp_path: Path) -> None:
    record = HEADER_SIZE + 2 + 2 + 10
    with SegmentLog(tmp_path, record * 2, fsync=True) as log:
        locs = [log.append("ns", b"k%d" % i, b"0123456789") for i in range(5)]
        assert log.segment_ids() == [1, 2, 3]
        log.delete_segment(1)
        assert not (tmp_path / segment_name(1)).exists()
        assert log.segment_ids() == [2, 3] and log.stats().bytes == 3 * record
        with pytest.raises(SegmentMissing):
            _read(log, locs[0], 10)
        with pytest.raises(SegmentMissing):
            log.delete_segment(1)
        with pytest.raises(ValueError):
            log.delete_segment(3)  # active
        assert [e.location for e in log.scan()] == locs[2:]
    with SegmentLog(tmp_path, record * 2, fsync=True) as log:
        assert [e.location for e in log.scan()] == locs[2:]
        assert log.append("ns", b"k5", b"0123456789") == RecordAddress(3, record, record)
        assert log.append("ns", b"k6", b"0123456789").segment_id == 4


def test_delete_during_scan_keeps_the_open_segment_readable(tmp_path: Path) -> None:
    record = HEADER_SIZE + 2 + 2 + 10
    with SegmentLog(tmp_path, record * 2, fsync=False) as log:
        locs = [log.append("ns", b"k%d" % i, b"0123456789") for i in range(5)]
        scan = log.scan()
        first = next(scan)  # segment 1 is now held by the scan
        log.delete_segment(1)
        log.delete_segment(2)
        rest = [e.location for e in scan]
        assert [first.location, *rest] == [locs[0], locs[1], locs[4]]


def test_concurrent_appends_and_reads(tmp_path: Path) -> None:
    with SegmentLog(tmp_path, 256 << 10, fsync=False) as log:
        errors: list[BaseException] = []

        def work(worker: int) -> None:
            try:
                for i in range(100):
                    payload = _payload(worker * 1000 + i, 1000 + i)
                    loc = log.append("ns", b"%d-%d" % (worker, i), payload)
                    assert _read(log, loc, len(payload)) == payload
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(list(log.scan(verify=True))) == 400
        assert log.stats().corrupt_records == 0


def test_failed_write_leaves_log_usable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        first = log.append("ns", b"a", b"first")
        real = os.pwritev

        def half_then_fail(fd: int, buffers: list[memoryview], offset: int) -> int:
            real(fd, [buffers[0][: HEADER_SIZE // 2]], offset)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "pwritev", half_then_fail)
        with pytest.raises(OSError):
            log.append("ns", b"b", b"second")
        monkeypatch.setattr(os, "pwritev", real)
        assert (tmp_path / segment_name(1)).stat().st_size == first.length
        third = log.append("ns", b"c", b"third")
        assert [e.location for e in log.scan()] == [first, third]


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=1, max_size=400))
def test_random_segment_file_never_yields_wrong_records(
    tmp_path_factory: pytest.TempPathFactory, garbage: bytes
) -> None:
    directory = tmp_path_factory.mktemp("fuzz")
    with SegmentLog(directory, 1 << 20, fsync=False) as log:
        loc = log.append("ns", b"k", b"value")
    with open(directory / segment_name(1), "ab") as f:
        f.write(garbage)
    with SegmentLog(directory, 1 << 20, fsync=False) as log:
        entries = list(log.scan(verify=True))
        assert entries[0].location == loc
        for entry in entries[1:]:  # only possible if garbage holds a valid record
            _read(log, entry.location, entry.payload_len)


# -- the walk, sans I/O ----------------------------------------------------------


def _record(ns: bytes, hash_: bytes, payload: bytes) -> bytes:
    return encode_record_header(ns, hash_, len(payload), payload_checksum(payload)) + ns + hash_ + payload


def _walk(buf: bytes, verify: bool = False) -> tuple[list[bytes], WalkResult]:
    result = WalkResult()
    found = walk_records(lambda offset, n: buf[offset : offset + n], len(buf), verify, result)
    return [f.hash for f in found], result


def test_walk_over_a_buffer() -> None:
    records = [_record(b"ns", b"k%d" % i, b"v" * i) for i in range(4)]
    buf = b"".join(records)
    assert _walk(buf) == ([b"k0", b"k1", b"k2", b"k3"], WalkResult(len(buf), WalkStop.END, 0))
    hashes, result = _walk(buf[:-1])
    assert hashes == [b"k0", b"k1", b"k2"] and result.stop is WalkStop.TORN
    assert result.good_end == len(buf) - len(records[3])
    bad = bytearray(buf)
    bad[len(records[0]) + len(records[1]) - 1] ^= 1  # last byte of k1's payload
    assert _walk(bytes(bad))[0] == [b"k0", b"k1", b"k2", b"k3"]
    hashes, result = _walk(bytes(bad), verify=True)
    assert hashes == [b"k0", b"k2", b"k3"] and result.corrupt == 1


@given(st.lists(st.binary(max_size=64), max_size=4), st.binary(max_size=200), st.booleans())
def test_walk_yields_every_good_record_before_garbage(payloads: list[bytes], garbage: bytes, verify: bool) -> None:
    buf = b"".join(_record(b"", b"%d" % i, p) for i, p in enumerate(payloads))
    hashes, result = _walk(buf + garbage, verify)
    assert hashes[: len(payloads)] == [b"%d" % i for i in range(len(payloads))]
    assert result.good_end >= len(buf)


# -- batched reads: spans of back-to-back records ------------------------------------

locations = st.lists(st.builds(RecordAddress, st.integers(1, 3), st.integers(0, 40), st.integers(1, 5)), max_size=30)


@given(locations)
def test_plan_spans_covers_each_location_once_back_to_back_in_disk_order(wanted: list[RecordAddress]) -> None:
    spans = plan_spans(wanted)
    assert sorted(i for span in spans for i in span.members) == list(range(len(wanted)))
    for span in spans:
        at = span.offset
        for i in span.members:  # each starts where the one before ends, inside the span
            assert (wanted[i].segment_id, wanted[i].offset) == (span.segment_id, at)
            at += wanted[i].length
        assert at == span.offset + span.length
    starts = [(span.segment_id, span.offset) for span in spans]
    assert starts == sorted(starts)


def test_plan_spans_joins_neighbours_and_splits_at_gaps_and_segments() -> None:
    wanted = [
        RecordAddress(1, 10, 5),
        RecordAddress(1, 0, 10),
        RecordAddress(2, 15, 5),
        RecordAddress(1, 16, 4),
        RecordAddress(1, 15, 1),
    ]
    assert [(s.segment_id, s.offset, s.length, s.members) for s in plan_spans(wanted)] == [
        (1, 0, 20, (1, 0, 4, 3)),
        (2, 15, 5, (2,)),
    ]


@given(st.lists(st.integers(1, 3000), max_size=40), st.integers(1, 4096), st.integers(1, 8))
def test_chunk_span_covers_every_record_once_within_its_limits(
    lengths: list[int], max_bytes: int, max_records: int
) -> None:
    calls = chunk_span(lengths, max_bytes, max_records)
    assert [i for call in calls for i in call] == list(range(len(lengths)))
    for call in calls:
        assert 1 <= len(call) <= max_records
        assert len(call) == 1 or sum(lengths[i] for i in call) <= max_bytes


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=12), st.data())
def test_read_span_returns_exactly_each_records_bytes(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], data: st.DataObject
) -> None:
    with SegmentLog(tmp_path_factory.mktemp("span"), 1 << 20, fsync=False) as log:
        written = [log.append("ns", b"h%d" % i, _payload(i, n)) for i, n in enumerate(sizes)]
        first = data.draw(st.integers(0, len(sizes) - 1))
        last = data.draw(st.integers(first, len(sizes) - 1))
        picked = list(range(first, last + 1))  # back to back, as plan_spans makes them
        targets = [bytearray(sizes[i]) for i in picked]
        with mock.patch.object(segments_module, "READ_CHUNK", data.draw(st.integers(1, 20000))):  # calls split anywhere
            problems = log.read_span(
                [written[i] for i in picked], [memoryview(t) for t in targets], [("ns", b"h%d" % i) for i in picked]
            )
        assert problems == [None] * len(picked)
        assert [bytes(t) for t in targets] == [_payload(i, sizes[i]) for i in picked]
        span = plan_spans([written[i] for i in picked])
        assert len(span) == 1 and span[0].members == tuple(range(len(picked)))


def test_read_span_reports_each_bad_record_and_verifies_the_rest(tmp_path: Path) -> None:
    sizes = [3000, 100, 2000, 4000]
    with SegmentLog(tmp_path, 1 << 20, fsync=False) as log:
        written = [log.append("ns", b"h%d" % i, _payload(i, n)) for i, n in enumerate(sizes)]
        _flip(tmp_path / segment_name(written[1].segment_id), written[1].offset + written[1].length - 1)
        targets = [memoryview(bytearray(n)) for n in sizes]
        keys = [("ns", b"h0"), ("ns", b"h1"), ("ns", b"other"), None]
        problems = log.read_span(written, targets, keys)
        assert [type(p).__name__ for p in problems] == ["NoneType", "CorruptRecord", "CorruptRecord", "NoneType"]
        assert "payload" in str(problems[1]) and "different key" in str(problems[2])
        assert bytes(targets[3]) == _payload(3, sizes[3])
        with pytest.raises(ValueError):  # not back to back
            log.read_span([written[0], written[2]], [targets[0], targets[2]], [None, None])
        os.truncate(tmp_path / segment_name(written[3].segment_id), written[3].offset + 10)
        problems = log.read_span(written[2:], targets[2:], [None, None])
        assert problems[0] is None and "short read" in str(problems[1])
