"""The soak under chaos (``bench/robustness/soak.py``): 3 daemons with R=2, clients checking every byte, faults.

One concept per module: ``settings`` (a run's shape and the client configuration),
``clients`` (the worker processes and what they record), ``cluster`` (etcd and the
daemons: start, queries, stop), ``faults`` (each fault, its window, and the driver
that applies them in turn), ``verdicts`` (expected and lost blocks, misses, crashes),
``run`` (one run end to end) and ``report``.
"""
