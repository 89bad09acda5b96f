"""kvpool in SGLang 0.5.23: a HiCache L3 storage backend (docs/sglang.md).

- :mod:`.store`: ``KVPoolStore``, the ``HiCacheStorage`` SGLang's ``dynamic`` backend loads
  (``"module_path": "kvpool_client.integrations.sglang.store", "class_name": "KVPoolStore"``).

Only that module imports SGLang. The others hold the logic and import torch at most:
:mod:`.shape` (what goes into a page's namespace, and page keys as pool keys) and
:mod:`.pages` (the host pool's page memory as pool blocks).
"""
