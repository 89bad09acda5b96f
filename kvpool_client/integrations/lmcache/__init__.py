"""kvpool in LMCache 0.5.6, as a remote storage plugin (docs/lmcache.md).

- :mod:`.connector`: ``KVPoolConnector``, LMCache's ``RemoteConnector``; the only module
  that imports LMCache.

The others hold the logic: :mod:`.settings` (the plugin's ``extra_config`` keys),
:mod:`.keys` (LMCache chunk keys as pool keys), :mod:`.chunks` (LMCache memory objects as
buffers), :mod:`.transfers` (batches of chunks in one pool call each) and :mod:`.guard`
(failures become misses).
"""
