"""The cluster as kvpoolctl sees it in etcd: a blocking session over ``EtcdStore``.

A command opens one :class:`ClusterSession` (one event loop, one channel), makes its
reads and writes through it, and closes it. etcd failures become :class:`CliError`
here, so commands never see the membership layer's exceptions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kvpool_client.admin.exits import CliError, ExitCode, etcd_unreachable
from kvpool_client.core.auth import TlsFiles
from kvpool_client.core.membership.cluster import NodeListing, list_nodes, read_config, update_config
from kvpool_client.core.membership.errors import EtcdError, EtcdUnavailable, RecordError
from kvpool_client.core.membership.records import ClusterConfig, NodeRecord, NodeState

if TYPE_CHECKING:  # etcd's client comes with the etcd extra: commands without --etcd run without it
    from kvpool_client.core.membership.etcd import EtcdStore

T = TypeVar("T")

# etcd answers in milliseconds on a healthy cluster; a longer wait only delays the error.
_MAX_ETCD_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Target:
    """A node a command acts on: its control address and, if known, its etcd record."""

    address: str
    record: NodeRecord | None = None

    @property
    def label(self) -> str:
        """``node-1 (127.0.0.1:50051)``, or just the address when the id is unknown."""
        return self.address if self.record is None else f"{self.record.node_id} ({self.address})"


class ClusterSession:
    """Blocking access to one cluster in etcd, for the life of one command.

    Args:
        endpoints: etcd ``host:port[,...]``.
        cluster: the cluster name.
        timeout_s: bound on each etcd call.
        tls: TLS to etcd (None: plaintext, or system roots for https:// endpoints).
    Raises:
        CliError: USAGE if etcd's client is not installed; on enter, UNREACHABLE if etcd does not answer.
    """

    def __init__(self, endpoints: str, cluster: str, timeout_s: float, tls: TlsFiles | None = None) -> None:
        try:
            from kvpool_client.core.membership.etcd import EtcdStore
        except ImportError as exc:
            raise CliError(
                ExitCode.USAGE, f"--etcd needs kvpool's etcd extra (pip install './kvpool[etcd]'): {exc}"
            ) from None
        self.endpoints = endpoints
        self.cluster = cluster
        self.store: EtcdStore = EtcdStore(endpoints, request_timeout_s=min(timeout_s, _MAX_ETCD_TIMEOUT_S), tls=tls)
        self._runner = asyncio.Runner()

    def __enter__(self) -> ClusterSession:
        try:
            self.run(self.store.connect(check=True))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._runner.run(self.store.close())
        self._runner.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the session's loop; etcd failures become :class:`CliError`.

        Raises:
            CliError: UNREACHABLE (etcd down), ERROR (a malformed record, or etcd refused).
        """
        with self._translated():
            return self._runner.run(coro)

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except EtcdUnavailable:
            raise etcd_unreachable(self.endpoints) from None
        except RecordError as exc:
            raise CliError(ExitCode.ERROR, f"cluster {self.cluster!r}: {exc} (fix or delete it with etcdctl)") from None
        except EtcdError as exc:
            raise CliError(ExitCode.ERROR, f"etcd at {self.endpoints}: {exc}") from None

    def nodes(self) -> NodeListing:
        """Every node record of the cluster (and any malformed keys)."""
        return self.run(list_nodes(self.store, self.cluster))

    def config(self) -> ClusterConfig | None:
        """The cluster config, or None if none was written yet."""
        return self.run(read_config(self.store, self.cluster))

    def update_config(self, change: Callable[[ClusterConfig | None], ClusterConfig]) -> ClusterConfig:
        """Compare-and-swap the config; ``change`` may raise :class:`CliError` to refuse."""
        return self.run(update_config(self.store, self.cluster, change))

    def resolve(self, node: str) -> Target:
        """The node ``node`` names: a node id of this cluster, or a control address.

        Raises:
            CliError: NOT_FOUND if ``node`` is not an address and no record has that id.
        """
        listing = self.nodes()
        if ":" in node:  # node ids cannot hold ':'
            return Target(node, next((r for r in listing.nodes.values() if r.address == node), None))
        record = listing.nodes.get(node)
        if record is None:
            known = ", ".join(sorted(listing.nodes)) or "none registered"
            raise CliError(
                ExitCode.NOT_FOUND,
                f"no node {node!r} in cluster {self.cluster!r} (known: {known}): run `kvpoolctl status`",
            )
        return Target(record.address, record)

    def record(self, node_id: str) -> NodeRecord | None:
        """The node's current record, or None if it left."""
        return self.nodes().nodes.get(node_id)

    def others_active(self, node_id: str) -> list[NodeRecord]:
        """Active nodes other than ``node_id``: where its blocks would go."""
        return [r for r in self.nodes().nodes.values() if r.state is NodeState.ACTIVE and r.node_id != node_id]


def open_session(args: argparse.Namespace, command: str) -> ClusterSession:
    """The session for ``args.etcd`` and ``args.cluster``; enter it to connect.

    Raises:
        CliError: USAGE if no etcd endpoints were given.
    """
    if not args.etcd:
        raise CliError(ExitCode.USAGE, f"{command} reads the cluster from etcd: set --etcd or KVPOOL_ETCD_ENDPOINTS")
    return ClusterSession(args.etcd, args.cluster, args.timeout, args.etcd_tls)
