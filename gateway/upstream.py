"""Gateway-only mode: the ``Service`` the HTTP gateway calls is an upstream ACP server.

``TransportService`` turns the seam's ``CallContext`` back into the ``CallOptions`` of a
client ``Transport`` (the CLI hands in a gRPC one): the caller's token, ticket, version and
request id travel upstream, which does every check. The gateway itself never imports a
client: whoever assembles it chooses the transport.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from google.protobuf import message

from cleveragents.acp.contract.call import CallContext, Reply
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.transport import CallOptions, Transport


def options_of(ctx: CallContext) -> CallOptions:
    """The upstream's answer fills ``ctx.reply`` (a replay travels back to the HTTP caller)."""
    if ctx.reply is None:
        ctx.reply = Reply()
    return CallOptions(
        acp_version=ctx.acp_version,
        token=ctx.token,
        request_id=ctx.request_id,
        ticket=ctx.ticket,
        transport=ctx.transport,
        traceparent=ctx.traceparent,
        reply=ctx.reply,
    )


class TransportService:
    """A ``Service`` over a client ``Transport`` to another server."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    async def invoke(self, op: Operation, request: message.Message, ctx: CallContext) -> message.Message:
        return await self.transport.call(op, request, options_of(ctx))

    async def stream(
        self, op: Operation, request: message.Message, ctx: CallContext
    ) -> AsyncIterator[message.Message]:
        return await self.transport.open_stream(op, request, options_of(ctx))

    async def close(self) -> None:
        await self.transport.close()
