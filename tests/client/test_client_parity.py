"""The asyncio clients checked against the blocking ones they mirror by hand.

Every public method of one exists on the other with the same parameters (names, kinds,
defaults, annotations) and return annotation; the async one is a coroutine unless it does
no I/O. The differences that are meant are listed below with their reasons.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kvpool_client.aio import AsyncKVPoolClient
from kvpool_client.client import KVPoolClient
from kvpool_client.core.config import ClientConfig
from kvpool_client.core.control import AsyncControlClient, ControlClient

# The context-manager protocols differ by design; each pairs with its async twin.
PROTOCOL_TWINS = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


@dataclass(frozen=True, slots=True)
class Pair:
    sync: type
    aio: type
    # Public methods only one side has: name -> why.
    only_sync: dict[str, str]
    only_async: dict[str, str]
    # Methods that stay plain functions on the async side: name -> why.
    not_awaited: dict[str, str]


PAIRS = (
    Pair(
        KVPoolClient,
        AsyncKVPoolClient,
        only_sync={},
        only_async={
            "start": "the etcd watch needs the caller's running loop; the blocking client starts "
            "its watch thread in __init__, and operations start the async one anyway",
        },
        not_awaited={
            "counters": "reads the client's own totals: no I/O to wait for",
            "register": "registers memory with this process's NIXL agent: no I/O to wait for",
            "unregister": "the same",
        },
    ),
    Pair(ControlClient, AsyncControlClient, only_sync={}, only_async={}, not_awaited={}),
)


def public_methods(cls: type) -> dict[str, Callable[..., object]]:
    """Callables a caller may use: public names, ``__init__`` and the context-manager hooks."""
    hooks = {"__init__", *PROTOCOL_TWINS, *PROTOCOL_TWINS.values()}
    return {
        name: member
        for name, member in vars(cls).items()
        if (not name.startswith("_") or name in hooks) and callable(member)
    }


def twin_name(sync_name: str) -> str:
    return PROTOCOL_TWINS.get(sync_name, sync_name)


def shape(function: Callable[..., object], pair: Pair) -> list[tuple[str, str, object, str]]:
    """(name, kind, default, annotation) of each parameter, then the return annotation.

    Annotations are compared as written (``from __future__ import annotations``), with each
    class's own name read as the other's so that ``__enter__ -> KVPoolClient`` matches
    ``__aenter__ -> AsyncKVPoolClient``, and ``Awaitable[T]`` (a plain function returning
    an awaitable) read as ``T``.
    """
    signature = inspect.signature(function)

    def norm(annotation: object) -> str:
        text = re.sub(rf"\b{pair.aio.__name__}\b", pair.sync.__name__, str(annotation))
        awaitable = re.fullmatch(r"(?:Awaitable\[(.*)\]|Coroutine\[Any, Any, (.*)\])", text)
        return next(group for group in awaitable.groups() if group) if awaitable else text

    params = [(p.name, p.kind.name, p.default, norm(p.annotation)) for p in signature.parameters.values()]
    return [*params, ("return", "", None, norm(signature.return_annotation))]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair.aio.__name__)
def test_each_public_method_has_its_twin(pair: Pair) -> None:
    sync, aio = public_methods(pair.sync), public_methods(pair.aio)
    missing_async = {twin_name(name) for name in sync} - set(aio) - set(pair.only_sync)
    missing_sync = set(aio) - {twin_name(name) for name in sync} - set(pair.only_async)
    assert not missing_async, f"{pair.sync.__name__} has, {pair.aio.__name__} lacks: {sorted(missing_async)}"
    assert not missing_sync, f"{pair.aio.__name__} has, {pair.sync.__name__} lacks: {sorted(missing_sync)}"
    paired_sync = {name for name in sync if twin_name(name) in aio}
    paired_async = {twin_name(name) for name in paired_sync}
    stale = (set(pair.only_sync) - (set(sync) - paired_sync)) | (set(pair.only_async) - (set(aio) - paired_async))
    assert not stale, f"listed as one-sided but not there (or no longer one-sided): {sorted(stale)}"


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair.aio.__name__)
def test_twins_take_the_same_parameters(pair: Pair) -> None:
    aio = public_methods(pair.aio)
    differ = {}
    for name, method in public_methods(pair.sync).items():
        twin = aio.get(twin_name(name))
        if twin is not None and shape(method, pair) != shape(twin, pair):
            differ[name] = (str(inspect.signature(method)), str(inspect.signature(twin)))
    assert not differ, f"parameters differ (sync, async): {differ}"


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair.aio.__name__)
def test_the_async_side_awaits_what_the_blocking_side_blocks_on(pair: Pair) -> None:
    sync = public_methods(pair.sync)
    blocking_coroutines = sorted(name for name, method in sync.items() if inspect.iscoroutinefunction(method))
    assert not blocking_coroutines, f"coroutines on {pair.sync.__name__}: {blocking_coroutines}"
    plain = {
        name
        for name, method in public_methods(pair.aio).items()
        if not inspect.iscoroutinefunction(method) and name != "__init__"
    }
    assert plain == set(pair.not_awaited), f"plain functions on {pair.aio.__name__}: {sorted(plain)}"


def test_both_clients_expose_the_same_attributes() -> None:
    config = ClientConfig(nodes=("127.0.0.1:1",))  # never contacted: construction does no I/O
    sync, aio = KVPoolClient(config=config), AsyncKVPoolClient(config=config)
    try:
        public = [sorted(name for name in vars(client) if not name.startswith("_")) for client in (sync, aio)]
        assert public[0] == public[1], f"public attributes (sync, async): {public}"
        assert (sync.config, type(sync.breaker)) == (aio.config, type(aio.breaker))
    finally:
        sync.close()
        asyncio.run(aio.close())
