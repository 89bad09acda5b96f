"""kvpool client SDK: block keys, and blocking and asyncio clients of a kvpool cluster.

The names below load on first use (PEP 562), so importing a submodule such as
``kvpool_client.core.wire`` does not pull in both clients,
gRPC and the transports: an engine loads only what it touches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "AsyncKVPoolClient": "kvpool_client.aio",
    "BatchResult": "kvpool_client.results",
    "BlockKey": "kvpool_client.core.keys",
    "BlockKeyBuilder": "kvpool_client.core.keys",
    "CircuitBreaker": "kvpool_client.breaker",
    "CircuitState": "kvpool_client.breaker",
    "ClientConfig": "kvpool_client.core.config",
    "ClientStats": "kvpool_client.counters",
    "ErrorCode": "kvpool_client.core.errors",
    "GetResult": "kvpool_client.results",
    "KVPoolClient": "kvpool_client.client",
    "KVPoolError": "kvpool_client.core.errors",
    "LimitExceeded": "kvpool_client.core.errors",
    "Namespace": "kvpool_client.core.keys",
    "NodeUnavailable": "kvpool_client.core.errors",
    "ProtocolError": "kvpool_client.core.errors",
    "PutResult": "kvpool_client.results",
    "RequestTimeout": "kvpool_client.core.errors",
    "ServerError": "kvpool_client.core.errors",
    "UsageError": "kvpool_client.core.errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # `X as X`: the lazy names, re-exported for type checkers (PEP 484)
    from kvpool_client.aio import AsyncKVPoolClient as AsyncKVPoolClient
    from kvpool_client.breaker import CircuitBreaker as CircuitBreaker
    from kvpool_client.breaker import CircuitState as CircuitState
    from kvpool_client.client import KVPoolClient as KVPoolClient
    from kvpool_client.core.config import ClientConfig as ClientConfig
    from kvpool_client.core.errors import ErrorCode as ErrorCode
    from kvpool_client.core.errors import KVPoolError as KVPoolError
    from kvpool_client.core.errors import LimitExceeded as LimitExceeded
    from kvpool_client.core.errors import NodeUnavailable as NodeUnavailable
    from kvpool_client.core.errors import ProtocolError as ProtocolError
    from kvpool_client.core.errors import RequestTimeout as RequestTimeout
    from kvpool_client.core.errors import ServerError as ServerError
    from kvpool_client.core.errors import UsageError as UsageError
    from kvpool_client.core.keys import BlockKey as BlockKey
    from kvpool_client.core.keys import BlockKeyBuilder as BlockKeyBuilder
    from kvpool_client.core.keys import Namespace as Namespace
    from kvpool_client.counters import ClientStats as ClientStats
    from kvpool_client.results import BatchResult as BatchResult
    from kvpool_client.results import GetResult as GetResult
    from kvpool_client.results import PutResult as PutResult


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvpool_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
