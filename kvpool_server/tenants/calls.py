"""What a tenant may call on the control plane (gRPC), and what it sees of the answers.

The same rules as on the data plane (:mod:`kvpool_server.tenants.gate`): Exists and Lookup of a
namespace the tenant may not read look in :data:`~kvpool_server.tenants.gate.UNSEEN` and find
nothing; Delete needs the delete right over the namespace, FlushNamespace too (and a tenant
without every namespace flushes one namespace at a time, never a whole model); GetStats (node-wide
counters move with other tenants' hits) and SetState need the admin right; ListNamespaces shows
the tenant's own namespaces; GetServerInfo leaves out the shared arena and the one-sided
endpoint, which reach every namespace. A method not named here needs the admin right.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import Message

from kvpool_client.core.proto import kvpool_pb2 as pb
from kvpool_server.tenants.credentials import Right, Tenant
from kvpool_server.tenants.gate import UNSEEN

_SERVICE = "/kvpool.v1.KVPool/"
_WHOLE_ARENA = ("shm", "nixl")  # endpoints that reach every namespace


class Forbidden(Exception):
    """The tenant may not make this call (answered ``PERMISSION_DENIED``)."""


Behaviour = Callable[[Any, Any], Awaitable[Message]]


def guarded(tenant: Tenant, method: str, call: Behaviour) -> Behaviour:
    """``call`` (a unary method's behaviour) as ``tenant`` may make it."""
    name = method.removeprefix(_SERVICE) if method.startswith(_SERVICE) else ""

    async def behaviour(request: Any, context: Any) -> Message:
        _admit(tenant, name, request)
        return _shown(tenant, name, await call(request, context))

    return behaviour


def _admit(tenant: Tenant, name: str, request: Any) -> None:
    """Raise :class:`Forbidden` unless ``tenant`` may make the call; a read of another namespace
    is turned into a read of nothing."""
    match name:
        case "GetServerInfo" | "ListNamespaces":
            return
        case "Exists" | "Lookup":
            if not tenant.may(Right.READ, request.namespace):
                request.namespace = UNSEEN
        case "Delete":
            _require(tenant, Right.DELETE, request.namespace)
        case "FlushNamespace":
            if request.model and not tenant.everything:
                raise Forbidden(f"tenant {tenant.name} flushes one namespace at a time, not a whole model")
            if request.namespace:
                _require(tenant, Right.DELETE, request.namespace)
        case _:  # GetStats, SetState, and any method added later
            if Right.ADMIN not in tenant.rights:
                raise Forbidden(f"tenant {tenant.name} has no admin right ({name or 'this method'})")


def _require(tenant: Tenant, right: Right, namespace: str) -> None:
    if not tenant.may(right, namespace):
        raise Forbidden(f"tenant {tenant.name} may not {right.value} in {namespace!r}")


def _shown(tenant: Tenant, name: str, response: Message) -> Message:
    """What ``tenant`` sees of ``response``."""
    if name == "GetServerInfo" and not tenant.everything:
        assert isinstance(response, pb.ServerInfo)
        endpoints = [e for e in response.endpoints if e.transport not in _WHOLE_ARENA]
        del response.endpoints[:]
        response.endpoints.extend(endpoints)
        response.ClearField("shared_arena")
    elif name == "ListNamespaces":
        assert isinstance(response, pb.NamespaceList)
        rows = [row for row in response.namespaces if tenant.covers(row.namespace)]
        del response.namespaces[:]
        response.namespaces.extend(rows)
    return response
