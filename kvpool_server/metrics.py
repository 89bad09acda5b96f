"""Prometheus metrics: a collector over the daemon's counters, tier and presence.

Nothing is recorded twice: at each scrape the collector reads :class:`Counters`,
the tiers' reports (:meth:`BlockStore.reports`) and the node's presence, and turns them
into the families :mod:`kvpool_server.metric_names` declares, every declared counter
included. It lives in a private registry (no global state), served over HTTP by
:class:`MetricsServer` on a background thread so a scrape never touches the
event loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvpool_client.core.membership.records import NodeState
from kvpool_server.membership.registration import SessionState
from kvpool_server.metric_names import FAMILIES, TIMED_OPS, Kind
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tenants.usage import TenantUse
from kvpool_server.tiers.store import TierReport

_SESSION_STATES = ("standalone", *(str(s) for s in SessionState))
_DECLARED = {family.name: family for family in FAMILIES}


def _gauge(name: str, value: float | None = None) -> GaugeMetricFamily:
    """An empty gauge family as the table declares it (or one value, for a gauge without labels)."""
    spec = _DECLARED[name]
    return GaugeMetricFamily(spec.name, spec.help, value=value, labels=list(spec.labels) if spec.labels else None)


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
        tenants: each tenant's use of the node (none without a credentials file).
    """

    def __init__(
        self,
        node_id: str,
        version: str,
        tiers: TierSource,
        counters: Counters,
        latencies: Latencies,
        presence: PresenceSource,
        tenants: Callable[[], list[TenantUse]] = list,
    ) -> None:
        self._info = {"node_id": node_id, "version": version}
        self._tenants = tenants
        self._tiers = tiers
        self._counters = counters
        self._latencies = latencies
        self._presence = presence

    def collect(self) -> Iterator[Metric]:
        reports = self._tiers.reports()
        yield from self._node_families()
        yield from self._tier_families(reports)
        yield from self._tenant_families()
        yield self._latency_family()
        yield from _counter_families(self._counters.snapshot(zeros=True), {report.name for report in reports})

    def _node_families(self) -> Iterator[Metric]:
        info = _gauge("kvpool_node_info")
        info.add_metric(list(self._info.values()), 1)
        yield info
        current = str(self._presence.state)
        state = _gauge("kvpool_node_state")
        for name in NodeState:
            state.add_metric([str(name)], int(str(name) == current))
        yield state
        session = self._presence.session
        sessions = _gauge("kvpool_etcd_session")
        for session_state in _SESSION_STATES:
            sessions.add_metric([session_state], int(session_state == session))
        yield sessions
        yield _gauge("kvpool_etcd_registered", int(session == SessionState.REGISTERED))

    def _tier_families(self, reports: list[TierReport]) -> Iterator[Metric]:
        gauges = (
            ("kvpool_tier_capacity_bytes", "capacity_bytes"),
            ("kvpool_tier_used_bytes", "used_bytes"),
            ("kvpool_tier_blocks", "blocks"),
        )
        for name, field in gauges:
            family = _gauge(name)
            for report in reports:
                family.add_metric([report.name], getattr(report.usage, field))
            yield family
        per_namespace = _gauge("kvpool_namespace_bytes")
        for tier, usage in self._tiers.namespace_bytes().items():
            for namespace, nbytes in sorted(usage.items()):
                per_namespace.add_metric([namespace, tier], nbytes)
        yield per_namespace
        failing = _gauge("kvpool_tier_failing")
        for report in reports:
            failing.add_metric([report.name], int(bool(report.failure)))
        yield failing

    def _tenant_families(self) -> Iterator[Metric]:
        held, quotas, connections = (
            _gauge(name) for name in ("kvpool_tenant_bytes", "kvpool_tenant_quota_bytes", "kvpool_tenant_connections")
        )
        for use in self._tenants():
            name, quota = use.tenant.name, use.tenant.quotas
            for tier, nbytes in use.tier_bytes.items():
                held.add_metric([name, tier], nbytes)
                quotas.add_metric([name, tier], quota.dram if tier == "dram" else quota.ssd)
            if quota.connections:
                connections.add_metric([name], use.connections)
        yield from (held, quotas, connections)

    def _latency_family(self) -> Metric:
        spec = _DECLARED["kvpool_request_duration_seconds"]
        family = HistogramMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        bounds = [*(repr(b) for b in self._latencies.bounds), "+Inf"]
        histograms = self._latencies.snapshot()
        for op in TIMED_OPS:
            histogram = histograms.get(op)
            cumulative = histogram.cumulative() if histogram else [0] * len(bounds)
            total = histogram.total if histogram else 0.0
            family.add_metric([op], list(zip(bounds, cumulative, strict=True)), total)
        return family


def _counter_families(values: dict[str, int], tiers: set[str]) -> Iterator[Metric]:
    """Every declared counter family; a tier's series only where the node has that tier."""
    for spec in FAMILIES:
        if spec.kind is not Kind.COUNTER:
            continue
        family = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        tier_at = spec.labels.index("tier") if "tier" in spec.labels else None
        for key, labels in spec.series.items():
            if tier_at is None or labels[tier_at] in tiers:
                family.add_metric(list(labels), values[key])
        yield family


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
