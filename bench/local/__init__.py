"""Local clusters on loopback (etcd and daemons as real processes) for the demo, benchmarks and tests."""
