"""Both clients run one script against the same real daemon and must give the same answers.

``test_client_parity.py`` checks that the two clients have the same methods; this checks
they do the same thing with them. Each public method of the blocking client is called at least once
(the script's coverage is checked too), then the async client repeats the script on a node
the first run left empty. A second script runs with one node of two down: both clients must
fail the same keys with the same codes and raise the same errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool_client import AsyncKVPoolClient, BlockKeyBuilder, ClientConfig, KVPoolClient, Namespace
from kvpool_client.core.control import NodeInfo
from kvpool_client.core.errors import KVPoolError
from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_client.counters import ClientStats
from kvpool_client.placement_source import Placement
from kvpool_client.results import BatchResult, GetResult
from tests.client.test_client_parity import public_methods
from tests.support.daemon import DaemonProcess

NS = Namespace("parity-model", "fp16", "L1-H1-D8-T4")
KEYS = BlockKeyBuilder(NS, block_size=4).keys(list(range(40)))  # 10 blocks of 4 tokens
BLOCKS = [bytes([i]) * 4096 for i in range(len(KEYS))]


@dataclass(frozen=True, slots=True)
class Step:
    method: str
    args: Callable[[str], tuple[Any, ...]]  # given the node's address; fresh buffers each run
    kwargs: Callable[[], dict[str, Any]] = dict


REGION = bytearray(64 << 10)
SCRIPT = (
    Step("put", lambda _: (KEYS[:4], BLOCKS[:4])),
    Step("put", lambda _: (KEYS[:4], BLOCKS[:4])),  # ALREADY_EXISTS
    Step("get", lambda _: (KEYS[:6],)),
    Step("get", lambda _: (KEYS[:2],), lambda: {"into": [bytearray(4096), bytearray(4096)]}),
    Step("get", lambda _: (KEYS[:1],), lambda: {"into": [bytearray(100)]}),  # SIZE_MISMATCH
    Step("exists", lambda _: (KEYS[:6],)),
    Step("lookup", lambda _: (KEYS[:6],)),
    Step("delete", lambda _: (KEYS[2:5],)),
    Step("lookup", lambda _: (KEYS[:6],)),
    Step("counters", lambda _: ()),
    Step("placement", lambda _: ()),
    Step("server_info", lambda address: (address,)),
    Step("transport", lambda address: (address,)),
    Step("namespaces", lambda address: (address,)),
    Step("stats", lambda address: (address,)),
    Step("flush_namespace", lambda _: (NS,)),
    Step("put", lambda _: (KEYS[8:10], BLOCKS[8:10])),
    Step("flush_model", lambda _: (NS.model,)),
    Step("namespaces", lambda address: (address,)),
    # One key into one buffer: the blocking client's own lane (no batch planned).
    Step("put", lambda _: (KEYS[:1], BLOCKS[:1])),
    Step("get", lambda _: (KEYS[:1],), lambda: {"into": [bytearray(4096)]}),
    Step("get", lambda _: (KEYS[1:2],), lambda: {"into": [bytearray(4096)]}),  # NOT_FOUND
    Step("get", lambda _: (KEYS[:1],), lambda: {"into": [bytearray(100)]}),  # SIZE_MISMATCH
    Step("get", lambda _: (["not a key"],), lambda: {"into": [bytearray(4096)]}),  # UsageError
    Step("get", lambda _: (KEYS[:1],), lambda: {"into": [bytes(4096)]}),  # read-only: UsageError
    Step("counters", lambda _: ()),
    Step("delete", lambda _: (KEYS[:1],)),  # the node as the script found it, for the next client
    Step("register", lambda _: (REGION,)),  # for the one-sided data plane, which this node does not offer
    Step("unregister", lambda _: (REGION,)),
)


def summary(result: object) -> object:
    """What a caller sees in a result, without what differs run to run (node ids, timings)."""
    if isinstance(result, GetResult):
        return [s.name for s in result.statuses], [None if b is None else bytes(b) for b in result.buffers]
    if isinstance(result, BatchResult):
        return [s.name for s in result.statuses], list(result.causes)
    if isinstance(result, ClientStats):
        totals = {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name != "node_errors"}
        return totals, {node: dict(codes) for node, codes in result.node_errors.items()}
    if isinstance(result, Placement):
        return [m.address for m in result.router.members()], result.write_quorum, result.revision
    if isinstance(result, NodeInfo):
        return result.address, result.node_id, result.data_endpoints, result.limits, result.state
    if isinstance(result, pb.Stats):
        return result.node_id, [(t.name, t.blocks, t.used_bytes) for t in result.tiers]
    if isinstance(result, list) and result and isinstance(result[0], pb.NamespaceUsage):
        return [(r.namespace, r.tier, r.blocks, r.bytes) for r in result]
    return result


def failure(exc: KVPoolError) -> tuple[str, str]:
    """An exception as both clients must raise it: type and code (gRPC writes the message)."""
    return type(exc).__name__, exc.code.name


def run_blocking(nodes: tuple[str, ...], script: Sequence[Step]) -> list[object]:
    with KVPoolClient(config=ClientConfig(nodes=nodes)) as client:
        seen = []
        for step in script:
            try:
                seen.append(summary(getattr(client, step.method)(*step.args(nodes[0]), **step.kwargs())))
            except KVPoolError as exc:
                seen.append(failure(exc))
        return seen


async def run_async(nodes: tuple[str, ...], script: Sequence[Step]) -> list[object]:
    async with AsyncKVPoolClient(config=ClientConfig(nodes=nodes)) as client:
        seen = []
        for step in script:
            try:
                answer = getattr(client, step.method)(*step.args(nodes[0]), **step.kwargs())
                seen.append(summary(await answer if inspect.isawaitable(answer) else answer))
            except KVPoolError as exc:
                seen.append(failure(exc))
        return seen


def run_both(nodes: tuple[str, ...], script: Sequence[Step]) -> dict[str, object]:
    """The blocking client's answers by ``<step>:<method>``, once the async client gave the same."""
    blocking = labelled(script, run_blocking(nodes, script))
    asynchronous = labelled(script, asyncio.run(run_async(nodes, script)))
    differ = [(b, a) for b, a in zip(blocking, asynchronous, strict=True) if b != a]
    assert not differ, f"answers differ (blocking, async): {differ}"
    return dict(blocking)


def labelled(script: Sequence[Step], answers: Sequence[object]) -> list[tuple[str, object]]:
    return [(f"{i}:{step.method}", answer) for i, (step, answer) in enumerate(zip(script, answers, strict=True))]


def test_the_script_calls_every_public_method() -> None:
    called = {step.method for step in SCRIPT}
    skipped = {"close": "run by the with blocks"}
    uncalled = {name for name in public_methods(KVPoolClient) if not name.startswith("_")} - called - set(skipped)
    assert not uncalled, f"public methods the parity script never calls: {sorted(uncalled)}"


def test_both_clients_answer_the_script_alike(daemon: DaemonProcess) -> None:
    by_step = run_both((daemon.address,), SCRIPT)
    assert by_step["1:put"] == (["ALREADY_EXISTS"] * 4, []), by_step["1:put"]
    assert by_step["2:get"][0] == ["OK"] * 4 + ["NOT_FOUND"] * 2, by_step["2:get"]
    assert by_step["4:get"][0] == ["SIZE_MISMATCH"], by_step["4:get"]
    assert (by_step["6:lookup"], by_step["8:lookup"]) == (4, 2)
    assert (by_step["15:flush_namespace"], by_step["17:flush_model"], by_step["18:namespaces"]) == (2, 2, []), (
        "keys 0 and 1 outlive the delete; the model flush takes the two put after"
    )
    one_key = [by_step[f"{i}:get"] for i in range(20, 25)]
    assert one_key[:3] == [(["OK"], [BLOCKS[0]]), (["NOT_FOUND"], [None]), (["SIZE_MISMATCH"], [None])], one_key
    assert one_key[3:] == [("UsageError", "INVALID_ARGUMENT")] * 2, one_key


def test_both_clients_fail_alike_with_a_node_down(daemon: DaemonProcess) -> None:
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{probe.getsockname()[1]}"
    script = (
        Step("put", lambda _: (KEYS, BLOCKS)),
        Step("get", lambda _: (KEYS,)),
        Step("exists", lambda _: (KEYS,)),
        Step("lookup", lambda _: (KEYS,)),
        Step("delete", lambda _: (KEYS,)),
        Step("counters", lambda _: ()),
        Step("flush_namespace", lambda _: (NS,)),
        *(Step("get", lambda _, i=i: (KEYS[i : i + 1],), lambda: {"into": [bytearray(4096)]}) for i in range(10)),
        Step("counters", lambda _: ()),
    )
    by_step = run_both((daemon.address, down), script)
    statuses = by_step["0:put"][0]
    assert "UNAVAILABLE" in statuses and "OK" in statuses, f"keys spread over both nodes: {statuses}"
    assert by_step["4:delete"][0] == "NodeUnavailable", by_step["4:delete"]
    assert by_step["5:counters"][1] == {down: {"UNAVAILABLE": 1}}, by_step["5:counters"]
    assert by_step["6:flush_namespace"][0] == "NodeUnavailable", by_step["6:flush_namespace"]
    one_key = [by_step[f"{i}:get"][0] for i in range(7, 17)]
    assert ["UNAVAILABLE"] in one_key and ["NOT_FOUND"] in one_key, f"one key at a time, on each node: {one_key}"
