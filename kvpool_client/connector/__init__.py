"""Engine connector: what an inference engine calls to use kvpool as its second KV tier.

Modelled on vLLM's KV connector split:

- scheduler side (:class:`ConnectorScheduler`): how many leading tokens of a request
  the pool holds beyond what the engine has locally; one batched lookup, no bytes;
- worker side (:class:`ConnectorWorker`): load these blocks into these KV pages,
  save these pages as blocks; zero copy for contiguous CPU pages, pinned host
  staging for CUDA or strided pages.

Block keys are vLLM's hash chain (:class:`~kvpool_client.core.keys.BlockKeyBuilder`) in a
namespace that names the model and the block's :class:`KVLayout`, so blocks of
another model, dtype or layout never match. Async twins take an
:class:`~kvpool_client.aio.AsyncKVPoolClient`.
"""

from kvpool_client.connector.layout import DTYPES, KVLayout
from kvpool_client.connector.scheduler import AsyncConnectorScheduler, ConnectorScheduler, PoolMatch
from kvpool_client.connector.staging import KVPages, StagingArea
from kvpool_client.connector.worker import AsyncConnectorWorker, ConnectorWorker, LoadResult, SaveResult

__all__ = [
    "DTYPES",
    "AsyncConnectorScheduler",
    "AsyncConnectorWorker",
    "ConnectorScheduler",
    "ConnectorWorker",
    "KVLayout",
    "KVPages",
    "LoadResult",
    "PoolMatch",
    "SaveResult",
    "StagingArea",
]
