"""Batch planning: group by owner, namespace and hash size; chunk to limits; scatter back."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_client.batching import (
    STREAM_BYTES,
    Job,
    chunk,
    expected_sizes,
    group,
    leading_ok,
    one_frame_job,
    plan,
    read_streams,
    scatter,
    source_views,
    streams,
    target_views,
)
from kvpool_client.core.errors import ErrorCode, UsageError
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import KeyPlacement, Member, StaticRouter
from kvpool_client.core.wire import WireLimits
from kvpool_client.operations import direct_job
from kvpool_client.placement_source import Placement

A = Member("a", "a:7000")
B = Member("b", "b:7000")
NS1, NS2 = "m1@fp16@L@tp0of1", "m2@bf16@L@tp0of1"


class TableRouter:
    """Owners by the first byte of the hash: 'a...' to A, anything else to B."""

    def placement(self, key: BlockKey) -> KeyPlacement:
        owner = A if key.hash[:1] == b"a" else B
        return KeyPlacement((owner,), (owner,))

    def members(self) -> list[Member]:
        return [A, B]


def key(ns: str, tag: bytes, size: int = 32) -> BlockKey:
    return BlockKey(ns, tag.ljust(size, b"."))


def summary(jobs: list[Job]) -> list[tuple[str, str, list[int]]]:
    return [(j.member.node_id, j.namespace, j.indices) for j in jobs]


# -- plan -----------------------------------------------------------------------------


def test_plan_groups_by_owner_namespace_and_hash_size_in_first_seen_order() -> None:
    keys = [
        key(NS1, b"a0"),  # 0: A ns1 32
        key(NS1, b"b1"),  # 1: B ns1 32
        key(NS2, b"a2"),  # 2: A ns2 32
        key(NS1, b"a3"),  # 3: A ns1 32
        key(NS1, b"a4", size=16),  # 4: A ns1 16: one frame carries one hash size
        key(NS1, b"b5"),  # 5: B ns1 32
        key(NS1, b"a0"),  # 6: a repeat stays a separate position
    ]
    jobs = plan(keys, TableRouter())
    assert summary(jobs) == [
        ("a", NS1, [0, 3, 6]),
        ("b", NS1, [1, 5]),
        ("a", NS2, [2]),
        ("a", NS1, [4]),
    ], summary(jobs)
    for job in jobs:
        assert job.hashes == [keys[i].hash for i in job.indices], job


def test_plan_with_a_real_router_covers_every_key_once() -> None:
    router = StaticRouter([f"10.0.0.{i}:7000" for i in range(4)])
    keys = [BlockKey(NS1 if i % 3 else NS2, bytes([i]) * 32) for i in range(200)]
    jobs = plan(keys, router)
    seen = sorted(i for job in jobs for i in job.indices)
    assert seen == list(range(200)), "every key in exactly one job"
    for job in jobs:
        assert job.indices == sorted(job.indices), "order within a job follows the batch"
        for i in job.indices:
            assert router.write_owners(keys[i])[0] == job.member and keys[i].namespace == job.namespace
    assert len({(j.member.address, j.namespace) for j in jobs}) == len(jobs)


def test_plan_of_nothing_is_nothing() -> None:
    assert plan([], TableRouter()) == []


def test_plan_rejects_what_is_not_a_block_key() -> None:
    with pytest.raises(UsageError, match="key 1 is a bytes"):
        plan([key(NS1, b"a"), b"raw-hash"], TableRouter())  # type: ignore[list-item]


# -- one frame: a read one node answers ----------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    picks=st.lists(st.tuples(st.sampled_from([NS1, NS2]), st.sampled_from([16, 32]), st.integers(0, 9)), min_size=1),
)
def test_one_frame_job_is_the_one_job_group_makes(picks: list[tuple[str, int, int]]) -> None:
    keys = [BlockKey(ns, bytes([tag]) * size, depth=tag) for ns, size, tag in picks]
    grouped = group(keys, ((i, A) for i in range(len(keys))))
    job = one_frame_job(A, keys)
    if len(grouped) > 1:
        assert job is None, f"{len(grouped)} frames, but one job: {job}"
    else:
        assert job == grouped[0], f"{job} != {grouped[0]}"


ONE_OWNER_EACH = Placement(TableRouter(), write_quorum=1)


def test_a_read_of_one_node_in_one_frame_is_direct() -> None:
    keys = [key(NS1, b"a0"), key(NS1, b"a1")]
    found = direct_job(keys, ONE_OWNER_EACH, lambda m: WireLimits(), [100, 100])
    assert found is not None and summary([found[0]]) == [("a", NS1, [0, 1])], f"{found}"


@pytest.mark.parametrize(
    ("keys", "limits", "why"),
    [
        ([key(NS1, b"a0"), key(NS1, b"b1")], WireLimits(), "two nodes"),
        ([key(NS1, b"a0"), key(NS2, b"a1")], WireLimits(), "two namespaces"),
        ([key(NS1, b"a0"), key(NS1, b"a1", size=16)], WireLimits(), "two hash sizes"),
        ([key(NS1, b"a0"), key(NS1, b"a1")], WireLimits(max_keys=1), "over the node's limits"),
    ],
)
def test_a_read_that_needs_several_frames_is_planned(keys: list[BlockKey], limits: WireLimits, why: str) -> None:
    found = direct_job(keys, ONE_OWNER_EACH, lambda m: limits, [100] * len(keys))
    assert found is None, f"{why}: direct job {found}"


def test_a_read_of_a_node_whose_limits_are_unknown_is_planned() -> None:
    assert direct_job([key(NS1, b"a0")], ONE_OWNER_EACH, lambda m: None) is None


# -- chunk ----------------------------------------------------------------------------


def job_of(indices: list[int]) -> Job:
    return Job(A, NS1, list(indices), [bytes([i]) * 4 for i in indices], [None] * len(indices))


def test_chunk_respects_max_keys() -> None:
    pieces = chunk(job_of(list(range(7))), WireLimits(max_keys=3))
    assert [p.indices for p in pieces] == [[0, 1, 2], [3, 4, 5], [6]], [p.indices for p in pieces]
    assert all(p.member is A and p.namespace == NS1 for p in pieces)
    assert [p.hashes for p in pieces] == [[bytes([i]) * 4 for i in p.indices] for p in pieces]


def test_chunk_respects_max_payload_using_batch_indices() -> None:
    sizes = [100, 4, 999, 4, 4, 999, 4]  # by batch index: the job holds 1, 3, 4, 6
    pieces = chunk(job_of([1, 3, 4, 6]), WireLimits(max_keys=100, max_payload=8), sizes)
    assert [p.indices for p in pieces] == [[1, 3], [4, 6]], [p.indices for p in pieces]


def test_chunk_fills_to_exactly_the_payload_limit() -> None:
    pieces = chunk(job_of([0, 1, 2, 3]), WireLimits(max_payload=10), [3, 7, 10, 1])
    assert [p.indices for p in pieces] == [[0, 1], [2], [3]], [p.indices for p in pieces]


def test_an_oversized_key_gets_a_chunk_of_its_own() -> None:
    pieces = chunk(job_of([0, 1, 2]), WireLimits(max_payload=10), [5, 50, 5])
    assert [p.indices for p in pieces] == [[0], [1], [2]], [p.indices for p in pieces]


def test_chunk_of_a_small_job_is_the_job() -> None:
    job = job_of([2, 5])
    (piece,) = chunk(job, WireLimits(), [1] * 6)
    assert (piece.indices, piece.hashes) == (job.indices, job.hashes)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=40),
    max_keys=st.integers(1, 8),
    max_payload=st.integers(1, 120),
)
def test_chunk_pieces_are_greedy_and_within_limits(sizes: list[int], max_keys: int, max_payload: int) -> None:
    job = job_of(list(range(len(sizes))))
    pieces = chunk(job, WireLimits(max_keys=max_keys, max_payload=max_payload), sizes)
    assert [i for p in pieces for i in p.indices] == job.indices, "pieces must cover the job in order"
    assert [h for p in pieces for h in p.hashes] == job.hashes
    for n, piece in enumerate(pieces):
        payload = sum(sizes[i] for i in piece.indices)
        assert 1 <= len(piece.indices) <= max_keys, piece.indices
        assert payload <= max_payload or len(piece.indices) == 1, (piece.indices, payload)
        if n + 1 < len(pieces):  # greedy: the next key would not have fit
            nxt = pieces[n + 1].indices[0]
            assert len(piece.indices) == max_keys or payload + sizes[nxt] > max_payload, (piece.indices, nxt)


# -- scatter and leading_ok -----------------------------------------------------------


def test_scatter_puts_answers_back_at_batch_positions() -> None:
    into: list[object] = [None] * 6
    scatter(into, job_of([4, 0, 2]), ["e", "a", "c"])
    scatter(into, job_of([1, 5]), ["b", "f"])
    assert into == ["a", "b", "c", None, "e", "f"], into


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [([], 0), ([0, 0, 0], 3), ([0, 0, 1, 0], 2), ([1, 0], 0), ([ErrorCode.OK, ErrorCode.BUSY], 1)],
)
def test_leading_ok(statuses: list[int], expected: int) -> None:
    assert leading_ok(statuses) == expected, leading_ok(statuses)


# -- source_views and target_views ----------------------------------------------------


KEYS3 = [key(NS1, bytes([i])) for i in range(3)]


def test_source_views_share_memory_and_accept_read_only_blocks() -> None:
    arr = np.arange(4, dtype=np.float32)
    blocks = [b"abc", bytearray(b"de"), arr]
    views = source_views(KEYS3, blocks, lambda i: 1024)
    assert [bytes(v) for v in views] == [b"abc", b"de", arr.tobytes()]
    arr[0] = 7.0
    assert bytes(views[2]) == arr.tobytes(), "the view must share the array's memory"


def test_source_views_check_each_block_against_its_limit() -> None:
    with pytest.raises(UsageError, match="3 keys but 2 blocks"):
        source_views(KEYS3, [b"a", b"b"], lambda i: 10)
    with pytest.raises(UsageError, match="block 1 is 0 bytes") as empty:
        source_views(KEYS3, [b"a", b"", b"c"], lambda i: 10)
    assert empty.value.code is ErrorCode.BLOCK_TOO_LARGE, empty.value.code
    with pytest.raises(UsageError, match=r"block 2 is 6 bytes; the node allows 1\.\.5") as large:
        source_views(KEYS3, [b"12345", b"1", b"123456"], lambda i: 5)
    assert large.value.code is ErrorCode.BLOCK_TOO_LARGE
    # Limits are per batch index.
    assert len(source_views(KEYS3, [b"1", b"12", b"123"], lambda i: i + 1)) == 3


def test_source_views_reject_non_contiguous_blocks() -> None:
    strided = np.arange(16, dtype=np.uint8)[::2]
    with pytest.raises(UsageError, match="contiguous"):
        source_views(KEYS3, [b"a", strided, b"c"], lambda i: 100)
    with pytest.raises(UsageError):
        source_views(KEYS3, [b"a", 42, b"c"], lambda i: 100)


def test_target_views() -> None:
    assert target_views(KEYS3, None) == [None, None, None]
    buffers = [bytearray(2), np.zeros(3, dtype=np.uint8), memoryview(bytearray(1))]
    views = target_views(KEYS3, buffers)
    views[1][:] = b"xyz"
    assert bytes(buffers[1]) == b"xyz", "writes through the view must land in the caller's array"
    with pytest.raises(UsageError, match="3 keys but 2 destination buffers"):
        target_views(KEYS3, buffers[:2])
    with pytest.raises(UsageError, match="read-only"):
        target_views(KEYS3, [bytearray(1), b"immutable", bytearray(1)])
    with pytest.raises(UsageError, match="contiguous"):
        target_views(KEYS3, [bytearray(1), np.zeros((4, 4), dtype=np.uint8)[:, 1], bytearray(1)])


def test_gets_are_chunked_by_what_the_answer_may_carry() -> None:
    """Without it, a get of many large blocks would exceed the payload limit of one frame."""
    targets = [memoryview(bytearray(300)), None, memoryview(bytearray(300))]
    sizes = expected_sizes(targets)
    assert sizes == [300, WireLimits().max_block_size, 300], sizes
    job = Job(Member("n", "n:1"), "ns", [0, 1, 2], [b"a", b"b", b"c"], [None] * 3)
    pieces = chunk(job, WireLimits(max_keys=16, max_block_size=1 << 20, max_payload=600), [300, 300, 300])
    assert [p.indices for p in pieces] == [[0, 1], [2]], [p.indices for p in pieces]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 6 << 20), min_size=1, max_size=40),
    st.integers(1, 5),
)
def test_streams_split_a_job_in_order_into_shares_of_at_least_the_stream_size(sizes: list[int], most: int) -> None:
    job = Job(A, NS1, list(range(len(sizes))), [bytes([i]) for i in range(len(sizes))], [None] * len(sizes))
    pieces = streams(job, sizes, most)
    assert [i for p in pieces for i in p.indices] == job.indices, pieces  # every key once, in order
    assert [h for p in pieces for h in p.hashes] == job.hashes
    total = sum(sizes)
    count = min(most, total // STREAM_BYTES, len(sizes))
    assert len(pieces) <= max(1, count), (total, most, pieces)
    if len(pieces) > 1:
        shares = [sum(sizes[i] for i in p.indices) for p in pieces]
        assert all(share >= STREAM_BYTES for share in shares), shares  # each worth its connection
        reached = itertools.accumulate(shares[:-1])  # each run ends once the batch so far holds its shares
        assert all(sent * len(pieces) >= total * k for k, sent in enumerate(reached, 1)), shares


def test_streams_split_equal_blocks_evenly() -> None:
    job = Job(A, NS1, list(range(32)), [bytes([i]) for i in range(32)], [None] * 32)
    assert [len(p.indices) for p in streams(job, [384 << 10] * 32, 2)] == [16, 16]  # 12 MiB
    assert [len(p.indices) for p in streams(job, [384 << 10] * 32, 4)] == [16, 16]  # three 4 MiB runs do not fit
    assert [len(p.indices) for p in streams(job, [256 << 10] * 32, 2)] == [16, 16]  # 8 MiB: two of 4 MiB
    assert [len(p.indices) for p in streams(job, [(256 << 10) - 1] * 32, 2)] == [32]


def test_streams_leave_jobs_without_payload_or_with_unknown_sizes_whole() -> None:
    job = Job(A, NS1, [0, 1, 2], [b"a", b"b", b"c"], [None] * 3)
    assert streams(job, None, 4) == [job]  # an exists or a delete
    assert streams(job, [STREAM_BYTES] * 3, 1) == [job]
    assert len(streams(job, [STREAM_BYTES] * 3, 4)) == 3
    assert read_streams([memoryview(b"x"), None], 4) == 1  # a None target's size is a bound
    assert read_streams([memoryview(b"x")], 4) == 4
