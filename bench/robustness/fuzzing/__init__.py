"""The live fuzzer of a kvpool daemon (``bench/robustness/fuzz.py``): its data plane and gRPC under hostile input.

One concept per module: ``target`` (the daemon under fuzz: its limits, flags and
probes), ``cases`` (data-plane cases and their mutations), ``tally`` (what a fuzzer
saw), ``dataplane`` (lanes of TCP connections playing cases), ``control`` (the gRPC
fuzzer), ``good_client`` (the well-behaved client checking every byte), ``run``
(one run: daemon, fuzzer processes, memory sampling) and ``report``.
"""
