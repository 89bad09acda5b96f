"""kvpool client SDK: block keys, and blocking and asyncio clients of a kvpool cluster."""

from kvpool_client.aio import AsyncKVPoolClient
from kvpool_client.breaker import CircuitBreaker, CircuitState
from kvpool_client.client import KVPoolClient
from kvpool_client.config import ClientConfig
from kvpool_client.counters import ClientStats
from kvpool_client.errors import (
    ErrorCode,
    KVPoolError,
    LimitExceeded,
    NodeUnavailable,
    ProtocolError,
    RequestTimeout,
    ServerError,
    UsageError,
)
from kvpool_client.keys import BlockKey, BlockKeyBuilder, Namespace
from kvpool_client.results import BatchResult, GetResult, PutResult

__all__ = [
    "AsyncKVPoolClient",
    "BatchResult",
    "BlockKey",
    "BlockKeyBuilder",
    "CircuitBreaker",
    "CircuitState",
    "ClientConfig",
    "ClientStats",
    "ErrorCode",
    "GetResult",
    "KVPoolClient",
    "KVPoolError",
    "LimitExceeded",
    "Namespace",
    "NodeUnavailable",
    "ProtocolError",
    "PutResult",
    "RequestTimeout",
    "ServerError",
    "UsageError",
]
