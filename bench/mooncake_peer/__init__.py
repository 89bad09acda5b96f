"""Mooncake Store as a peer in the block benchmark: its venv (env), master and store node (servers), clients (drivers).

Four ways to read it, each a system of bench/blocks.py:

- ``mooncake``: the bytes API (``get``, ``get_batch``) over TCP, copied into the destination.
- ``mooncake-zc``: the zero-copy API over TCP (``register_buffer``, then ``get_into`` and
  ``batch_get_into`` straight into the destination).
- ``mooncake-local``: same-host mode (``setup_dummy`` attached to the store node), bytes API.
- ``mooncake-local-zc``: same-host mode, ``batch_get_into`` into buffers of Mooncake's shared
  pool (``alloc_from_mem_pool``): in that mode only pool memory can be registered, so these
  gets land in the pool, not in the benchmark's destinations.

Benchmark clients mount no segment: a client's own segment would serve its reads by an
in-process memcpy, and the store would spread blocks over the clients' segments.
"""

TCP_SYSTEMS = ("mooncake", "mooncake-zc")
LOCAL_SYSTEMS = ("mooncake-local", "mooncake-local-zc")
SYSTEMS = TCP_SYSTEMS + LOCAL_SYSTEMS
POOL_SYSTEMS = ("mooncake-local-zc",)  # its gets land in Mooncake's pool, not in the benchmark's destinations
