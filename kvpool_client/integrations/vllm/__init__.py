"""kvpool in vLLM 0.33, two ways (docs/vllm.md):

- :mod:`.connector`: ``KVPoolConnector``, a KV connector (``KVConnectorBase_V1``);
- :mod:`.tier`: ``KVPoolTier``, a secondary tier of vLLM's ``OffloadingConnector``.

Only those two modules import vLLM. The others hold the logic and are tested without it:
:mod:`.shape` (what goes into a block's namespace, per rank), :mod:`.scheduler` (the
connector's per-step plan), :mod:`.lookup` (a block counts when every rank holds it),
:mod:`.blocks` (per-layer KV tensors as pool blocks), :mod:`.streams` (copies ordered after
vLLM's GPU stream) and :mod:`.worker` (the transfers).
"""
