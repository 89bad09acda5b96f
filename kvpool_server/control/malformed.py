"""Malformed request bodies get INVALID_ARGUMENT with a kvpool code, not grpc's bare UNKNOWN.

grpc parses a request before any handler runs, and a body that is not the method's
protobuf message makes it answer UNKNOWN with no detail a caller can act on. This
interceptor wraps each unary method's parser so that a parse failure becomes a
marker, and the wrapped handler turns the marker into INVALID_ARGUMENT carrying
``ErrorCode.PROTOCOL`` in the trailing metadata, like every other rejected call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from kvpool_client.core.control import ERROR_CODE_METADATA, Req, Resp
from kvpool_client.core.errors import ErrorCode
from kvpool_server.stats import Counters

Deserializer = Callable[[bytes], Any]  # the method's message, or a MalformedBody once wrapped
UnaryBehavior = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class MalformedBody:
    """Stands in for a request whose bytes did not parse."""

    reason: str


class MalformedBodyInterceptor(grpc.aio.ServerInterceptor):
    """Answers unparsable unary requests with INVALID_ARGUMENT and ``ErrorCode.PROTOCOL``."""

    def __init__(self, counters: Counters) -> None:
        self._counters = counters

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Req, Resp] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Req, Resp] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler  # streams and unknown methods keep grpc's own answers
        # types-grpcio types unary_unary for the sync server; under grpc.aio it is a coroutine function.
        behavior: UnaryBehavior = handler.unary_unary  # type: ignore[assignment]
        return grpc.unary_unary_rpc_method_handler(
            self._guarded(behavior, handler_call_details.method),
            request_deserializer=_tolerant(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )

    def _guarded(self, behavior: UnaryBehavior, method: str) -> UnaryBehavior:
        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, MalformedBody):
                self._counters.add("errors_malformed_request")
                context.set_trailing_metadata(((ERROR_CODE_METADATA, str(int(ErrorCode.PROTOCOL))),))
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{method}: the request body does not parse: {request.reason}"
                )
            return await behavior(request, context)

        return guarded


def _tolerant(deserialize: Deserializer) -> Deserializer:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return MalformedBody(str(exc) or "not a protobuf message")

    return parse
