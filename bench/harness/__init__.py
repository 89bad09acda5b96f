"""What several benchmarks share: the cells of the block benchmark and its kin, their servers and report.

One concept per module: ``workload`` (cell shapes, block contents, keys, checksums),
``clients`` (client processes, bursts, verification), ``drivers`` (the client side of
each system), ``servers`` (daemon, Redis and socket server life cycles), ``sockio``
(scatter/gather socket I/O), ``cells`` (result cells), ``machine`` (foreign CPU load),
``procs`` (Ctrl-C-safe children), ``report`` (JSON, markdown, plots, ratios), ``pki``
(throwaway certificates) and ``comparisons`` (what the engine integrations' benchmarks
share: model KV shapes, figures over rounds, the report).
"""
