"""etcd endpoints as users write them, and the gRPC target they become.

Pure functions, apart from :mod:`~kvpool_client.core.membership.etcd` so that tools which only
parse endpoints (kvpoolctl's arguments) do not need the etcd client library.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence


def _split(endpoints: Sequence[str] | str) -> list[str]:
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    return [e.strip() for e in items if e.strip()]


def _host_port(endpoint: str) -> str:
    text = endpoint.removeprefix("https://").removeprefix("http://").rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"etcd endpoint {endpoint!r}: expected host:port, http://host:port or https://host:port")
    return f"127.0.0.1:{port}" if host == "localhost" else text


def _ip_version(host_port: str) -> int | None:
    host = host_port.rpartition(":")[0].strip("[]")
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


def channel_target(endpoints: Sequence[str] | str) -> str:
    """The gRPC target for ``endpoints`` (a list, or one comma-separated string).

    IP literals of one family become a round-robin ``ipv4:``/``ipv6:`` list; a single
    host name becomes ``dns:///host:port`` (a Kubernetes Service, re-resolved by gRPC).

    Raises:
        ValueError: empty, malformed, or several host names (use one name or IPs).
    """
    hosts = [_host_port(e) for e in _split(endpoints)]
    if not hosts:
        raise ValueError("no etcd endpoints given")
    versions = {_ip_version(h) for h in hosts}
    if versions == {4}:
        return "ipv4:" + ",".join(hosts)
    if versions == {6}:
        return "ipv6:" + ",".join(hosts)
    if len(hosts) == 1:
        return f"dns:///{hosts[0]}"
    raise ValueError(f"etcd endpoints {hosts}: give one DNS name or IP addresses of one family")


def uses_tls(endpoints: Sequence[str] | str) -> bool:
    """Whether the endpoints are ``https://`` ones (all or none of them).

    Raises:
        ValueError: a mix of ``https://`` and plaintext endpoints.
    """
    secure = {e.startswith("https://") for e in _split(endpoints)}
    if len(secure) > 1:
        raise ValueError("etcd endpoints mix https:// and plaintext: use one scheme for all members")
    return secure == {True}
