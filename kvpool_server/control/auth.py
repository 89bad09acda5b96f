"""Token authentication of gRPC calls: a server interceptor.

Every call must carry a token the node knows (the cluster's, or a tenant's: see
:mod:`kvpool_server.tenants.access`), except the standard health service: Kubernetes probes
cannot hold a secret, and health reveals nothing about the blocks. A tenant's calls then go
through its rights (:mod:`kvpool_server.tenants.calls`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import grpc
from google.protobuf.message import Message

from kvpool_client.core.auth import token_in
from kvpool_client.core.control import ERROR_CODE_METADATA, Req, Resp
from kvpool_client.core.errors import ErrorCode
from kvpool_server.stats import Counters
from kvpool_server.tenants.access import Access
from kvpool_server.tenants.calls import Behaviour, Forbidden, guarded

_OPEN_SERVICES = ("/grpc.health.v1.Health/",)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without a known token with ``UNAUTHENTICATED``; holds a tenant to its rights."""

    def __init__(self, access: Access, counters: Counters) -> None:
        self._access = access
        self._counters = counters

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Req, Resp] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Req, Resp] | None:
        method = handler_call_details.method
        if method.startswith(_OPEN_SERVICES):
            return await continuation(handler_call_details)
        presented = token_in(handler_call_details.invocation_metadata)
        tenant = None if presented is None else self._access.tenant_of(presented)
        if tenant is None:
            self._counters.add("errors_unauthenticated")
            return grpc.unary_unary_rpc_method_handler(_refuse)
        handler = await continuation(handler_call_details)
        if handler is None or tenant.everything or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            _denying(guarded(tenant, method, cast("Behaviour", handler.unary_unary))),  # aio: a coroutine
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _denying(call: Behaviour) -> Behaviour:
    """``call``, answering ``PERMISSION_DENIED`` where its tenant may not make it."""

    async def behaviour(request: Any, context: Any) -> Message:
        try:
            return await call(request, context)
        except Forbidden as exc:
            context.set_trailing_metadata(((ERROR_CODE_METADATA, str(int(ErrorCode.PERMISSION_DENIED))),))
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            raise  # abort raised already

    return behaviour


async def _refuse(request: Message, context: grpc.aio.ServicerContext[Message, Message]) -> None:
    context.set_trailing_metadata(((ERROR_CODE_METADATA, str(int(ErrorCode.UNAUTHENTICATED))),))
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED, "this node requires a token it knows (authorization: Bearer ...)"
    )
