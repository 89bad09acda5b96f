"""kvpool in SGLang 0.5.23: a HiCache L3 storage backend (docs/sglang.md).

- :mod:`.store`: ``KVPoolStore``, the ``HiCacheStorage`` SGLang's ``dynamic`` backend loads
  (``"module_path": "kvpool_client.integrations.sglang.store", "class_name": "KVPoolStore"``).

- :mod:`.pools`: which of SGLang's host KV pools are stored, their page shape and the
  views of a page's parts.

Only those two modules import SGLang. The others hold the logic and import torch at most:
:mod:`.shape` (what goes into a page's namespace, and page keys as pool keys) and
:mod:`.pages` (the host pool's page memory as pool blocks).
"""
