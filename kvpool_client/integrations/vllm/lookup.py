"""The scheduler's question to the pool: how many leading blocks can every worker load?

Each worker loads its own rank's shard of a block (MHA: its KV heads; every pipeline stage:
its layers), so a block is a hit only when the namespace of every rank that writes blocks
holds it. Asking rank 0 alone would offer a block that rank 1 then fails to load.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool_client.client import KVPoolClient
from kvpool_client.core.keys import BlockKey
from kvpool_client.integrations.vllm.shape import EngineNamespaces


class RankLookup:
    """Leading blocks held in every writing rank's namespace (one batched call to the pool).

    Args:
        client: the pool client (the call blocks: it runs on the connector's lookup thread).
    """

    def __init__(self, client: KVPoolClient) -> None:
        self._client = client

    def __call__(self, namespaces: EngineNamespaces, hashes: Sequence[bytes], first: int) -> int:
        writers = namespaces.writers()
        keys = [BlockKey(ns, h, first + i) for ns in writers for i, h in enumerate(hashes)]
        if len(writers) == 1:
            return self._client.lookup(keys)
        found = self._client.exists(keys)
        count = len(hashes)
        held = [all(found[rank * count + i] for rank in range(len(writers))) for i in range(count)]
        return held.index(False) if False in held else count
