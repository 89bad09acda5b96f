"""The credentials file: each tenant's token, namespaces, rights and quotas.

One YAML file (a Kubernetes Secret mounted read-only, say) names every tenant::

    tenants:
      team-a:
        token_sha256: 9f2f...          # the token's SHA-256 in hex; or `token: <the token itself>`
        namespaces: ["team-a.*@*"]     # glob patterns over namespace ids (model@dtype@layout@tpRofS)
        rights: [read, write, delete]  # read, write, delete (deletes, flushes), admin (drain, stats, tenants)
        quotas: {dram: 8GiB, ssd: 100GiB, connections: 64, rate: 200MiB}  # per node; absent or 0: no limit

A token is known by its SHA-256, so the file need not hold tokens at all. Finding a presented
token's tenant is a lookup by that digest: its time depends on the digest of what was
presented, which tells a guesser nothing about any tenant's token. The cluster's own token
(``token_file``) stays a tenant, :data:`CLUSTER`, with every right over every namespace.

Anything the parser does not understand is refused with the path of the offending value
(``tenants.team-a.rights[1]``); a file that is refused changes nothing that was loaded.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvpool_client.core.auth import MIN_TOKEN_BYTES
from kvpool_client.core.settings.values import ConfigError, did_you_mean, parse_byte_size
from kvpool_client.core.wire.frames import MAX_TOKEN_BYTES

CLUSTER = "cluster"  # the tenant of the cluster's own token
MAX_TENANTS = 256  # tenants label metrics: their number stays small
MAX_FILE_BYTES = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_TENANT_KEYS = ("token", "token_sha256", "namespaces", "rights", "quotas")
_QUOTA_KEYS = ("dram", "ssd", "connections", "rate")


class CredentialsError(ConfigError):
    """The credentials file cannot be read or says something this parser does not accept."""


class Right(enum.Enum):
    READ = "read"  # get, exists, locate, lookups
    WRITE = "write"  # put, reserve and commit
    DELETE = "delete"  # delete, flush
    ADMIN = "admin"  # drain and node state, node-wide stats, the tenants' listing


_ALL_RIGHTS = frozenset(Right)


@dataclass(frozen=True, slots=True)
class Quotas:
    """Most a tenant may hold; 0: no limit."""

    dram: int = 0
    ssd: int = 0
    connections: int = 0
    rate: int = 0  # bytes per second over the data plane (sent and received), per node


@dataclass(frozen=True)
class Tenant:
    """One tenant: the namespaces it may use (glob patterns over namespace ids) and its rights there."""

    name: str
    namespaces: tuple[str, ...]
    rights: frozenset[Right]
    quotas: Quotas = Quotas()
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pattern = "|".join(f"(?:{fnmatch.translate(p)})" for p in self.namespaces)
        object.__setattr__(self, "_pattern", re.compile(pattern))

    def covers(self, namespace: str) -> bool:
        """Whether ``namespace`` is one of this tenant's."""
        return self._pattern.match(namespace) is not None

    def may(self, right: Right, namespace: str) -> bool:
        """Whether this tenant holds ``right`` over ``namespace``."""
        return right in self.rights and self.covers(namespace)

    @property
    def everything(self) -> bool:
        """Every right over every namespace (the cluster's token): nothing to check."""
        return self.rights == _ALL_RIGHTS and "*" in self.namespaces


@dataclass(frozen=True)
class Credentials:
    """Every tenant, found by its token."""

    by_digest: Mapping[bytes, Tenant]

    def tenant_of(self, token: bytes) -> Tenant | None:
        """The tenant ``token`` belongs to; None: no tenant's."""
        return self.by_digest.get(digest(token))

    @property
    def tenants(self) -> list[Tenant]:
        return sorted(self.by_digest.values(), key=lambda t: t.name)


def digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def cluster_tenant() -> Tenant:
    """The cluster token's tenant: every right over every namespace."""
    return Tenant(CLUSTER, ("*",), frozenset(Right))


def load_credentials(path: str | Path, cluster_token: bytes | None = None) -> Credentials:
    """The tenants in the file at ``path``, and the cluster's token as :data:`CLUSTER` when given.

    Raises:
        CredentialsError: the file cannot be read, is too large, or does not parse.
    """
    return decode_credentials(read_file(path), cluster_token, str(path))


def read_file(path: str | Path) -> bytes:
    """The file's bytes; one more than :data:`MAX_FILE_BYTES` tells it is too large.

    Raises:
        CredentialsError: it cannot be read.
    """
    try:
        with open(path, "rb") as file:
            return file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise CredentialsError(f"cannot read the credentials file {path}: {exc.strerror}") from None


def decode_credentials(raw: bytes, cluster_token: bytes | None, source: str) -> Credentials:
    """:func:`parse_credentials` of a file's bytes.

    Raises:
        CredentialsError: they are too many, not UTF-8, or do not parse.
    """
    if len(raw) > MAX_FILE_BYTES:
        raise CredentialsError(f"the credentials file {source} is over {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CredentialsError(f"the credentials file {source} is not UTF-8 (at byte {exc.start})") from None
    return parse_credentials(text, cluster_token, source)


def parse_credentials(text: str, cluster_token: bytes | None = None, source: str = "credentials") -> Credentials:
    """The tenants ``text`` (the file's YAML) names, and the cluster's token as :data:`CLUSTER` when given.

    Raises:
        CredentialsError: ``text`` is not YAML, or a value is missing, unknown or malformed.
    """
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CredentialsError(f"{source}: not YAML: {_first_line(exc)}") from None
    except RecursionError:
        raise CredentialsError(f"{source}: nested too deeply") from None
    except Exception as exc:  # PyYAML's constructors raise what they hit on a tagged or dated scalar (fuzzed)
        raise CredentialsError(f"{source}: not YAML: {type(exc).__name__}: {exc}") from None
    top = _mapping(document, source, ("tenants",))
    specs = _mapping(top.get("tenants", {}), f"{source}: tenants")
    if len(specs) > MAX_TENANTS:
        raise CredentialsError(f"{source}: tenants: {len(specs)} tenants, at most {MAX_TENANTS}")
    by_digest: dict[bytes, Tenant] = {}
    if cluster_token is not None:
        by_digest[digest(cluster_token)] = cluster_tenant()
    for name, spec in specs.items():
        where = f"{source}: tenants.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name == CLUSTER:
            raise CredentialsError(
                f"{source}: tenants: {name!r} is not a tenant name (1..63 of A-Z a-z 0-9 _ . -, "
                f"starting with a letter or digit; {CLUSTER!r} is the cluster token's)"
            )
        key, tenant = _tenant(name, _mapping(spec, where, _TENANT_KEYS), where)
        other = by_digest.get(key)
        if other is not None:
            raise CredentialsError(f"{where}: the same token as {other.name}")
        by_digest[key] = tenant
    return Credentials(by_digest)


def _tenant(name: str, spec: Mapping[str, Any], where: str) -> tuple[bytes, Tenant]:
    """A tenant's token digest and the tenant, from its entry."""
    if ("token" in spec) == ("token_sha256" in spec):
        raise CredentialsError(f"{where}: give exactly one of token and token_sha256")
    key = _token_digest(spec["token"], f"{where}.token") if "token" in spec else None
    if key is None:
        value = spec["token_sha256"]
        if not isinstance(value, str) or not _SHA256_HEX.fullmatch(value):
            raise CredentialsError(f"{where}.token_sha256: not 64 lowercase hex digits")
        key = bytes.fromhex(value)
    namespaces = tuple(_strings(spec.get("namespaces"), f"{where}.namespaces"))
    for i, pattern in enumerate(namespaces):
        if not pattern or not pattern.isprintable() or any(c.isspace() for c in pattern):
            raise CredentialsError(f"{where}.namespaces[{i}]: a pattern is printable, without spaces: {pattern!r}")
    rights = set()
    for i, word in enumerate(_strings(spec.get("rights"), f"{where}.rights")):
        try:
            rights.add(Right(word))
        except ValueError:
            known = [r.value for r in Right]
            raise CredentialsError(
                f"{where}.rights[{i}]: {word!r} is not a right ({', '.join(known)}){did_you_mean(word, known)}"
            ) from None
    quotas = _quotas(_mapping(spec.get("quotas", {}), f"{where}.quotas", _QUOTA_KEYS), f"{where}.quotas")
    return key, Tenant(name, namespaces, frozenset(rights), quotas)


def _token_digest(value: object, where: str) -> bytes:
    if not isinstance(value, str):
        raise CredentialsError(f"{where}: a token is a string")
    token = value.encode("utf-8", "replace")
    if not MIN_TOKEN_BYTES <= len(token) <= MAX_TOKEN_BYTES or not all(32 < b < 127 for b in token):
        raise CredentialsError(
            f"{where}: a token is {MIN_TOKEN_BYTES}..{MAX_TOKEN_BYTES} printable ASCII characters without spaces"
        )
    return digest(token)


def _quotas(spec: Mapping[str, Any], where: str) -> Quotas:
    sizes = {}
    for key in ("dram", "ssd", "rate"):
        value = spec.get(key, 0)
        try:
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError("not a byte size (examples: 4096, 512MiB, 1GiB)")
            sizes[key] = parse_byte_size(value)
        except ValueError as exc:
            raise CredentialsError(f"{where}.{key}: {exc}") from None
    connections = spec.get("connections", 0)
    if isinstance(connections, bool) or not isinstance(connections, int) or connections < 0:
        raise CredentialsError(f"{where}.connections: a whole number >= 0")
    return Quotas(sizes["dram"], sizes["ssd"], connections, sizes["rate"])


def _mapping(value: object, where: str, keys: Iterable[str] | None = None) -> Mapping[Any, Any]:
    """``value`` as a mapping (None: empty), whose keys are all among ``keys`` when given."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CredentialsError(f"{where}: expected a mapping, got {type(value).__name__}")
    if keys is not None:
        known = list(keys)
        for key in value:
            if key not in known:
                hint = did_you_mean(key, known) if isinstance(key, str) else ""
                raise CredentialsError(f"{where}: unknown key {key!r}{hint}")
    return value


def _strings(value: object, where: str) -> list[str]:
    """``value`` as a non-empty list of strings."""
    if not isinstance(value, list) or not value:
        raise CredentialsError(f"{where}: expected a non-empty list")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise CredentialsError(f"{where}[{i}]: expected a string, got {type(item).__name__}")
    return value


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
