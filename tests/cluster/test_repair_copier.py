"""BlockCopier against a scripted target, without sockets: what a refusal, a transport
failure and a BUSY answer do to the tally and to the rest of the copy.

The target is a fake client that answers each put from a script and records every
request; the store is a dict of byte strings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import cast

from kvpool_client.core.auth import Credentials
from kvpool_client.core.control import NodeInfo
from kvpool_client.core.errors import ErrorCode, UsageError
from kvpool_client.core.keys import BlockKey
from kvpool_client.core.routing import Member
from kvpool_client.core.wire import WireLimits
from kvpool_client.results import PutResult
from kvpool_server.index import StoreKey
from kvpool_server.membership.copies import PUT_BATCH, BlockCopier, CopyTally, Pacer
from kvpool_server.tiers.store import BlockStore, HeldBlock

NS = "copier@u8"
LIMIT = 4096
Answer = Callable[[Sequence[BlockKey]], list[ErrorCode]]


class Store:
    """The blocks held here; acquire/release as BlockStore has them."""

    def __init__(self, blocks: dict[StoreKey, bytes]) -> None:
        self.blocks = blocks

    async def acquire(self, keys: Sequence[StoreKey], *, touch: bool = True) -> list[HeldBlock | None]:
        return [HeldBlock(memoryview(self.blocks[k]), 0, None) if k in self.blocks else None for k in keys]

    def release(self, held: Sequence[HeldBlock | None]) -> None:
        pass


class Target:
    """A scripted target: ``answer`` gives each put's statuses; every put is recorded."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.puts: list[list[BlockKey]] = []

    async def server_info(self, address: str) -> NodeInfo:
        return NodeInfo(address, "target", {}, WireLimits(max_block_size=LIMIT), 1)

    async def exists(self, keys: Sequence[BlockKey]) -> list[bool]:
        return [False] * len(keys)

    async def put(self, keys: Sequence[BlockKey], blocks: Sequence[memoryview]) -> PutResult:
        if any(len(b) > LIMIT for b in blocks):  # what the real client does, before sending anything
            raise UsageError("block too large", ErrorCode.BLOCK_TOO_LARGE)
        self.puts.append(list(keys))
        statuses = self.answer(keys)
        return PutResult(tuple(statuses), stored_on=tuple((("target",) if s is ErrorCode.OK else ()) for s in statuses))


def keys(count: int, tag: int = 0) -> list[StoreKey]:
    return [(NS, bytes([tag]) + i.to_bytes(31, "big")) for i in range(count)]


def copy(store: Store, target: Target, calls: Sequence[Sequence[StoreKey]]) -> tuple[list[CopyTally], BlockCopier]:
    """Run one copier's ``copy()`` once per entry of ``calls``; each call's summed tally."""

    async def scenario() -> tuple[list[CopyTally], BlockCopier]:
        copier = BlockCopier(cast(BlockStore, store), Member("target", "127.0.0.1:1"), Credentials(), Pacer(0))
        copier._client = target  # type: ignore[assignment]  # the scripted target instead of sockets
        totals = []
        for call in calls:
            total = CopyTally()
            async for tally in copier.copy(call, skip_present=False):
                total.add(tally)
            totals.append(total)
        return totals, copier

    return asyncio.run(scenario())


def every(code: ErrorCode) -> Answer:
    return lambda keys: [code] * len(keys)


def test_a_block_over_the_target_limit_fails_alone_and_its_batch_is_sent() -> None:
    small = keys(PUT_BATCH)
    big = (NS, b"big".ljust(32, b"\0"))
    store = Store({**{k: b"s" * 1000 for k in small}, big: b"b" * (LIMIT + 1)})
    target = Target(every(ErrorCode.OK))
    [tally], copier = copy(store, target, [[big, *small]])
    assert tally == CopyTally(copies=len(small), failed=1, refused=1, bytes=1000 * len(small))
    assert sum(len(p) for p in target.puts) == len(small) and not copier.broken


def test_a_refusal_does_not_write_off_the_rest_of_the_copy() -> None:
    store = Store({k: b"x" * 100 for k in keys(3 * PUT_BATCH)})
    target = Target(every(ErrorCode.OUT_OF_SPACE))
    [tally], _ = copy(store, target, [keys(3 * PUT_BATCH)])
    assert len(target.puts) == 3, "every batch is offered"
    assert tally == CopyTally(failed=3 * PUT_BATCH, refused=3 * PUT_BATCH, bytes=3 * PUT_BATCH * 100)


def test_an_unreachable_target_writes_off_the_rest_of_the_call_only() -> None:
    store = Store({k: b"x" * 100 for k in keys(3 * PUT_BATCH) + keys(PUT_BATCH, tag=1)})
    answers = iter([ErrorCode.TIMEOUT, ErrorCode.OK])
    target = Target(lambda batch: [next(answers)] * len(batch))
    first, second = copy(store, target, [keys(3 * PUT_BATCH), keys(PUT_BATCH, tag=1)])[0]
    assert first == CopyTally(failed=3 * PUT_BATCH), "after a timeout nothing more is sent, and nothing counted"
    assert second == CopyTally(copies=PUT_BATCH, bytes=PUT_BATCH * 100), "the next call tries the target again"
    assert len(target.puts) == 2


def test_only_answers_of_room_or_size_count_as_refusals() -> None:
    store = Store({k: b"x" * 100 for k in keys(5)})
    answers = [ErrorCode.QUOTA_EXCEEDED, ErrorCode.OUT_OF_SPACE, ErrorCode.BLOCK_TOO_LARGE, ErrorCode.BUSY,
               ErrorCode.INTERNAL]  # fmt: skip
    [tally], _ = copy(store, Target(lambda batch: answers), [keys(5)])
    assert tally == CopyTally(failed=5, refused=3, bytes=500), "BUSY and INTERNAL may pass: retried"


def test_busy_is_not_a_stored_copy() -> None:
    store = Store({k: b"x" * 100 for k in keys(4)})
    target = Target(lambda batch: [ErrorCode.BUSY, ErrorCode.ALREADY_EXISTS, ErrorCode.OK, ErrorCode.BUSY])
    [tally], copier = copy(store, target, [keys(4)])
    assert tally == CopyTally(copies=1, present=1, failed=2, bytes=400)
    assert not copier.broken


def test_blocks_gone_since_planning_are_counted_apart() -> None:
    store = Store({k: b"x" * 100 for k in keys(2)})
    [tally], _ = copy(store, Target(every(ErrorCode.OK)), [keys(3)])
    assert tally == CopyTally(copies=2, gone=1, bytes=200)
