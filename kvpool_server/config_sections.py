"""The daemon's settings, section by section; each section checks its own rules.

The flat keys (``dram_capacity``, ``ssd_dir``, ...) are what users write in YAML, as
``KVPOOL_*`` variables and as flags; see :mod:`kvpool_client.core.settings.schema` for how a
field's key is made. Rules that span sections are :meth:`ServerConfig.check`'s.

A section holds values and checks them; it builds no component: the daemon wires its
components in one place each (:mod:`kvpool_server.app`, the tiers in
:mod:`kvpool_server.tiers.node`). Loading and checking a config needs neither numpy, grpc,
etcd nor ucxx.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from kvpool_client.core.auth import TlsFiles, read_token
from kvpool_client.core.membership.records import MAX_REPLICAS
from kvpool_client.core.settings import GiB, MiB, SectionReport, setting

PAGE_SIZE = 4096
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
_PORT = "must be a port number in 0..65535 (0: ephemeral)"


def _file_exists(report: SectionReport, holder: object, *names: str) -> None:
    for name in names:
        path = getattr(holder, name)
        if path and not os.path.isfile(path):
            report.fail(name, "not an existing file")


@dataclass(frozen=True, slots=True)
class NetSettings:
    """Who the node is, where it listens, and how it stops."""

    node_id: str = setting("", "node id in the cluster; empty: <hostname>-<grpc port>")
    host: str = setting("127.0.0.1", "address both listeners bind")
    advertise_host: str = setting("", "address published to clients; empty: host (hostname if host is a wildcard)")
    grpc_port: int = setting(50051, "gRPC control-plane port (0: ephemeral)")
    data_port: int = setting(50052, "data-plane port (0: ephemeral)")
    metrics_port: int = setting(
        0,
        "Prometheus /metrics HTTP port on host (0: ephemeral, -1: off); Helm sets a fixed one",
        doc="It serves `kvpool_tier_*`, `kvpool_requests_total`, `kvpool_request_duration_seconds`, "
        "`kvpool_data_bytes_total`, `kvpool_errors_total`, `kvpool_node_state`, ... "
        "(see [metrics](operations.md#metrics))",
    )
    announce_file: str = setting("", "if set, the bound ports are written there as JSON once ready")
    shutdown_grace_s: float = setting(10.0, "seconds in-flight requests get to finish at shutdown (SIGTERM, SIGINT)")

    def check(self, report: SectionReport) -> None:
        if not self.host:
            report.fail("host", "must not be empty")
        for name in ("grpc_port", "data_port"):
            if not 0 <= getattr(self, name) <= 65535:
                report.fail(name, _PORT)
        if self.grpc_port == self.data_port != 0:
            report.fail("data_port", f"must differ from {report.describe('grpc_port')}")
        if not -1 <= self.metrics_port <= 65535:
            report.fail("metrics_port", f"{_PORT} or -1 (off)")
        for name in ("grpc_port", "data_port"):
            if self.metrics_port == getattr(self, name) > 0:
                report.fail("metrics_port", f"must differ from {report.describe(name)}")
        if self.shutdown_grace_s <= 0:
            report.fail("shutdown_grace_s", "must be > 0")
        if self.announce_file:
            parent = os.path.dirname(os.path.abspath(self.announce_file))
            if not os.path.isdir(parent):
                report.fail("announce_file", f"its directory {parent} does not exist")

    def effective_node_id(self, bound_grpc_port: int | None = None) -> str:
        """``node_id``, or ``<hostname>-<port>`` if empty; pass the bound port when ``grpc_port`` is 0."""
        if self.node_id:
            return self.node_id
        port = self.grpc_port if bound_grpc_port is None else bound_grpc_port
        return f"{socket.gethostname()}-{port}"

    def effective_advertise_host(self) -> str:
        """``advertise_host``, else ``host``, else (``host`` is a wildcard) this machine's hostname."""
        if self.advertise_host:
            return self.advertise_host
        return socket.gethostname() if self.host in _WILDCARD_HOSTS else self.host


@dataclass(frozen=True, slots=True)
class UcxSection:
    """The UCX data plane (off unless ``ucx_port`` is set)."""

    port: int = setting(
        -1,
        "UCX data-plane port, on every interface (0: ephemeral, -1: off); needs ucxx (kvpool's ucx extra)",
        doc="See [docs/transports.md](transports.md)",
    )
    tls: str = setting(
        "tcp,sm",
        "UCX transports (UCX_TLS): tcp,sm on one node or over Ethernet; rc,sm,self with verbs UCX on InfiniBand/RoCE",
    )
    progress_mode: str = setting(
        "blocking",
        "how the UCX worker is progressed: blocking (epoll; idle costs nothing) or polling (one core busy)",
        choices=("blocking", "polling"),
    )
    net_devices: str = setting("", "UCX_NET_DEVICES, e.g. mlx5_0:1 or eth0; empty: UCX's choice")

    def check(self, report: SectionReport) -> None:
        if not -1 <= self.port <= 65535:
            report.fail("port", f"{_PORT} or -1 (off)")


@dataclass(frozen=True, slots=True)
class NixlSection:
    """The one-sided data plane: clients read and write the arena themselves (NIXL over UCX)."""

    enabled: bool = setting(
        False,
        "register the DRAM arena with a NIXL agent: clients then read and write blocks one-sided; needs "
        "kvpool's nixl extra",
        doc="UCX's settings come from the daemon's environment (``UCX_TLS``, ``UCX_NET_DEVICES``). "
        "See [docs/transports.md](transports.md#nixl-the-one-sided-data-plane)",
    )


@dataclass(frozen=True, slots=True)
class MembershipSection:
    """Registration in etcd, and etcd's TLS."""

    etcd_endpoints: str = setting("", "etcd client URLs, comma separated (http:// or https://); empty: standalone")
    cluster: str = setting("default", "cluster name: the etcd prefix /kvpool/<cluster>/")
    lease_ttl_s: int = setting(10, "etcd lease TTL: a dead node leaves the membership this long after dying")
    node_weight: float = setting(1.0, "placement weight: a node of weight 2 owns twice the keys")
    etcd_ca_file: str = setting("", "PEM CA verifying etcd's certificate; set (or https:// endpoints): etcd over TLS")
    etcd_cert_file: str = setting("", "PEM client certificate for etcd's --client-cert-auth, with etcd_key_file")
    etcd_key_file: str = setting("", "PEM private key of etcd_cert_file")

    def check(self, report: SectionReport) -> None:
        if self.lease_ttl_s < 1:
            report.fail("lease_ttl_s", "must be >= 1")
        if not self.node_weight > 0:
            report.fail("node_weight", "must be > 0")
        if not self.cluster or not self.cluster.replace("-", "").replace("_", "").isalnum():
            report.fail("cluster", "must be non-empty letters, digits, '-' or '_'")
        _file_exists(report, self, "etcd_ca_file", "etcd_cert_file", "etcd_key_file")
        if bool(self.etcd_cert_file) != bool(self.etcd_key_file):
            report.fail("etcd_key_file" if self.etcd_cert_file else "etcd_cert_file",
                        "an etcd client certificate needs both etcd_cert_file and etcd_key_file")  # fmt: skip

    def etcd_tls(self) -> TlsFiles | None:
        """TLS to etcd when a CA or client certificate is configured (https:// endpoints alone use system roots)."""
        if not (self.etcd_ca_file or self.etcd_cert_file):
            return None
        return TlsFiles(self.etcd_ca_file, self.etcd_cert_file, self.etcd_key_file)


@dataclass(frozen=True, slots=True)
class RepairSection:
    """Re-replication after membership changes (see [re-replication](architecture.md))."""

    enabled: bool = setting(
        True,
        "after a membership change, copy blocks held here to owners that lack them (needs etcd)",
        doc="See [re-replication](architecture.md)",
    )
    settle_s: float = setting(2.0, "the active nodes must stay unchanged this long before a repair starts")
    bandwidth: int = setting(128 * MiB, "most bytes per second a repair sends (0: no limit)", unit="bytes")
    replicas: int = setting(0, "copies a repair keeps of each block; 0: the cluster config's replicas")

    def check(self, report: SectionReport) -> None:
        if self.settle_s < 0:
            report.fail("settle_s", "must be >= 0")
        if not 0 <= self.replicas <= MAX_REPLICAS:
            report.fail("replicas", f"must be in 0..{MAX_REPLICAS} (0: the cluster config's)")


@dataclass(frozen=True, slots=True)
class DramSection:
    """The DRAM tier: a shared-memory arena cut into slabs."""

    capacity: int = setting(GiB, "bytes of the DRAM tier arena", unit="bytes", key="dram_capacity")
    prefault_arena: bool = setting(True, "map every arena page at start: slower start, no page faults on puts")
    # 64 MiB holds a 256-token LMCache chunk of an 8B model (32 MiB) with room to spare; the cost
    # (fewer slabs, so fewer block sizes held at once in a small arena) is in docs/configuration.md.
    slab_size: int = setting(
        64 * MiB,
        "allocator slab, also the largest block; multiple of 4096; one block size per slab",
        unit="bytes",
        doc="See [choosing `slab_size`](#choosing-slab_size)",
    )
    shm_dir: str = setting("/dev/shm", "existing directory holding the shared-memory arena")
    namespace_quota: int = setting(
        0,
        "most DRAM bytes one namespace may hold here; past it its own oldest blocks go (0: no quota)",
        unit="bytes",
        doc="`QUOTA_EXCEEDED` if all of them are pinned",
    )
    eviction_policy: str = setting(
        "lru",
        "eviction order: lru, or prefix (a chain's tail before its head, among blocks of similar age)",
        choices=("lru", "prefix"),
    )
    shared_index_entries: int = setting(
        -1,
        "entries of the shared index, where same-node clients find blocks without asking (rounded up to a "
        "power of two; -1: two per 64 KiB of dram_capacity; 0: off)",
        doc="64 bytes an entry in the arena file, 8 in the hit marks file. A lossy cache of locations: a block "
        "left out is read by asking. See [transports.md](transports.md#shm-the-published-index)",
    )

    def check(self, report: SectionReport) -> None:
        if self.shared_index_entries < -1:
            report.fail("shared_index_entries", "must be >= -1 (-1: sized from dram_capacity, 0: off)")
        if self.slab_size < PAGE_SIZE or self.slab_size % PAGE_SIZE:
            report.fail("slab_size", f"must be a positive multiple of {PAGE_SIZE}")
        if self.slab_size > self.capacity:
            report.fail("slab_size", f"must be <= {report.describe('capacity')}")
        if not os.path.isdir(self.shm_dir):
            report.fail("shm_dir", "not an existing directory")

    def index_entries(self) -> int:
        """Entries of the shared index the arena holds, a power of two (0: no index)."""
        from kvpool_server.tiers.shared_index import entries_for

        return entries_for(self.shared_index_entries, self.capacity)

    def arena_extra_bytes(self) -> int:
        """Bytes the arena file holds past the blocks: their generations and the shared index."""
        from kvpool_server.tiers.shared_index import extra_bytes

        return extra_bytes(self.capacity, self.index_entries())


@dataclass(frozen=True, slots=True)
class SsdSection:
    """The SSD tier: segment files under ``ssd_dir`` (off when it is empty)."""

    dir: str = setting("", "directory of the SSD tier's segment files (created if missing); empty: no SSD tier")
    capacity: int = setting(
        64 * GiB,
        "bytes of segment files the SSD tier may use",
        unit="bytes",
        doc="One segment is kept free for compaction",
    )
    segment_size: int = setting(
        256 * MiB,
        "bytes per SSD segment file; at least slab_size + 4KiB",
        unit="bytes",
        doc="Each segment file is a fresh start for the kernel's read-ahead: small segments read markedly "
        "slower (docs/performance.md)",
    )
    fsync: bool = setting(False, "fdatasync each SSD write: blocks survive power loss, not only a crash")
    io_threads: int = setting(4, "threads that read blocks from the SSD tier")
    demote_share: float = setting(0.25, "coldest share of each DRAM size class copied to SSD ahead of eviction")
    write_through: bool = setting(
        False, "acknowledge a put once its blocks are on SSD: they survive a crash; puts go at disk speed"
    )
    promote_on_hit: bool = setting(True, "copy a block served from SSD back into DRAM")
    read_ahead: int = setting(
        32 * MiB,
        "bytes a client reading SSD records front to back is read ahead of, into DRAM "
        "(at most a quarter of dram_capacity; needs ssd_promote_on_hit; 0: off)",
        unit="bytes",
        doc="A long prefix reloaded batch by batch is read ahead while its replies are sent",
    )
    gc_live_ratio: float = setting(0.5, "compact an SSD segment once its live share falls below this")
    flush_on_shutdown: bool = setting(
        True,
        "write DRAM's blocks to SSD at a clean shutdown, so a restart starts warm",
        doc="Within `shutdown_grace_s`",
    )
    namespace_quota: int = setting(
        0, "most SSD bytes one namespace may hold here; past it its own oldest records go (0: no quota)", unit="bytes"
    )

    def check(self, report: SectionReport) -> None:
        if not 1 <= self.io_threads <= 64:
            report.fail("io_threads", "must be in 1..64")
        if not 0 < self.demote_share <= 1:
            report.fail("demote_share", "must be in (0, 1]")
        if self.read_ahead < 0:
            report.fail("read_ahead", "must be >= 0 (0: off)")
        if not 0 < self.gc_live_ratio < 1:
            report.fail("gc_live_ratio", "must be in (0, 1)")
        if self.dir and self.capacity < 4 * self.segment_size:
            report.fail("capacity", f"must be >= 4 x {report.describe('segment_size')}")
        if self.dir and not os.path.isdir(os.path.dirname(os.path.abspath(self.dir))):
            report.fail("dir", "its parent directory does not exist")


@dataclass(frozen=True, slots=True)
class DataSection:
    """The data plane: worker loops, limits announced to clients, admission and timeouts."""

    workers: int = setting(
        0,
        "data-plane event loops, one thread each; 0: one per CPU, at most 8",
        key="data_workers",
        doc="Kernel copies run in parallel",
    )
    max_keys_per_request: int = setting(4096, "most keys in one request (1..65535)")
    max_frame_bytes: int = setting(GiB, "most payload bytes in one data-plane frame", unit="bytes")
    verify_checksum_on_get: bool = setting(False, "verify each block's checksum before sending it")
    max_connections: int = setting(4096, "most data connections at once; past it new ones are closed")
    max_connections_per_peer: int = setting(1024, "most data connections from one peer address")
    max_inflight_put_bytes: int = setting(
        0,
        "most bytes reserved for puts whose payload is still arriving, over every connection; past it a "
        "block is refused OVERLOADED (retryable); 0: a quarter of dram_capacity",
        unit="bytes",
        doc="At least one slab",
    )
    io_timeout_s: float = setting(
        30.0,
        "seconds a peer may stall mid-frame before it is dropped",
        doc="A put's whole payload may take this plus 1 s per MiB, then it is dropped and its reserved slots freed",
    )
    idle_timeout_s: float = setting(
        0.0, "close a data connection idle this long between requests (0: never)", doc="Clients reconnect"
    )

    def check(self, report: SectionReport) -> None:
        if not 0 <= self.workers <= 64:
            report.fail("workers", "must be in 0..64 (0: one per CPU)")
        if not 1 <= self.max_keys_per_request <= 65535:
            report.fail("max_keys_per_request", "must be in 1..65535")
        for name in ("max_connections", "max_connections_per_peer"):
            if getattr(self, name) < 1:
                report.fail(name, "must be >= 1")
        if self.io_timeout_s <= 0:
            report.fail("io_timeout_s", "must be > 0")
        if self.idle_timeout_s < 0:
            report.fail("idle_timeout_s", "must be >= 0 (0: never)")

    def effective_workers(self) -> int:
        """``data_workers``, or one per CPU (at most 8) when 0."""
        return self.workers or min(8, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class TlsSection:
    """TLS of the gRPC port and, optionally, of the TCP data plane."""

    cert_file: str = setting(
        "",
        "PEM certificate chain of the gRPC port; with tls_key_file, gRPC runs over TLS",
        doc="Files are re-read when they change",
    )
    key_file: str = setting("", "PEM private key of tls_cert_file")
    client_ca_file: str = setting("", "PEM CA of client certificates: set, gRPC requires them (mTLS)")
    data: bool = setting(
        False,
        "the TCP data plane requires TLS too (tls_cert_file's certificates): for networks that are not private",
        key="data_tls",
        doc="It costs throughput",
    )

    def check(self, report: SectionReport) -> None:
        _file_exists(report, self, "cert_file", "key_file", "client_ca_file")
        if bool(self.cert_file) != bool(self.key_file):
            report.fail("key_file" if self.cert_file else "cert_file", "TLS needs both tls_cert_file and tls_key_file")
        if self.client_ca_file and not self.cert_file:
            report.fail("client_ca_file", "client certificates need TLS: set tls_cert_file and tls_key_file")
        if self.data and not self.cert_file:
            report.fail("data", "TLS on the data plane needs tls_cert_file and tls_key_file")


@dataclass(frozen=True, slots=True)
class AuthSection:
    """The cluster's shared token, and the tenants'."""

    token_file: str = setting(
        "",
        "file with the cluster's shared token (16..1024 printable bytes): data connections and gRPC calls "
        "must prove it; empty: no authentication",
        doc="See [SECURITY.md](SECURITY.md)",
    )

    tenants_file: str = setting(
        "",
        "file naming tenants: each one's token, namespaces, rights and quotas (read again when it changes); "
        "needs token_file, whose token stays a tenant with every right; empty: the cluster's token only",
        doc="See [SECURITY.md](SECURITY.md#tenants)",
    )

    def check(self, report: SectionReport) -> None:
        _file_exists(report, self, "token_file", "tenants_file")
        if self.tenants_file and not self.token_file:
            report.fail("tenants_file", "needs token_file: nodes prove the cluster's token to each other")

    def token(self) -> bytes | None:
        """The cluster's token; None: no authentication.

        Raises:
            UsageError: the file cannot be read or holds no valid token.
        """
        return read_token(self.token_file) if self.token_file else None


@dataclass(frozen=True, slots=True)
class LogSection:
    """Structured logs on stderr."""

    level: str = setting(
        "info", "log level", choices=("debug", "info", "warning", "error"), doc="Logs are structured, on stderr"
    )
    format: str = setting("json", "log line format", choices=("json", "text"))
