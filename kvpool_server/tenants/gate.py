"""A tenant's data-plane requests, screened: reads of other namespaces find nothing, writes are refused.

A read (GET, EXISTS, LOCATE) of a namespace the tenant may not read is served as a read of
:data:`UNSEEN`, a namespace no request can name (a namespace id is printable): it runs the
code an absent key runs and answers what an absent key answers, so a tenant cannot tell
another's hit from a miss, by the answer or by its time. A delete without the right is refused
``PERMISSION_DENIED`` key by key, as are a put's blocks (:func:`write_refusal`: the session
still receives and drops their bytes). PEER and RESERVE are refused whole to every tenant but
one with every right over every namespace: the one-sided plane reaches the whole arena.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool_client.core.errors import ErrorCode, PermissionDenied
from kvpool_client.core.wire import (
    DeleteRequest,
    ExistsRequest,
    GetRequest,
    LocateRequest,
    PeerRequest,
    ReserveRequest,
)
from kvpool_client.core.wire.connection import Event, GetOne
from kvpool_server.tenants.credentials import Right, Tenant

UNSEEN = "\x00"  # the namespace another tenant's reads look in: nothing is ever stored there
_DENIED = int(ErrorCode.PERMISSION_DENIED)


@dataclass(frozen=True, slots=True)
class Denied:
    """A request refused before it is served: one status per key, or an error for the whole request."""

    request: DeleteRequest | PeerRequest | ReserveRequest
    statuses: list[int] | None = None
    error: PermissionDenied | None = None


def screened(tenant: Tenant, event: Event) -> Event | Denied:
    """``event`` as ``tenant`` may have it served (its reads of other namespaces made reads of
    :data:`UNSEEN`), or why it is not served."""
    if isinstance(event, GetOne):
        return event if tenant.may(Right.READ, event.namespace) else event._replace(namespace=UNSEEN)
    match event:
        case GetRequest() | ExistsRequest() | LocateRequest():
            if not tenant.may(Right.READ, event.namespace):
                event.namespace = UNSEEN  # the request is this session's own, decoded for it
        case DeleteRequest():
            if not tenant.may(Right.DELETE, event.namespace):
                return Denied(event, statuses=[_DENIED] * len(event.hashes))
        case PeerRequest() | ReserveRequest():
            why = f"tenant {tenant.name}: the one-sided plane reaches every namespace"
            return Denied(event, error=PermissionDenied(why))
    return event


def write_refusal(tenant: Tenant | None, namespace: str) -> ErrorCode | None:
    """Why ``tenant`` may not write into ``namespace``; None: it may (or no tenant is checked)."""
    if tenant is None or tenant.may(Right.WRITE, namespace):
        return None
    return ErrorCode.PERMISSION_DENIED
