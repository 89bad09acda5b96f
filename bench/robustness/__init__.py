"""Robustness runs against live daemons: what hostile input, faults and load must not break.

``fuzz.py`` (the live fuzzer, package ``fuzzing``), ``soak.py`` (the soak under chaos,
package ``chaos``) and ``hostile.py`` (a client's throughput among hostile peers).
"""
