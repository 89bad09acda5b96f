"""Token authentication of gRPC calls: a server interceptor.

Every call must carry the cluster's token (see :mod:`kvpool_client.core.auth`), except
the standard health service: Kubernetes probes cannot hold a secret, and health
reveals nothing about the blocks.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

import grpc
from google.protobuf.message import Message

from kvpool_client.core.auth import token_in
from kvpool_client.core.control import ERROR_CODE_METADATA, Req, Resp
from kvpool_client.core.errors import ErrorCode
from kvpool_server.stats import Counters

_OPEN_SERVICES = ("/grpc.health.v1.Health/",)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without the token with ``UNAUTHENTICATED``."""

    def __init__(self, token: bytes, counters: Counters) -> None:
        self._token = token
        self._counters = counters

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Req, Resp] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Req, Resp] | None:
        method = handler_call_details.method
        presented = token_in(handler_call_details.invocation_metadata)
        if method.startswith(_OPEN_SERVICES) or (presented is not None and hmac.compare_digest(presented, self._token)):
            return await continuation(handler_call_details)
        self._counters.add("errors_unauthenticated")
        return grpc.unary_unary_rpc_method_handler(_refuse)


async def _refuse(request: Message, context: grpc.aio.ServicerContext[Message, Message]) -> None:
    context.set_trailing_metadata(((ERROR_CODE_METADATA, str(int(ErrorCode.UNAUTHENTICATED))),))
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED, "this node requires the cluster's token (authorization: Bearer ...)"
    )
