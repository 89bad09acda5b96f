"""Prometheus metrics: a collector over the daemon's counters, tier and presence.

Nothing is recorded twice: at each scrape the collector reads :class:`Counters`,
the tiers' reports (:meth:`BlockStore.reports`) and the node's presence, and turns them into metric
families. It lives in a private registry (no global state), served over HTTP by
:class:`MetricsServer` on a background thread so a scrape never touches the
event loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvpool_client.membership.records import NodeState
from kvpool_server.membership.registration import SessionState
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tiers.store import TierReport

# TierReport field -> help, each a counter family labelled by tier.
_TIER_COUNTERS = {
    "hits": "lookups that found the block",
    "misses": "lookups that did not find the block",
    "evictions": "blocks evicted to make room",
    "promotions": "blocks copied up from this tier to the one above",
    "demotions": "blocks copied down into this tier",
    "corrupt_blocks": "blocks dropped after a checksum mismatch",
    "io_errors": "failed reads and writes of the tier's storage",
}
# Counters kept by name only: "<tier>_<suffix>".
_TIER_NAMED_COUNTERS = {
    "blocks_written": "blocks committed",
    "deletes": "blocks deleted on request",
}
_OPS = ("put", "get", "exists", "delete", "ping", "locate")
_PLAIN_COUNTERS = {
    "handoff_started": "hand-offs of this node's blocks started (drain with hand-off)",
    "handoff_finished": "hand-offs finished",
    "handoff_planned": "block copies hand-offs set out to make",
    "handoff_copies": "blocks copied to their new owners by hand-offs",
    "handoff_failures": "blocks a hand-off failed to copy",
    "repair_runs": "repairs started after a membership change (copies of blocks to owners that lack them)",
    "repair_cancelled": "repairs cut short by a newer membership change or shutdown",
    "repair_checked": "(block, owner) pairs repairs asked the owner about",
    "repair_copies": "blocks repairs copied to owners that lacked them",
    "repair_failed": "blocks repairs failed to copy (retried later; refusals for at most 3 runs)",
    "repair_refused": "block copies the owners refused (full, namespace quota, block limit), left until the membership changes",
    "connections_dropped_mid_frame": "data connections closed by the peer or a timeout inside a frame",
    "connections_closed_idle": "data connections closed after idle_timeout_s without a request",
    "dram_evictions_lost": "blocks evicted from DRAM before the demoter copied them to SSD",
    "ssd_compactions": "SSD segments compacted (live records moved, segment deleted)",
}
_SESSION_STATES = ("standalone", *(str(s) for s in SessionState))


class TierSource(Protocol):
    def reports(self) -> list[TierReport]: ...

    def namespace_bytes(self) -> dict[str, dict[str, int]]: ...


class PresenceSource(Protocol):
    @property
    def state(self) -> NodeState: ...

    @property
    def session(self) -> str: ...


class KVPoolCollector(Collector):
    """Reads the daemon's state at each scrape; every family is present from the first scrape.

    Args:
        node_id: the node's id, exported on ``kvpool_node_info``.
        version: the package version, exported on ``kvpool_node_info``.
        tiers: the block store (anything with ``reports()``).
        counters: the daemon's named counters.
        latencies: data-plane request durations per operation.
        presence: the node's presence (``state`` and ``session``).
    """

    def __init__(
        self,
        node_id: str,
        version: str,
        tiers: TierSource,
        counters: Counters,
        latencies: Latencies,
        presence: PresenceSource,
    ) -> None:
        self._info = {"node_id": node_id, "version": version}
        self._tiers = tiers
        self._counters = counters
        self._latencies = latencies
        self._presence = presence

    def collect(self) -> Iterator[Metric]:
        values = self._counters.snapshot()
        yield from self._node_families()
        yield from self._tier_families(self._tiers.reports(), values)
        yield from self._data_families(values)
        yield self._latency_family()
        yield from self._other_counters(values)

    def _node_families(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("kvpool_node_info", "this daemon: node id and version", labels=list(self._info))
        info.add_metric(list(self._info.values()), 1)
        yield info
        current = str(self._presence.state)
        state = GaugeMetricFamily("kvpool_node_state", "1 for the node's current state", labels=["state"])
        for name in NodeState:
            state.add_metric([str(name)], int(str(name) == current))
        yield state
        session = self._presence.session
        sessions = GaugeMetricFamily("kvpool_etcd_session", "1 for the etcd registration's current state", labels=["session"])
        for name in _SESSION_STATES:
            sessions.add_metric([name], int(name == session))
        yield sessions
        registered = int(session == SessionState.REGISTERED)
        yield GaugeMetricFamily("kvpool_etcd_registered", "1 while registered in etcd under a live lease", value=registered)

    def _tier_families(self, reports: list[TierReport], values: dict[str, int]) -> Iterator[Metric]:
        gauges = (
            ("kvpool_tier_capacity_bytes", "bytes the tier can hold", "capacity_bytes"),
            ("kvpool_tier_used_bytes", "bytes in use (DRAM: allocated slots; SSD: segment files)", "used_bytes"),
            ("kvpool_tier_blocks", "blocks stored", "blocks"),
        )
        for name, help_text, field in gauges:
            family = GaugeMetricFamily(name, help_text, labels=["tier"])
            for report in reports:
                family.add_metric([report.name], getattr(report.usage, field))
            yield family
        per_namespace = GaugeMetricFamily("kvpool_namespace_bytes", "bytes one namespace holds in a tier (DRAM: its slots)",
                                          labels=["namespace", "tier"])
        for tier, usage in self._tiers.namespace_bytes().items():
            for namespace, nbytes in sorted(usage.items()):
                per_namespace.add_metric([namespace, tier], nbytes)
        yield per_namespace
        failing = GaugeMetricFamily("kvpool_tier_failing", "1 while the tier refuses writes after an I/O error", labels=["tier"])
        for report in reports:
            failing.add_metric([report.name], int(bool(report.failure)))
        yield failing
        for suffix, help_text in _TIER_COUNTERS.items():
            family = CounterMetricFamily(f"kvpool_tier_{suffix}", help_text, labels=["tier"])
            for report in reports:
                family.add_metric([report.name], getattr(report, suffix))
            yield family
        for suffix, help_text in _TIER_NAMED_COUNTERS.items():
            family = CounterMetricFamily(f"kvpool_tier_{suffix}", help_text, labels=["tier"])
            for report in reports:
                family.add_metric([report.name], values.get(f"{report.name}_{suffix}", 0))
            yield family

    def _data_families(self, values: dict[str, int]) -> Iterator[Metric]:
        data = CounterMetricFamily("kvpool_data_bytes", "block payload bytes moved", labels=["direction", "transport"])
        data.add_metric(["in", "tcp"], values.get("bytes_in", 0))
        data.add_metric(["out", "tcp"], values.get("bytes_out", 0))
        data.add_metric(["out", "shm"], values.get("bytes_out_shm", 0))  # located for same-node readers
        yield data
        requests = CounterMetricFamily("kvpool_requests", "data-plane requests by operation", labels=["op"])
        for op in _OPS:
            requests.add_metric([op], values.get(f"requests_{op}", 0))
        yield requests
        errors = CounterMetricFamily("kvpool_errors", "errors returned, by code (data and control plane)", labels=["code"])
        for name, value in sorted(values.items()):
            if name.startswith("errors_"):
                errors.add_metric([name.removeprefix("errors_")], value)
        yield errors

    def _latency_family(self) -> Metric:
        family = HistogramMetricFamily(
            "kvpool_request_duration_seconds",
            "data-plane request time from its header to the last reply byte sent, by operation",
            labels=["op"],
        )
        bounds = [*(repr(b) for b in self._latencies.bounds), "+Inf"]
        histograms = self._latencies.snapshot()
        for op in _OPS:
            histogram = histograms.get(op)
            cumulative = histogram.cumulative() if histogram else [0] * len(bounds)
            total = histogram.total if histogram else 0.0
            family.add_metric([op], list(zip(bounds, cumulative)), total)
        return family

    def _other_counters(self, values: dict[str, int]) -> Iterator[Metric]:
        for name, help_text in _PLAIN_COUNTERS.items():
            yield CounterMetricFamily(f"kvpool_{name}", help_text, value=values.get(name, 0))


def build_registry(collector: Collector) -> CollectorRegistry:
    """A private registry holding only ``collector`` (no process or platform collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


class MetricsServer:
    """``/metrics`` over HTTP on a daemon thread; each scrape runs on its own thread.

    Args:
        host: address to bind (the daemon's listen host).
        port: port to bind; 0 for an ephemeral one.
        registry: what to serve.
    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self._thread.name = "kvpool-metrics"

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def stop(self, timeout: float) -> None:
        """Stop serving and close the socket; waits at most ``timeout`` for the thread.

        ``shutdown`` returns within the server's poll interval (0.5 s); it runs on a
        helper thread so that a stuck server cannot hold the caller past ``timeout``.
        """
        deadline = time.monotonic() + timeout
        stopper = threading.Thread(target=self._server.shutdown, name="kvpool-metrics-stop", daemon=True)
        stopper.start()
        stopper.join(timeout)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._server.server_close()
