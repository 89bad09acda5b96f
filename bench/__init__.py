"""Benchmarks of kvpool against memcpy, a raw TCP stream and Redis (run ``bench/blocks.py``)."""
