"""The reference engine of the TTFT benchmark (``bench/ttft.py``): kvpool as an engine's second KV tier.

One concept per module: ``model`` (the transformer), ``pages`` (the paged KV cache),
``prefix_cache`` (page allocation and the local LRU prefix cache), ``pool_tier``
(kvpool as the second KV tier), ``request`` and ``engine`` (continuous
batching), ``worker`` and ``driver`` (engine processes and closed-loop users),
``workload``, ``modes`` (the four serving modes) and ``report``.
"""
