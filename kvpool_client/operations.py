"""The batch operations (put, get, exists/lookup, delete) with their I/O left out.

Shared by the blocking and asyncio clients so the two cannot drift. Each operation
is a generator that yields a :data:`Step` naming the I/O it needs next; the client
performs it (blocking or awaiting), sends the answer back, and takes the
operation's result from ``StopIteration.value`` (see :func:`kvpool_client.client.KVPoolClient._run`).
Argument errors raise from the first ``send`` before any I/O is asked for. An operation
one node alone answers (:func:`direct_job`) is one exchange and a pure function of its outcome: a
:class:`OneExchange`, which the clients run as they run a generator, without a generator's cost
on the commonest calls.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kvpool_client import batching
from kvpool_client.buffers import Target
from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable, PermissionDenied
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import Member
from kvpool_client.core.wire import WireLimits
from kvpool_client.exchange import Request
from kvpool_client.failover import RETRY_ELSEWHERE, ReadPlan
from kvpool_client.failure_log import describe, node_label
from kvpool_client.placement_source import Placement
from kvpool_client.replication import DeleteTally, WritePlan, fan_out
from kvpool_client.request_factory import RequestFactory
from kvpool_client.results import PUT_SUCCESS, GetResult, PutResult, to_codes

R = TypeVar("R")
# Read once: an enum member read off its class is a descriptor call each time (Python 3.11).
_OK, _NOT_FOUND, _UNAVAILABLE, _DRAINING = ErrorCode.OK, ErrorCode.NOT_FOUND, ErrorCode.UNAVAILABLE, ErrorCode.DRAINING
Build = Callable[[batching.Job, WireLimits], Request[Any]]
Outcome = Any  # an exchange's result, or the KVPoolError the node failed it with
Answer = Callable[[batching.Job, Outcome], list[int]]
Usable = Callable[[str], bool]  # node id -> may a request go there now (a breaker gate)
Gate = Callable[[], Usable]  # a fresh gate per round (the breaker's ``gate``)


@dataclass(frozen=True, slots=True)
class CurrentPlacement:
    """Needs the placement to use. Answer: a :class:`~kvpool_client.placement_source.Placement`."""


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """Needs the limits of ``members`` (distinct nodes). Answer: node id -> WireLimits, for those known."""

    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class RunRound:
    """Needs ``jobs`` run, each chunked to its node's limits and ``sizes``.

    Answer: ``(piece, outcome)`` pairs, an outcome being ``build``'s exchange result
    or the :class:`~kvpool_client.core.errors.KVPoolError` the node failed it with.
    """

    jobs: list[batching.Job]
    build: Build
    sizes: Sequence[int] | None = None


Step = CurrentPlacement | FetchLimits | RunRound
Operation = Generator[Step, Any, R]


@dataclass(slots=True)
class OneExchange(Generic[R]):
    """An operation that is ``request`` run on a connection to ``job``'s node, then ``finish(job,
    outcome)``: the outcome being the request's result or the
    :class:`~kvpool_client.core.errors.KVPoolError` the node failed it with."""

    job: batching.Job
    request: Request[Any]
    finish: Callable[[batching.Job, Outcome], R]


Runnable = Operation[R] | OneExchange[R]


def put(
    keys: Sequence[BlockKey], views: Sequence[Target], requests: RequestFactory, gate: Gate
) -> Operation[PutResult]:
    """Store blocks on each key's write owners; see :meth:`~kvpool_client.client.KVPoolClient.put`.
    A node's share of 8 MiB and more goes out as up to ``requests.put_streams(node)`` frames at
    once (:func:`batching.streams`).

    Args:
        views: the blocks' views (:func:`batching.block_views`), one per key.

    Raises:
        UsageError: a key is not a BlockKey, or a block is empty or too large for one of its owners.
    """
    batching.check_keys(keys)
    placement: Placement = yield CurrentPlacement()
    placements = [placement.router.placement(k) for k in keys]
    known = yield FetchLimits(distinct(m for p in placements for m in p.write_owners))
    batching.check_block_sizes(views, lambda i: batching.block_limit(placements[i].write_owners, known))
    plan = WritePlan(keys, placements, placement.write_quorum)
    sizes = [len(v) for v in views]
    causes = yield from drive(
        plan, gate, lambda job, lim: requests.put(job, views, lim), batching.statuses_of, sizes, requests.put_streams
    )
    return PutResult(tuple(plan.statuses()), causes, stored_on=plan.stored_on())


def get(
    keys: Sequence[BlockKey],
    targets: Sequence[Target | None],
    requests: RequestFactory,
    gate: Gate,
) -> Operation[GetResult]:
    """Fetch blocks into ``targets`` (:func:`~kvpool_client.batching.target_views` of the caller's
    buffers; ``None``: allocate per hit), falling back to replicas. A node's share of 8 MiB and
    more goes out as up to ``requests.streams`` frames at once, when every target's size is known."""
    batching.check_keys(keys)
    plan = ReadPlan(keys, (yield from read_orders(keys)))
    filled: list[Target | None] = [None] * len(keys)

    def answer(job: batching.Job, outcome: Outcome) -> list[int]:
        codes, views = batching.get_answer(job, outcome)
        batching.scatter(filled, job, views)
        return codes

    sizes = batching.expected_sizes(targets)  # keeps each answer under the payload limit
    streams = batching.read_streams(targets, requests.streams)
    causes = yield from drive(plan, gate, requests.gets_into(targets), answer, sizes, lambda _: streams)
    return GetResult(plan.statuses(), causes, buffers=tuple(filled))


def direct_job(
    keys: Sequence[BlockKey],
    placement: Placement,
    cached_limits: Callable[[Member], WireLimits | None],
    sizes: Sequence[int] | None = None,
    *,
    write: bool = False,
    allow: Usable = lambda node_id: True,
) -> tuple[batching.Job, WireLimits] | None:
    """The one frame an operation on ``keys`` comes down to, when it does; None: run the plan.

    It does when every key's read order (``write``: its write owners) is the same single
    node, with no replica to fall back to or to write as well, the batch fits one frame of
    that node's known limits (``sizes``: the payload bytes each key may bring or send), and
    ``allow`` (the breaker) lets a request go to it; the plan reports an open circuit. That
    node's answers are then final, so the operation is one exchange (or its
    :func:`batching.streams`) whose result is what the plan would return, without the plan's
    cost on every call: the plan of a one-node pool, cached.

    Raises:
        UsageError: an element of ``keys`` is not a :class:`BlockKey` (as the plan would).
    """
    if len(keys) == 1:  # a scheduler's lookup, a layer's load or save: nothing to group, one key fits any frame
        key = keys[0]
        if not isinstance(key, BlockKey):
            batching.check_keys(keys)  # raises
        placed = placement.router.placement(key)
        owners = placed.write_owners if write else placed.read_order
        if len(owners) != 1 or (limits := cached_limits(owners[0])) is None:
            return None
        job = batching.Job(owners[0], key.namespace, [0], [key.hash], [key.depth])
    else:
        found = _one_frame(keys, placement, cached_limits, sizes, write)
        if found is None:
            return None
        job, limits = found
    # The breaker is asked last: it hands a half-open node's probe to the caller that asks.
    return (job, limits) if allow(job.member.node_id) else None


def _one_frame(
    keys: Sequence[BlockKey],
    placement: Placement,
    cached_limits: Callable[[Member], WireLimits | None],
    sizes: Sequence[int] | None,
    write: bool,
) -> tuple[batching.Job, WireLimits] | None:
    """:func:`direct_job` of a batch, before the breaker is asked."""
    batching.check_keys(keys)
    member: Member | None = None
    for key in keys:
        placed = placement.router.placement(key)
        order = placed.write_owners if write else placed.read_order
        if len(order) != 1 or (member is not None and order[0].node_id != member.node_id):
            return None
        member = order[0]
    if member is None or (limits := cached_limits(member)) is None:
        return None
    job = batching.one_frame_job(member, keys)
    if job is None or len(batching.chunk(job, limits, sizes)) != 1:
        return None  # several namespaces or hash sizes, or over the frame limits
    return job, limits


def one_node_get(
    job: batching.Job, limits: WireLimits, targets: list[Target | None], requests: RequestFactory
) -> GetResult | Runnable[GetResult]:
    """A get that ``job``'s node alone answers (:func:`direct_job`). Its result, when the node's arena
    mapped here served it with no I/O at all (every block's place known here): a same-node load runs
    nothing. Else the step that asks the node: its frames at once on separate connections (a large
    batch, :func:`batching.streams`), or one exchange."""
    fetch = requests.fetch(job, targets, limits)
    if isinstance(fetch, tuple):
        return get_result(job, fetch)
    if len(targets) > 1:  # one block is one frame
        sizes = batching.expected_sizes(targets)
        lanes = batching.streams(job, sizes, batching.read_streams(targets, requests.streams))
        if len(lanes) > 1:
            return _one_round(RunRound(lanes, requests.gets_into(targets), sizes), len(targets), streamed_result)
    return OneExchange(job, fetch, get_result)


def one_node_probe(
    job: batching.Job, limits: WireLimits, prefix: bool, requests: RequestFactory
) -> OneExchange[tuple[ErrorCode, ...]]:
    """:func:`probe` of keys that ``job``'s node alone reads (:func:`direct_job`): one exchange."""
    return OneExchange(job, requests.exists(job, limits, prefix), prefix_result if prefix else probe_result)


def one_node_put(
    job: batching.Job, limits: WireLimits, views: Sequence[Target], requests: RequestFactory
) -> Runnable[PutResult | None]:
    """A put that ``job``'s node alone stores (:func:`direct_job` with ``write``): its frames at once
    on separate connections (a large batch, :func:`batching.streams`), else one exchange. Its result
    is None when the node drains: the plan then writes to a spare, and puts are idempotent.

    Raises:
        UsageError: a block is empty or too large for the node.
    """
    batching.check_block_sizes(views, lambda _: limits.max_block_size)
    if len(views) > 1:  # one block is one frame
        sizes = [len(v) for v in views]
        lanes = batching.streams(job, sizes, requests.put_streams(job.member))
        if len(lanes) > 1:
            build: Build = lambda piece, lim: requests.put(piece, views, lim)  # noqa: E731
            return _one_round(RunRound(lanes, build, sizes), len(views), put_result)
    return OneExchange(job, requests.put(job, views, limits), one_put_result)


def _one_round(
    step: RunRound, count: int, finish: Callable[[int, list[tuple[batching.Job, Outcome]]], R]
) -> Operation[R]:
    """A one-node operation of ``count`` keys that is one round of exchanges (a large batch's
    streams, :func:`batching.streams`), then ``finish(count, outcomes)``."""
    outcomes = yield step
    return finish(count, outcomes)


def one_put_result(job: batching.Job, outcome: Outcome) -> PutResult | None:
    """:func:`put_result` of a put that was the single exchange of ``job`` (every key of the batch)."""
    return put_result(len(job.indices), ((job, outcome),))


def put_result(count: int, outcomes: Sequence[tuple[batching.Job, Outcome]]) -> PutResult | None:
    """The result :func:`put` gives ``count`` keys whose only owner answered ``outcomes`` (each
    piece's statuses, or the failure); None when it drains (:func:`one_node_put`). With one answer
    per key, the plan's status of a key is that answer."""
    codes: list[int] = [_UNAVAILABLE] * count
    causes: dict[str, None] = {}
    for piece, outcome in outcomes:
        answered = batching.statuses_of(piece, outcome)
        if _DRAINING in answered:
            return None
        if isinstance(outcome, KVPoolError):
            causes[cause(piece.member, outcome)] = None
        batching.scatter(codes, piece, answered)
    statuses = to_codes(codes)
    owner = (outcomes[0][0].member.address,)
    stored_on = tuple([owner if status in PUT_SUCCESS else () for status in statuses])
    return PutResult(statuses, tuple(causes)[:MAX_CAUSES], stored_on=stored_on)


def get_result(job: batching.Job, outcome: Outcome) -> GetResult:
    """The result of a get that was the single exchange of ``job`` (see :func:`direct_job`)."""
    if isinstance(outcome, KVPoolError):
        codes, views = batching.get_answer(job, outcome)
        return GetResult(to_codes(codes), (cause(job.member, outcome),), buffers=tuple(views))
    return GetResult(to_codes(outcome[0]), buffers=tuple(outcome[1]))


def streamed_result(count: int, outcomes: Sequence[tuple[batching.Job, Outcome]]) -> GetResult:
    """The result of a get of ``count`` keys that was the exchanges of a direct job's streams
    (:func:`batching.streams`): :func:`get_result` of each piece, put back in the batch's order."""
    codes: list[int] = [_UNAVAILABLE] * count
    views: list[Target | None] = [None] * count
    causes: dict[str, None] = {}
    for piece, outcome in outcomes:
        piece_codes, piece_views = batching.get_answer(piece, outcome)
        batching.scatter(codes, piece, piece_codes)
        batching.scatter(views, piece, piece_views)
        if isinstance(outcome, KVPoolError):
            causes[cause(piece.member, outcome)] = None
    return GetResult(to_codes(codes), tuple(causes)[:MAX_CAUSES], buffers=tuple(views))


def probe_result(job: batching.Job, outcome: Outcome) -> tuple[ErrorCode, ...]:
    """What :func:`probe` returns for an exists that was the single exchange of ``job``."""
    return to_codes(batching.statuses_of(job, outcome))


def prefix_result(job: batching.Job, outcome: Outcome) -> tuple[ErrorCode, ...]:
    """:func:`probe_result` of a lookup (``prefix``), settled as the plan settles one: past its first
    miss, keys the plan would have asked elsewhere are not looked for."""
    codes = probe_result(job, outcome)
    miss = next((i for i, code in enumerate(codes) if code is not _OK), None)
    if miss is None:
        return codes
    rest = (_NOT_FOUND if code in RETRY_ELSEWHERE else code for code in codes[miss + 1 :])
    return codes[: miss + 1] + tuple(rest)


def probe(
    keys: Sequence[BlockKey], prefix: bool, requests: RequestFactory, gate: Gate
) -> Operation[tuple[ErrorCode, ...]]:
    """Per key, whether some reader stores it (``prefix``: only the leading run of hits matters)."""
    batching.check_keys(keys)
    orders = yield from read_orders(keys)
    plan = ReadPlan(keys, orders, prefix=prefix)
    # A node may stop at its first miss only when no other replica could fill the gap.
    node_prefix = prefix and all(len(order) == 1 for order in orders)
    yield from drive(plan, gate, lambda job, lim: requests.exists(job, lim, node_prefix), batching.statuses_of)
    return plan.statuses()


def delete(keys: Sequence[BlockKey], requests: RequestFactory, gate: Gate) -> Operation[list[bool]]:
    """Remove blocks from every reachable reader; True where some node removed one.

    Raises:
        NodeUnavailable, RequestTimeout: no reader of some key could be reached.
        PermissionDenied: this client's token may not delete in a key's namespace.
    """
    batching.check_keys(keys)
    tally = DeleteTally(len(keys))
    jobs = fan_out(keys, (yield from read_orders(keys)), gate())
    failure: KVPoolError | None = None
    outcomes: list[tuple[batching.Job, Outcome]] = yield RunRound(jobs, requests.delete)
    for job, outcome in outcomes:
        if isinstance(outcome, KVPoolError):
            failure = failure or outcome
        tally.record(job, None if isinstance(outcome, KVPoolError) else outcome)
    if tally.unreached():
        raise failure or NodeUnavailable(f"no reader of key {tally.unreached()[0]} is reachable")
    if tally.denied:
        raise PermissionDenied("this token's tenant may not delete in some key's namespace")
    return tally.removed


def read_orders(keys: Sequence[BlockKey]) -> Operation[list[tuple[Member, ...]]]:
    """Each key's read order under the current placement."""
    placement: Placement = yield CurrentPlacement()
    return [placement.router.placement(k).read_order for k in keys]


def drive(
    plan: batching.RoundPlan,
    gate: Gate,
    build: Build,
    answer: Answer,
    sizes: Sequence[int] | None = None,
    streams: Callable[[Member], int] | None = None,
) -> Operation[tuple[str, ...]]:
    """Run ``plan`` round after round until it has nothing left to send; each node's job of a
    round as up to ``streams(node)`` jobs the client runs at once (:func:`batching.streams`).

    Returns:
        Why nodes failed, one line per node and error, naming the node (at most
        :data:`MAX_CAUSES`): what a result's ``raise_for_errors`` tells.
    """
    causes: dict[str, None] = {}
    while jobs := plan.next_round(gate()):
        if streams is not None:
            jobs = [piece for job in jobs for piece in batching.streams(job, sizes, streams(job.member))]
        outcomes: list[tuple[batching.Job, Outcome]] = yield RunRound(jobs, build, sizes)
        for piece, outcome in outcomes:
            if isinstance(outcome, KVPoolError) and len(causes) < MAX_CAUSES:
                causes[cause(piece.member, outcome)] = None
            plan.record(piece, answer(piece, outcome))
    return tuple(causes)


MAX_CAUSES = 4


def cause(member: Member, exc: KVPoolError) -> str:
    """``node-1 (10.0.0.5:7700): UNAVAILABLE: connection refused``: a failure, naming its node."""
    return f"{node_label(member.node_id, member.address)}: {describe(exc)}"


def distinct(members: Iterable[Member]) -> tuple[Member, ...]:
    """``members`` with one entry per node id (the last seen), in first-seen order."""
    return tuple({m.node_id: m for m in members}.values())


def limits_to_fetch(
    members: Iterable[Member], cached: Callable[[Member], WireLimits | None], usable: Usable
) -> list[Member]:
    """The members whose limits are not ``cached`` yet and whose node ``usable`` lets us ask."""
    return [m for m in members if cached(m) is None and usable(m.node_id)]


def known_limits(members: Iterable[Member], cached: Callable[[Member], WireLimits | None]) -> dict[str, WireLimits]:
    """Node id -> limits, for the ``members`` whose limits are ``cached``."""
    known = {m.node_id: cached(m) for m in members}
    return {n: lim for n, lim in known.items() if lim is not None}
