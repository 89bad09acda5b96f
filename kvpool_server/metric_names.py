"""Every metric the daemon keeps, declared once: :class:`Counters`, GetStats and ``/metrics`` read this table.

A counter lives in :class:`kvpool_server.stats.Counters` under a *key* (``"dram_hits"``,
``"requests_get"``, ``"errors_busy"``); GetStats reports every key, and ``/metrics`` exports
each key as one series of a Prometheus *family*, whose labels tell the keys apart
(``dram_hits`` is ``kvpool_tier_hits_total{tier="dram"}``). Gauges and the latency histogram are
read at scrape time from the tiers and the node's presence: they are declared here for their
name, help text and labels, and keep no key.

Adding a counter means adding its key here; :meth:`Counters.add` refuses a key this table
does not declare, so a typo fails a test instead of starting a series no dashboard reads.
Family names are what dashboards and alerts query: never rename one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.wire.frames import Op

TIERS = ("dram", "ssd")
# Operations timed by the latency histogram (HELLO is counted, not timed).
TIMED_OPS = ("put", "get", "exists", "delete", "ping", "locate", "peer", "reserve", "commit")
# Codes of ``errors_<code>``: every kvpool code but OK, and the control plane's own
# (gRPC statuses it aborts with, and requests it could not parse).
ERROR_CODES = (
    *(code.name.lower() for code in ErrorCode if code is not ErrorCode.OK),
    "failed_precondition",
    "malformed_request",
)


class Kind(enum.StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class Family:
    """One Prometheus metric family.

    ``name`` is the family's name without the ``_total`` a counter's samples get;
    ``series`` maps each counter key to its label values, in the order of ``labels``.
    A gauge or histogram has no series: the collector reads its values from elsewhere.
    """

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    series: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _counter(key: str, help_text: str) -> Family:
    """A counter without labels, exported as ``kvpool_<key>``."""
    return Family(f"kvpool_{key}", Kind.COUNTER, help_text, (), {key: ()})


def _per_tier(suffix: str, help_text: str, tiers: tuple[str, ...] = TIERS) -> Family:
    """A counter kept per tier under ``<tier>_<suffix>``, labelled by tier."""
    return Family(
        f"kvpool_tier_{suffix}", Kind.COUNTER, help_text, ("tier",), {f"{tier}_{suffix}": (tier,) for tier in tiers}
    )


_GAUGES = (
    Family("kvpool_node_info", Kind.GAUGE, "this daemon: node id and version", ("node_id", "version")),
    Family("kvpool_node_state", Kind.GAUGE, "1 for the node's current state", ("state",)),
    Family("kvpool_etcd_session", Kind.GAUGE, "1 for the etcd registration's current state", ("session",)),
    Family("kvpool_etcd_registered", Kind.GAUGE, "1 while registered in etcd under a live lease"),
    Family("kvpool_tier_capacity_bytes", Kind.GAUGE, "bytes the tier can hold", ("tier",)),
    Family("kvpool_tier_used_bytes", Kind.GAUGE, "bytes in use (DRAM: allocated slots; SSD: segment files)", ("tier",)),
    Family("kvpool_tier_blocks", Kind.GAUGE, "blocks stored", ("tier",)),
    Family(
        "kvpool_namespace_bytes",
        Kind.GAUGE,
        "bytes one namespace holds in a tier (DRAM: its slots)",
        ("namespace", "tier"),
    ),
    Family("kvpool_tier_failing", Kind.GAUGE, "1 while the tier refuses writes after an I/O error", ("tier",)),
    Family(
        "kvpool_tenant_bytes",
        Kind.GAUGE,
        "bytes of every namespace a tenant may write, in a tier (DRAM: their slots, as its quota counts)",
        ("tenant", "tier"),
    ),
    Family("kvpool_tenant_quota_bytes", Kind.GAUGE, "a tenant's quota in a tier (0: none)", ("tenant", "tier")),
    Family("kvpool_tenant_connections", Kind.GAUGE, "a capped tenant's data connections now", ("tenant",)),
    Family(
        "kvpool_request_duration_seconds",
        Kind.HISTOGRAM,
        "data-plane request time from its header to the last reply byte sent, by operation",
        ("op",),
    ),
)

_TIER_COUNTERS = (
    _per_tier("hits", "lookups that found the block"),
    _per_tier("misses", "lookups that did not find the block"),
    _per_tier("evictions", "blocks evicted to make room"),
    _per_tier("promotions", "blocks copied up from this tier to the one above"),
    _per_tier("demotions", "blocks copied down into this tier"),
    _per_tier("corrupt_blocks", "blocks dropped after a checksum mismatch"),
    _per_tier("io_errors", "failed reads and writes of the tier's storage"),
    _per_tier("blocks_written", "blocks committed"),
    _per_tier("deletes", "blocks deleted on request"),
    _per_tier("quota_evictions", "blocks evicted to make room within their namespace's quota"),
)

_TRAFFIC_COUNTERS = (
    Family(
        "kvpool_data_bytes",
        Kind.COUNTER,
        "block payload bytes moved",
        ("direction", "transport"),
        # bytes_out_shm: blocks located for same-node readers, who copy them out of the arena;
        # bytes_out_nixl and bytes_in_nixl: blocks located for one-sided readers, and committed after
        # their writers wrote them one-sided (reads of places a client knew already are not seen)
        {
            "bytes_in": ("in", "tcp"),
            "bytes_out": ("out", "tcp"),
            "bytes_out_shm": ("out", "shm"),
            "bytes_out_nixl": ("out", "nixl"),
            "bytes_in_nixl": ("in", "nixl"),
        },
    ),
    Family(
        "kvpool_requests",
        Kind.COUNTER,
        "data-plane requests by operation",
        ("op",),
        {f"requests_{op.name.lower()}": (op.name.lower(),) for op in Op},
    ),
    Family(
        "kvpool_errors",
        Kind.COUNTER,
        "errors returned, by code (data and control plane)",
        ("code",),
        {f"errors_{code}": (code,) for code in ERROR_CODES},
    ),
)

_PLAIN_COUNTERS = (
    _counter("handoff_started", "hand-offs of this node's blocks started (drain with hand-off)"),
    _counter("handoff_finished", "hand-offs finished"),
    _counter("handoff_planned", "block copies hand-offs set out to make"),
    _counter("handoff_copies", "blocks copied to their new owners by hand-offs"),
    _counter("handoff_failures", "blocks a hand-off failed to copy"),
    _counter("repair_runs", "repairs started after a membership change (copies of blocks to owners that lack them)"),
    _counter("repair_cancelled", "repairs cut short by a newer membership change or shutdown"),
    _counter("repair_checked", "(block, owner) pairs repairs asked the owner about"),
    _counter("repair_copies", "blocks repairs copied to owners that lacked them"),
    _counter("repair_failed", "blocks repairs failed to copy (retried later; refusals for at most 3 runs)"),
    _counter(
        "repair_refused",
        "block copies the owners refused (full, namespace quota, block limit), left until the membership changes",
    ),
    _counter("connections_dropped_mid_frame", "data connections closed by the peer or a timeout inside a frame"),
    _counter("connections_closed_idle", "data connections closed after idle_timeout_s without a request"),
    _counter("connections_refused", "data connections refused at an admission limit (in all or per peer)"),
    _counter("puts_overloaded", "puts refused with OVERLOADED at the limit of put bytes in flight"),
    _counter("leases_expired", "one-sided puts whose slots went back unpublished: not committed in time"),
    _counter("puts_duplicate", "blocks put that the node held already (received, then dropped: put-if-absent)"),
    _counter("namespace_flushes", "FlushNamespace calls answered"),
    _counter("dram_evictions_lost", "blocks evicted from DRAM before the demoter copied them to SSD"),
    _counter("ssd_compactions", "SSD segments compacted (live records moved, segment deleted)"),
    _counter("ssd_quota_refusals", "SSD writes refused because the namespace was at its quota with nothing to evict"),
    _counter("ssd_read_ahead", "blocks read ahead from SSD into DRAM"),
    _counter("ssd_read_ahead_hits", "blocks read ahead that a client then read"),
    _counter(
        "shared_index_skipped",
        "blocks left out of the shared index (no free entry in their probe window): same-node reads ask instead",
    ),
    _counter(
        "shared_index_sends",
        "one-key GETs over TCP answered from the shared index by the compiled sender, without the DRAM tier's Python",
    ),
    _counter(
        "shared_index_touches",
        "blocks refreshed in the eviction order because same-node clients read them through the shared index",
    ),
)

FAMILIES: tuple[Family, ...] = (*_GAUGES, *_TIER_COUNTERS, *_TRAFFIC_COUNTERS, *_PLAIN_COUNTERS)


def counter_keys() -> Iterator[str]:
    """Every key :class:`Counters` accepts, in the table's order."""
    for family in FAMILIES:
        yield from family.series


COUNTER_KEYS: tuple[str, ...] = tuple(counter_keys())
