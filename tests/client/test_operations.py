"""The I/O-free operations both clients run: the steps each asks for, and its result from the answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_client import batching, exchange, nodes, operations
from kvpool_client.buffers import Target
from kvpool_client.core.config import ClientConfig
from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable, RequestTimeout, UsageError
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import Member, RendezvousRouter
from kvpool_client.core.wire import WireLimits
from kvpool_client.placement_source import Placement
from kvpool_client.request_factory import RequestFactory
from kvpool_client.transport.nixl import LocalAgent

OK, NOT_FOUND = ErrorCode.OK, ErrorCode.NOT_FOUND
MEMBERS = [Member(n, f"{n}.local:7000") for n in "abc"]
KEYS = [BlockKey("ns", bytes([i]) * 32) for i in range(6)]
Node = Callable[[batching.Job], Any]  # a fake node: job -> outcome


def placement(replicas: int = 2, quorum: int = 1) -> Placement:
    return Placement(RendezvousRouter(MEMBERS, replicas), quorum)


def run(operation: operations.Operation[Any], place: Placement, node: Node, limits: WireLimits | None = None) -> Any:
    """Drive ``operation`` like a client would, answering each step from ``place`` and ``node``."""
    answer: Any = None
    while True:
        try:
            step = operation.send(answer)
        except StopIteration as done:
            return done.value
        if isinstance(step, operations.CurrentPlacement):
            answer = place
        elif isinstance(step, operations.FetchLimits):
            answer = {m.node_id: limits for m in step.members} if limits else {}
        else:
            answer = [(job, node(job)) for job in step.jobs]


def always_usable() -> Callable[[str], bool]:
    return lambda node_id: True


def test_put_stores_each_key_on_its_write_owners() -> None:
    requests = RequestFactory(verify_checksums=False)
    operation = operations.put(KEYS, views(6), requests, always_usable)
    result = run(operation, placement(), lambda job: [OK] * len(job.indices))
    assert list(result.statuses) == [OK] * 6
    addresses = {m.address for m in MEMBERS}
    assert all(len(held) == 2 and set(held) <= addresses for held in result.stored_on), result.stored_on


def test_put_checks_blocks_against_the_owners_limits_before_sending() -> None:
    requests = RequestFactory(verify_checksums=False)
    small = WireLimits(max_block_size=4)
    with pytest.raises(UsageError):
        run(operations.put(KEYS, views(6), requests, always_usable), placement(), pytest.fail, small)


def test_bad_keys_raise_before_any_step() -> None:
    requests = RequestFactory(verify_checksums=False)
    with pytest.raises(UsageError):
        next(operations.get(["not a key"], None, requests, always_usable))  # type: ignore[list-item]


def test_get_falls_back_to_the_next_replica_and_fills_buffers() -> None:
    requests = RequestFactory(verify_checksums=False)
    asked: list[str] = []

    def node(job: batching.Job) -> Any:
        asked.append(job.member.node_id)
        if len(asked) == 1:
            return [NOT_FOUND] * len(job.indices), [None] * len(job.indices)
        return [OK] * len(job.indices), [memoryview(b"v")] * len(job.indices)

    result = run(operations.get(KEYS[:1], [None], requests, always_usable), placement(), node)
    assert list(result.statuses) == [OK]
    assert bytes(result.buffers[0]) == b"v"
    assert len(asked) == 2 and asked[0] != asked[1]


def test_lookup_probe_counts_the_leading_hits() -> None:
    requests = RequestFactory(verify_checksums=False)
    hits = set(KEYS[:3])

    def node(job: batching.Job) -> list[ErrorCode]:
        return [OK if KEYS[i] in hits else NOT_FOUND for i in job.indices]

    statuses = run(operations.probe(KEYS, True, requests, always_usable), placement(), node)
    assert batching.leading_ok(statuses) == 3


def test_delete_raises_the_first_failure_when_no_reader_answered() -> None:
    requests = RequestFactory(verify_checksums=False)
    down = NodeUnavailable("down")
    with pytest.raises(NodeUnavailable) as caught:
        run(operations.delete(KEYS, requests, always_usable), placement(), lambda job: down)
    assert caught.value is down


def test_delete_is_true_where_some_reader_removed_the_key() -> None:
    requests = RequestFactory(verify_checksums=False)

    def node(job: batching.Job) -> list[ErrorCode]:
        return [OK if job.member.node_id == "a" else NOT_FOUND] * len(job.indices)

    removed = run(operations.delete(KEYS, requests, always_usable), placement(replicas=3), node)
    assert removed == [True] * 6


def test_delete_with_every_node_gated_off_is_unavailable() -> None:
    requests = RequestFactory(verify_checksums=False)
    with pytest.raises(NodeUnavailable, match="no reader of key 0"):
        run(operations.delete(KEYS, requests, lambda: lambda node_id: False), placement(), pytest.fail)


def test_limit_helpers_ask_only_uncached_usable_nodes() -> None:
    a, b, c = MEMBERS
    assert operations.distinct([a, b, a, c, b]) == (a, b, c)
    cache = {"a": WireLimits()}

    def cached(member: Member) -> WireLimits | None:
        return cache.get(member.node_id)

    assert operations.limits_to_fetch([a, b, c], cached, lambda n: n != "c") == [b]
    assert operations.known_limits([a, b, c], cached) == {"a": WireLimits()}


def test_node_record_identity() -> None:
    a = MEMBERS[0]
    record: nodes.NodeHandle[object] = nodes.NodeHandle(a, ClientConfig(nodes=("x:1",)), LocalAgent(1.0))
    assert record.serves(Member("a", a.address)) and not record.serves(Member("a", "elsewhere:1"))
    assert not record.serves(Member("a", a.address, data_address="a.local:7001"))
    assert nodes.find_node([record], "a") is record and nodes.find_node([record], a.address) is record
    assert nodes.find_node([record], "b") is None
    assert record.cached_limits() is None and record.has_room()


BLOCK_LIMIT = WireLimits().max_block_size  # what a get into no buffer may bring per key


def known(limits: WireLimits | None = WireLimits()) -> Callable[[Member], WireLimits | None]:
    return lambda member: limits


def test_a_get_one_node_alone_answers_is_one_frame_with_the_plans_result() -> None:
    requests = RequestFactory(verify_checksums=False)
    place = placement(replicas=1)
    keys = [k for k in KEYS if place.router.placement(k).read_order[0].node_id == "a"]
    answers = [OK, NOT_FOUND, ErrorCode.TIMEOUT, 250][: len(keys)]  # 250: a code this client does not know
    assert len(keys) >= 2, f"the fixture's keys should give node a two or more, got {keys}"

    def node(job: batching.Job) -> Any:
        return answers[: len(job.indices)], [memoryview(b"v") if a == OK else None for a in answers[: len(job.indices)]]

    found = operations.direct_job(keys, place, known(), [BLOCK_LIMIT] * len(keys))
    assert found is not None, "one node, one replica, one frame: no plan needed"
    job, limits = found
    assert (job.member.node_id, job.indices, limits) == ("a", list(range(len(keys))), WireLimits())
    operation = operations.one_node_get(job, limits, [None] * len(keys), requests)
    assert isinstance(operation, operations.OneExchange), "no arena here: the node is asked"
    direct = finish(operation, node, job)
    planned = run(operations.get(keys, [None] * len(keys), requests, always_usable), place, node)
    assert direct == planned, f"direct {direct} != planned {planned}"


def test_a_failed_direct_exchange_fails_every_key_as_the_plan_does() -> None:
    requests = RequestFactory(verify_checksums=False)
    place = Placement(RendezvousRouter(MEMBERS[:1], 1), 1)
    found = operations.direct_job(KEYS, place, known())
    assert found is not None
    down = NodeUnavailable("gone")
    planned = run(operations.get(KEYS, [None] * len(KEYS), requests, always_usable), place, lambda job: down)
    assert operations.get_result(found[0], down) == planned
    assert set(planned.statuses) == {ErrorCode.UNAVAILABLE}


def test_a_get_of_one_key_into_a_buffer_over_the_wire_is_a_single_get() -> None:
    requests = RequestFactory(verify_checksums=False)
    job = batching.Job(MEMBERS[0], KEYS[0].namespace, [0], [KEYS[0].hash], [KEYS[0].depth])
    built = requests.get(job, [memoryview(bytearray(8))], WireLimits())
    assert isinstance(built, exchange.SingleGet), built  # held to exchange.get in tests/wire/test_exchange.py
    assert not isinstance(requests.get(job, [None], WireLimits()), exchange.SingleGet), "no buffer: the general get"


def views(count: int, size: int = 8) -> list[Target]:
    return batching.block_views(KEYS[:count], [b"x" * size] * count)


def finish(operation: operations.Runnable[Any], node: Node, job: batching.Job) -> Any:
    """Run a one-node operation on ``job``: answer its one exchange, or its round of streams."""
    if isinstance(operation, operations.OneExchange):
        assert operation.job is job, f"the exchange is another job's: {operation.job}"
        return operation.finish(job, node(job))
    step = next(operation)
    assert isinstance(step, operations.RunRound), f"a one-node operation is one exchange or one round, not {step}"
    try:
        operation.send([(p, node(p)) for p in step.jobs])
    except StopIteration as done:
        return done.value
    raise AssertionError("a round of streams is the operation's one step")


PUT_ANSWERS = [OK, ErrorCode.ALREADY_EXISTS, ErrorCode.BUSY, ErrorCode.OVERLOADED, ErrorCode.OUT_OF_SPACE, 250]


@settings(max_examples=60, deadline=None)
@given(
    answers=st.lists(st.sampled_from(PUT_ANSWERS), min_size=1, max_size=len(KEYS)),  # 250: a code not known here
    failure=st.sampled_from([None, NodeUnavailable("gone"), RequestTimeout("slow")]),
)
def test_a_put_one_node_alone_stores_has_the_plans_result(answers: list[int], failure: KVPoolError | None) -> None:
    requests = RequestFactory(verify_checksums=False)
    place = Placement(RendezvousRouter(MEMBERS[:1], 1), 1)
    keys, blocks = KEYS[: len(answers)], views(len(answers))

    def node(job: batching.Job) -> Any:
        return failure or [answers[i] for i in job.indices]

    found = operations.direct_job(keys, place, known(), [len(b) for b in blocks], write=True)
    assert found is not None, "one node, one owner, one frame: no plan needed"
    direct = finish(operations.one_node_put(*found, blocks, requests), node, found[0])
    planned = run(operations.put(keys, blocks, requests, always_usable), place, node)
    assert direct == planned, f"direct {direct} != planned {planned}"


def test_a_large_put_one_node_alone_stores_goes_out_as_the_plans_streams() -> None:
    requests = RequestFactory(verify_checksums=False, streams=2)
    place = Placement(RendezvousRouter(MEMBERS[:1], 1), 1)
    blocks = views(len(KEYS), batching.STREAM_BYTES // 2)  # six keys: 12 MiB, two streams of three keys
    sent: list[list[int]] = []

    def node(job: batching.Job) -> Any:  # the second stream's node is down
        sent.append(job.indices)
        return NodeUnavailable("gone") if job.indices[0] >= 3 else [OK] * len(job.indices)

    found = operations.direct_job(KEYS, place, known(), [len(b) for b in blocks], write=True)
    assert found is not None
    direct = finish(operations.one_node_put(*found, blocks, requests), node, found[0])
    assert sent == [[0, 1, 2], [3, 4, 5]], f"the direct put sent {sent}"
    sent.clear()
    planned = run(operations.put(KEYS, blocks, requests, always_usable), place, node)
    assert sent == [[0, 1, 2], [3, 4, 5]], f"the plan sent {sent}"
    assert direct == planned, f"direct {direct} != planned {planned}"


def test_a_direct_put_to_a_draining_owner_is_left_to_the_plan() -> None:
    place = placement(replicas=1)
    owner = place.router.placement(KEYS[0]).write_owners[0]
    answers = {owner.node_id: [ErrorCode.DRAINING]}
    requests = RequestFactory(verify_checksums=False)
    planned = run(
        operations.put(KEYS[:1], views(1), requests, always_usable),
        place,
        lambda job: answers.get(job.member.node_id, [OK]),
    )
    found = operations.direct_job(KEYS[:1], place, known(), write=True)
    assert found is not None and found[0].member == owner
    draining = finish(operations.one_node_put(*found, views(1), requests), lambda job: [ErrorCode.DRAINING], found[0])
    assert draining is None
    assert planned.statuses == (OK,) and owner.address not in planned.stored_on[0], planned


def test_a_direct_put_checks_blocks_against_the_nodes_limit() -> None:
    requests = RequestFactory(verify_checksums=False)
    found = operations.direct_job(KEYS[:1], placement(replicas=1), known(WireLimits(max_block_size=4)), write=True)
    assert found is not None
    with pytest.raises(UsageError, match="block 0 is 8 bytes"):
        operations.one_node_put(*found, views(1), requests)


def test_a_node_the_breaker_refuses_gets_no_direct_job() -> None:
    place = placement(replicas=1)
    owner = place.router.placement(KEYS[0]).read_order[0]
    asked: list[str] = []

    def allow(node_id: str) -> bool:
        asked.append(node_id)
        return False

    assert operations.direct_job(KEYS[:1], place, known(), allow=allow) is None, "an open circuit: the plan"
    assert asked == [owner.node_id], f"the breaker should be asked once, for the owner: {asked}"
    assert operations.direct_job(KEYS[:1], place, known(None), allow=allow) is None
    assert asked == [owner.node_id], "a node the plan is needed for anyway must not take a half-open probe"


def test_a_direct_write_goes_to_the_one_owner_with_known_limits() -> None:
    owner = placement(replicas=1).router.placement(KEYS[0]).write_owners[0]
    found = operations.direct_job(KEYS[:1], placement(replicas=1), known(), write=True)
    assert found is not None and (found[0].member, found[1]) == (owner, WireLimits())
    assert operations.direct_job(KEYS[:1], placement(replicas=2), known(), write=True) is None, "replicas: the plan"
    assert operations.direct_job(KEYS[:1], placement(replicas=1), known(None), write=True) is None, "limits unknown"


@pytest.mark.parametrize(
    ("why", "keys", "place", "limits"),
    [
        ("replicas to fall back to", KEYS[:1], placement(replicas=2), WireLimits()),
        ("keys on several nodes", KEYS, placement(replicas=1), WireLimits()),
        ("the node's limits not read yet", KEYS[:1], placement(replicas=1), None),
        (
            "more keys than one frame holds",
            KEYS,
            Placement(RendezvousRouter(MEMBERS[:1], 1), 1),
            WireLimits(max_keys=2),
        ),
        (
            "two namespaces",
            [KEYS[0], BlockKey("other", KEYS[0].hash)],
            Placement(RendezvousRouter(MEMBERS[:1], 1), 1),
            WireLimits(),
        ),
        ("no keys", [], placement(replicas=1), WireLimits()),
    ],
)
def test_a_get_that_needs_the_plan_gets_no_direct_job(
    why: str, keys: list[BlockKey], place: Placement, limits: WireLimits | None
) -> None:
    assert operations.direct_job(keys, place, known(limits)) is None, why


@pytest.mark.parametrize("prefix", [False, True])
def test_a_probe_one_node_alone_answers_has_the_plans_statuses(prefix: bool) -> None:
    requests = RequestFactory(verify_checksums=False)
    place = Placement(RendezvousRouter(MEMBERS[:1], 1), 1)
    answers = [OK, OK, NOT_FOUND, OK, ErrorCode.TIMEOUT, OK]

    def node(job: batching.Job) -> Any:
        return [answers[i] for i in job.indices]

    found = operations.direct_job(KEYS, place, known())
    assert found is not None
    for outcome in (node(found[0]), NodeUnavailable("gone")):
        answer: Node = lambda job, outcome=outcome: outcome  # noqa: E731
        direct = finish(operations.one_node_probe(*found, prefix, requests), answer, found[0])
        planned = run(operations.probe(KEYS, prefix, requests, always_usable), place, answer)
        assert direct == planned, f"prefix={prefix}: direct {direct} != planned {planned}"


def test_streams_of_a_direct_get_give_the_plans_result_and_a_planned_get_sends_them() -> None:
    requests = RequestFactory(verify_checksums=False, streams=2)
    place = Placement(RendezvousRouter(MEMBERS[:1], 1), 1)
    block = batching.STREAM_BYTES // 2  # six keys: 12 MiB, two streams of three keys
    targets: list[memoryview | None] = [memoryview(bytearray(block)) for _ in KEYS]
    sizes = [block] * len(KEYS)
    sent: list[list[int]] = []

    def node(job: batching.Job) -> Any:  # the second stream's node is down
        sent.append(job.indices)
        if job.indices[0] >= 3:
            return NodeUnavailable("gone")
        return [OK] * len(job.indices), [memoryview(b"v")] * len(job.indices)

    found = operations.direct_job(KEYS, place, known(), sizes)
    assert found is not None
    lanes = batching.streams(found[0], sizes, 2)
    assert [lane.indices for lane in lanes] == [[0, 1, 2], [3, 4, 5]], lanes
    direct = operations.streamed_result(len(KEYS), [(lane, node(lane)) for lane in lanes])
    assert list(direct.statuses) == [OK] * 3 + [ErrorCode.UNAVAILABLE] * 3, direct
    assert len(direct.causes) == 1 and "gone" in direct.causes[0], direct.causes
    sent.clear()
    planned = run(operations.get(KEYS, targets, requests, always_usable), place, node)
    assert sent == [[0, 1, 2], [3, 4, 5]], f"the plan sent {sent}"
    assert planned.statuses == direct.statuses and planned.causes == direct.causes, (planned, direct)
    sent.clear()
    run(operations.get(KEYS, [*targets[:-1], None], requests, always_usable), place, node)
    assert sent == [[0, 1, 2, 3, 4, 5]], f"a target left out keeps the batch one frame: {sent}"
